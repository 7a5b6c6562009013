"""`engine:openai` against a real llama-server on 127.0.0.1 (llama.cpp's server, built from the source
llama-cpp-python 0.3.36 vendors by scripts/build_llama_server.sh, about 15-25 minutes the first time, then
cached): the same GGUF and q4_0 cache as an `engine:llamacpp` column gives the same greedy text through the
server; the column reads TTFT/ITL and the server's `/metrics` (prefix-cache counters: a repeated prompt hits);
a server started without `--metrics` and a wrong model name are one line each while the other columns finish
(a refused connection and a timeout: tests/faults/test_engine_endpoints.py)."""

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kvlab.columns import Column
from kvlab.compare.runner import run_compare
from kvlab.engines.gguf import gguf_file
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.protocol import collect

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 3600
START_TIMEOUT_S = 120
NEW_TOKENS = 12
PROMPT = "Why is the sky blue? Answer in one sentence."
ALIAS = "smollm2"


def llama_server() -> str:
    """The cached llama-server binary (built now when missing)."""
    built = subprocess.run(["bash", str(REPO / "scripts" / "build_llama_server.sh")], capture_output=True,
                           text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-2000:]
    return built.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(binary: str, gguf: Path, *flags: str):
    port = free_port()
    process = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-a", ALIAS,
                                "-c", "1024", "-np", "1", "-t", str(os.cpu_count() or 2), "-ctk", "q4_0", "-ctv",
                                "q4_0", "-fa", "on", "--no-webui", *flags],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return process, f"{url}/v1"
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise AssertionError(f"llama-server did not come up at {url} within {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def servers():
    binary = llama_server()
    running = []
    with gguf_file("bundled") as gguf:
        try:
            running.append(start(binary, gguf, "--metrics"))
            running.append(start(binary, gguf))
            yield {"metrics": running[0][1], "bare": running[1][1]}
        finally:
            for process, _ in running:
                process.terminate()
                process.wait(30)


def test_a_llama_server_column_beside_llamacpp_in_process(bundled, servers):
    prompt = encode_prompt(bundled.tokenizer, PROMPT)
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False)
    items = ["dynamic", "engine:llamacpp:type_k=q4_0:type_v=q4_0",
             f"engine:openai:base_url={servers['metrics']}:send=ids",
             f"engine:openai:base_url={servers['metrics']}:send=ids:model={ALIAS}",
             f"engine:openai:base_url={servers['bare']}:send=ids",
             f"engine:openai:base_url={servers['metrics']}:model=gpt-9"]
    results = collect(run_compare(bundled, prompt, [Column.from_text(item) for item in items], settings,
                                  mode="sequential")).results
    dynamic, local, first, second, bare, wrong = results
    assert [r.status for r in (dynamic, local, first, second, bare)] == ["ok"] * 5, [r.message for r in results]
    assert first.engine["model"] == ALIAS and first.ttft_s > 0 and first.itl_ms_p50 is not None
    assert first.text == second.text == local.text
    assert first.engine["server"]["prefix_cache_queries"] > 0
    assert second.engine["server"]["prefix_cache_hits"] > 0  # the same prompt again: llama-server reuses its slot
    assert "server: prefix cache" in second.message
    assert bare.text == local.text and bare.message.startswith("no server metrics: ")
    assert wrong.status == "error" and wrong.message == (
        f"{servers['metrics']} does not serve model 'gpt-9'; it serves: {ALIAS}")
