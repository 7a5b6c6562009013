"""The llama.cpp engine column on the real bundled model: beside dynamic and quanto int4 in one Compare run, its
greedy tokens are a plain llama-cpp-python greedy run's, its cache bytes are what llama.cpp reports (a q4_0
token's K and V rows, 12 bytes of cell data each), the rotation knob reaches llama.cpp's cache, a model without
GGUF or a bad cache type is one line in its own column while the others finish, and the command line runs the
same columns."""

import dataclasses
import json
import subprocess
import sys

import pytest

from kvlab.columns import Column
from kvlab.compare.runner import run_compare
from kvlab.engines.gguf import gguf_file
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.models.loading import ModelSpec
from kvlab.protocol import collect

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (requirements.txt has it)")

NEW_TOKENS = 12
PROMPT = "Why is the sky blue? Answer in one sentence."
COLUMNS = ["dynamic", "quantized:backend=quanto:nbits=4:residual_length=16", "engine:llamacpp:type_k=q4_0:type_v=q4_0",
           "engine:llamacpp:type_k=q5_0"]
CELL_BYTES = 12
"""llama_state_seq_get_size's data per held cell besides K and V: its position, its count of sequences, one id."""


@pytest.fixture(scope="module")
def compared(bundled):
    prompt = encode_prompt(bundled.tokenizer, PROMPT)
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False)
    done = collect(run_compare(bundled, prompt, [Column.from_text(c) for c in COLUMNS], settings))
    return prompt[0].tolist(), done.results


def plain_greedy(prompt_ids: list[int], type_k: int, type_v: int, flash_attn: bool) -> str:
    """What a llama-cpp-python user's own greedy run on the same file and ids gives."""
    with gguf_file("bundled") as path:
        llm = llama_cpp.Llama(str(path), n_ctx=512, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
                              verbose=False)
    try:
        return llm.create_completion(prompt_ids, max_tokens=NEW_TOKENS, temperature=0.0)["choices"][0]["text"]
    finally:
        llm.close()


def test_dynamic_quanto_and_llamacpp_q4_0_run_side_by_side(compared):
    _, results = compared
    assert [r.status for r in results] == ["ok"] * len(COLUMNS), [r.message for r in results]
    llama = results[2]
    assert llama.name == "engine:llamacpp q4_0" and len(llama.token_ids) == NEW_TOKENS
    assert llama.ttft_s == llama.per_token_s[0] > 0 and llama.itl_ms_p50 is not None and llama.decode_tok_s
    assert llama.engine["type_k"] == llama.engine["type_v"] == "q4_0" and llama.engine["gguf"].endswith(".gguf")
    assert "llama.cpp Hadamard-rotates K and V before quantizing (head size 64)" in llama.message
    assert results[0].is_baseline and llama.top1_agreement is not None and llama.mean_kl > 0


def test_llamacpp_greedy_tokens_are_a_plain_llama_cpp_python_run(compared):
    prompt_ids, results = compared
    assert results[2].text == plain_greedy(prompt_ids, llama_cpp.GGML_TYPE_Q4_0, llama_cpp.GGML_TYPE_Q4_0, True)
    assert results[3].text == plain_greedy(prompt_ids, llama_cpp.GGML_TYPE_Q5_0, llama_cpp.GGML_TYPE_F16, True)


def test_llamacpp_cache_bytes_are_llamas_own_count(compared, bundled):
    _, results = compared
    config = bundled.config
    layers, width = config.num_hidden_layers, config.num_key_value_heads * 64  # 30 layers, 3 heads of 64
    q4_0 = 18 * width // 32  # a q4_0 block: 32 values in 16 bytes and a float16 scale
    q5_0 = 22 * width // 32
    grown = {2: layers * 2 * q4_0 + CELL_BYTES, 3: layers * (q5_0 + 2 * width) + CELL_BYTES}
    for index, per_token in grown.items():
        series = results[index].cache_bytes
        assert len(series) == NEW_TOKENS
        assert {b - a for a, b in zip(series, series[1:])} == {per_token}
    assert results[2].peak_cache_bytes < results[1].peak_cache_bytes < results[0].peak_cache_bytes


