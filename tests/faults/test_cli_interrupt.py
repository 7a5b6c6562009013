"""Fault catalogue: Ctrl-C during `kvlab compare --json r.json` (and `kvlab needle`) on the bundled model.

Right: no traceback; the first Ctrl-C ends the run within a token and writes the partial record
(`stopped: true`); a Ctrl-C before any record exists says in one line that nothing was written (exit 130).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 300
COMPARE = ["-m", "kvlab", "compare", "--prompt", "Count from one to five hundred in words.", "--strategies",
           "dynamic,static", "--max-new-tokens", "400", "--ignore-eos", "--no-fidelity",
           "--mode", "sequential"]
NEEDLE = ["-m", "kvlab", "needle", "--strategies", "dynamic", "--lengths", "256", "--depths", "0,0.25,0.5,0.75,1",
          "--seeds", "1", "--new-tokens", "4"]


def start(tmp_path, out: Path, command: list[str] = COMPARE, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **env_extra}
    # Ctrl-C as at a terminal: a test run started in the background (`make test &`) ignores SIGINT, and a
    # child would inherit that and never see the interrupt.
    return subprocess.Popen([sys.executable, *command, "--json", str(out)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_line(proc: subprocess.Popen, text: str) -> list[str]:
    """stderr lines read until one holds `text` (fails when the process ends first)."""
    seen, deadline = [], time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            pytest.fail(f"the run ended before {text!r}: {''.join(seen)[-2000:]}")
        seen.append(line)
        if text in line:
            return seen
    pytest.fail(f"no {text!r} within {WAIT_S} s")


def test_ctrl_c_during_a_run_writes_the_partial_record(tmp_path):
    out = tmp_path / "r.json"
    proc = start(tmp_path, out)
    try:
        wait_for_line(proc, "[column 1] dynamic: running")
        time.sleep(1.0)  # a few tokens in
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "stopping after the current step" in err and "(stopped: a partial record)" in err
    record = json.loads(out.read_text())
    assert record["stopped"] is True
    assert len(record["columns"][0]["token_ids"]) < 400
    assert not (tmp_path / "r.json.partial").exists()


def test_ctrl_c_while_the_model_loads_says_nothing_was_written(tmp_path):
    """An empty model cache makes the load a ~20 s conversion, so the Ctrl-C sent at its first progress line lands
    inside the load whatever else the machine is doing (a cached load takes under 2 s)."""
    out = tmp_path / "r.json"
    proc = start(tmp_path, out, KVLAB_CACHE_DIR=str(tmp_path / "cache"))
    try:
        wait_for_line(proc, "[model]")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    # 130, or ended by the SIGINT itself once the message is out (a loader thread's interrupt): a shell shows 130
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "kvlab compare: interrupted; nothing was written"
    assert not out.exists()
    assert not list((tmp_path / "cache").glob("models/*.tmp*")), "a half-converted model was left in the cache"


def test_ctrl_c_during_a_needle_grid_keeps_the_finished_cells(tmp_path):
    out = tmp_path / "r.json"
    proc = start(tmp_path, out, NEEDLE)
    try:
        wait_for_line(proc, "[cell] dynamic")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert "kvlab needle: stopping after the current step" in err and "(stopped: the finished cells are kept)" in err
    record = json.loads(out.read_text())
    assert record["stopped"] is True and 1 <= len(record["cells"]) < 5


# Every subcommand that loads a model, interrupted while the model loads and once it is loaded (its run).
# Small inputs: each run-phase process loads the cached bundled model once (about 2 s) and stops at once.
def _inputs(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "turns.yaml").write_text("- Hello\n- Count to twenty in words.\n")
    (tmp_path / "prefix.txt").write_text("You are a terse assistant. " * 20)
    (tmp_path / "prompts.yaml").write_text("- Say one word.\n- Count to twenty in words.\n")
    (tmp_path / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 60)
    return {
        "compare": COMPARE[2:],
        "needle": NEEDLE[2:],
        "chat": ["chat", "--turns", "turns.yaml", "--max-new-tokens", "200"],
        "prefix": ["prefix", "--prefix", "prefix.txt", "--prompts", "prompts.yaml", "--max-new-tokens", "200"],
        "perplexity": ["perplexity", "--text", "text.txt", "--max-tokens", "500"],
        "inspect": ["inspect", "--prompt", "Count to fifty in words.", "--steps", "200", "--ignore-eos"],
        "diverge": ["diverge", "--strategy", "sink:window_length=16", "--prompt", "Count to fifty in words.",
                    "--steps", "200", "--ignore-eos"],
        "report": ["report", "--text", "text.txt", "--columns", "dynamic", "--scored-tokens", "200",
                   "--context-tokens", "64"],
        "bench": ["bench", "--size", "smoke", "--only", "overhead"],
    }


def _interrupt_at(tmp_path, name: str, marker: str) -> tuple[subprocess.Popen, str]:
    """Start subcommand `name`, send SIGINT once a stderr line holds `marker`; (process, all of stderr)."""
    args = _inputs(tmp_path)[name]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", *args, "--json", str(tmp_path / "r.json")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = wait_for_line(proc, marker)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
    return proc, "".join(seen) + err


# Every subcommand stops through the same StopOnInterrupt (kvlab.cli.outputs): CI interrupts compare and report
# in both phases, `make test-slow` the other seven (CI's time budget).
@pytest.mark.parametrize("name", ["compare", "report", *(pytest.param(name, marks=pytest.mark.slow) for name in
                                                         ("needle", "chat", "prefix", "perplexity", "inspect",
                                                          "diverge", "bench"))])
@pytest.mark.parametrize("marker", [pytest.param("] loading ", id="load"), pytest.param(" ready", id="run")])
def test_ctrl_c_in_every_phase_ends_in_one_line_and_130(tmp_path, name, marker):
    proc, err = _interrupt_at(tmp_path, name, marker)
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert last.startswith((f"kvlab {name}:", "wrote ")), err[-3000:]
    assert not (tmp_path / "r.json.partial").exists()


def test_ctrl_c_while_kvlab_itself_imports_ends_in_one_line_and_130():
    """The first second or two of any `kvlab` command is `import kvlab` importing transformers, before any
    command's handler exists: a Ctrl-C there was a KeyboardInterrupt traceback (fresh-reviewer finding B3)."""
    code = ("import importlib, kvlab, kvlab.caches.deferred_hqq as d\n"
            "def interrupted():\n    raise KeyboardInterrupt\n"
            "d.import_cache_utils_without_hqq = interrupted\nimportlib.reload(kvlab)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=WAIT_S,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 130 and proc.stderr == "kvlab: interrupted while starting; nothing was run\n"