def test_no_gguf_and_a_bad_type_are_one_line_each_while_the_others_finish(bundled):
    hub = dataclasses.replace(bundled, spec=ModelSpec("HuggingFaceTB/SmolLM2-135M-Instruct", device="cpu"))
    prompt = encode_prompt(bundled.tokenizer, PROMPT)
    columns = [Column.from_text(c) for c in ("dynamic", "engine:llamacpp", "engine:llamacpp:type_k=q3_k")]
    results = collect(run_compare(hub, prompt, columns, GenerationSettings(max_new_tokens=2, fidelity=False))).results
    assert results[0].status == "ok"
    assert (results[1].status, results[1].message) == ("unavailable", (
        "needs the model as a GGUF file, and 'HuggingFaceTB/SmolLM2-135M-Instruct' has none: load a bundled model "
        "or a local .gguf file (llama.cpp runs GGUF weights only)"))
    assert results[2].status == "error" and results[2].message.startswith("type_k must be one of f32, f16, bf16")


def test_the_command_line_runs_engine_columns_beside_the_lab(tmp_path):
    out = tmp_path / "run.json"
    items = ",".join(["dynamic", "quantized:backend=quanto:nbits=4", "engine:llamacpp:type_k=q4_0:type_v=q4_0",
                      "engine:llamacpp:type_k=q3_k"])
    proc = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--prompt", PROMPT, "--strategies", items,
                           "--max-new-tokens", "4", "--no-fidelity", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    columns = json.loads(out.read_text())["columns"]
    assert [c["status"] for c in columns] == ["ok", "ok", "ok", "error"]
    assert columns[2]["name"] == "engine:llamacpp q4_0" and columns[2]["engine"]["type_k"] == "q4_0"
    assert len(columns[2]["token_ids"]) == 4 and columns[2]["peak_cache_bytes"] > 0
    assert columns[3]["message"].startswith("type_k must be one of f32, f16, bf16")
    assert "engine:llamacpp q4_0" in proc.stdout and "Traceback" not in proc.stderr


def test_the_rotation_knob_reaches_llamacpps_cache(compared):
    from kvlab.engines.llamacpp import score_continuation

    prompt_ids, results = compared
    continuation = results[0].token_ids[:8]

    def scored(kind: str, rotation: bool):
        knobs = dict(type_k=kind, type_v=kind, flash_attn=True, rotation=rotation)
        return score_continuation("bundled", prompt_ids, continuation, knobs, threads=2)

    assert not scored("q4_0", True).equal(scored("q4_0", False))  # LLAMA_ATTN_ROT_DISABLE=1 was read
    assert scored("f16", True).equal(scored("f16", False))  # llama.cpp rotates quantized caches only


@pytest.mark.gemma
def test_gemmas_own_gguf_runs_in_llamacpp_with_its_head_size_rotated(gemma):
    prompt = encode_prompt(gemma.tokenizer, "The capital of France is", chat=False)
    columns = [Column.from_text(c) for c in ("dynamic", "engine:llamacpp:type_k=q4_0:type_v=q4_0")]
    settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False, fidelity=False)
    dynamic, llama = collect(run_compare(gemma, prompt, columns, settings)).results
    assert dynamic.status == llama.status == "ok" and len(llama.token_ids) == 4
    assert "llama.cpp Hadamard-rotates K and V before quantizing (head size 256)" in llama.message
    config = gemma.config.get_text_config(decoder=True)
    width = config.num_key_value_heads * config.head_dim
    # every layer's K and V in q4_0 blocks of 18 bytes per 32 values, and 12 bytes per cell in each of llama.cpp's
    # two caches (the full-attention layers' and the sliding ones'), while the run is inside the window
    per_token = config.num_hidden_layers * 2 * (18 * width // 32) + 2 * CELL_BYTES
    assert {b - a for a, b in zip(llama.cache_bytes, llama.cache_bytes[1:])} == {per_token}
