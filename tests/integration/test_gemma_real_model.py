"""The bundled Gemma 3 270M, a hybrid model (15 sliding-window layers, window 512, and 3 full-attention layers),
end to end: exact caches agree with no cache, sliding layers stop at their window to the byte of the prediction,
quanto quantizes the full-attention layers (the sliding ones keep their window), sink is refused with the reason,
the hybrid preset runs from the command line, the planner reads it, and a local .gguf file loads through the same
convert-once cache."""

import json
import subprocess
import sys

import pytest
import torch

from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings
from kvlab.compare.preset import load_preset

pytestmark = pytest.mark.gemma

PROMPT_TOKENS = 500
NEW_TOKENS = 16
NO_CACHE_TOKENS = 4
"""no_cache re-reads the whole 500-token sequence every step, so it checks the first tokens only."""
WINDOW = 512
SLIDING_LAYERS, FULL_LAYERS = 15, 3
PER_LAYER_TOKEN = 2 * 1 * 256 * 4
"""K+V bytes one token adds to one layer: 1 KV head x head_dim 256, float32."""
COLUMNS = [{"strategy": "no_cache", "generation": {"max_new_tokens": NO_CACHE_TOKENS}}, {"strategy": "dynamic"}, {"strategy": "dynamic", "layer_types": "full"},
           {"strategy": "sliding_window"}, {"strategy": "static"}, {"strategy": "quantized"}, {"strategy": "sink"}]


@pytest.fixture(scope="module")
def run(gemma):
    """One greedy fp32 run of every column: a 500-token prompt, 16 new tokens, so the window fills mid-run."""
    text = " ".join([load_preset("hybrid_sliding").prompt.text] * 4)
    prompt = gemma.tokenizer(text, return_tensors="pt")["input_ids"][:, :PROMPT_TOKENS]
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    results = collect(run_compare(gemma, prompt, COLUMNS, settings, mode="sequential")).results
    return {result.name: result for result in results}


def test_the_model_is_hybrid_with_a_512_token_window(gemma):
    info = gemma.info()
    assert info["layer_types"] == ["full_attention", "sliding_attention"] and info["sliding_window"] == WINDOW
    assert info["chat_template"] is False and "Gemma Terms of Use" in info["license"]


def test_exact_caches_give_the_no_cache_tokens(run):
    cached = {name: run[name].token_ids for name in ("dynamic", "dynamic all-full", "sliding_window", "static")}
    assert all(run[name].status == "ok" for name in [*cached, "no_cache"]), {name: r.message for name, r in run.items()}
    assert len(set(map(tuple, cached.values()))) == 1 and len(cached["dynamic"]) == NEW_TOKENS
    assert run["no_cache"].token_ids == cached["dynamic"][:NO_CACHE_TOKENS]


def test_sliding_layers_stop_at_their_window_to_the_byte_of_the_prediction(run):
    for name in ("dynamic", "sliding_window"):
        measured, predicted = run[name].cache_bytes_by_layer_type, run[name].predicted_cache_bytes_by_layer_type
        for step in range(NEW_TOKENS):
            held = PROMPT_TOKENS + step
            assert predicted["sliding_attention"][step] == SLIDING_LAYERS * PER_LAYER_TOKEN * min(held, WINDOW - 1)
            assert measured["sliding_attention"][step] == predicted["sliding_attention"][step] + SLIDING_LAYERS * 8
            assert measured["full_attention"][step] == predicted["full_attention"][step] == (
                FULL_LAYERS * PER_LAYER_TOKEN * held)
        flat = measured["sliding_attention"][WINDOW - 1 - PROMPT_TOKENS:]
        assert len(flat) > 1 and len(set(flat)) == 1
    assert run["dynamic"].cache_bytes == run["sliding_window"].cache_bytes


def test_columns_say_which_keep_everything(run):
    assert run["dynamic all-full"].keeps_everything
    assert run["dynamic all-full"].cache_bytes[-1] == 18 * PER_LAYER_TOKEN * (PROMPT_TOKENS + NEW_TOKENS - 1)
    for name in ("dynamic", "sliding_window", "static"):
        assert not run[name].keeps_everything and "15 sliding layers keep their last" in run[name].keeps
    static = run["static"]
    capacity = PROMPT_TOKENS + NEW_TOKENS
    assert static.cache_bytes_by_layer_type["sliding_attention"][-1] == SLIDING_LAYERS * (PER_LAYER_TOKEN * WINDOW + 8)
    assert static.cache_bytes_by_layer_type["full_attention"][-1] == FULL_LAYERS * (PER_LAYER_TOKEN * capacity + 8)


def test_quantized_quantizes_the_full_layers_and_sink_is_refused_with_the_reason(run):
    quantized, sink = run["quantized quanto int4 r128"], run["sink 4+252"]
    assert quantized.status == "ok", quantized.message
    by_type, dynamic = quantized.cache_bytes_by_layer_type, run["dynamic"].cache_bytes_by_layer_type
    assert by_type["sliding_attention"] == dynamic["sliding_attention"]
    assert by_type["full_attention"][0] < dynamic["full_attention"][0] / 3  # the prompt, quantized at prefill
    assert sink.status == "unavailable"
    assert "sliding_attention" in sink.message and "every layer to be full attention" in sink.message


def test_the_planner_reads_the_bundled_gemma(gemma):
    from kvlab.plan.planner import PlanRequest, plan

    result = plan(PlanRequest(model="bundled:gemma-3-270m", contexts=(256, 1024), dtype="float32",
                              strategies=({"strategy": "dynamic"},)))
    cells = result.strategies[0].cells
    label = f"sliding_attention (window {WINDOW})"
    assert [cell.cache_bytes_by_layer_type[label] for cell in cells] == [
        SLIDING_LAYERS * (PER_LAYER_TOKEN * 256 + 8), SLIDING_LAYERS * (PER_LAYER_TOKEN * (WINDOW - 1) + 8)]
    assert cells[1].cache_bytes_by_layer_type["full_attention"] == FULL_LAYERS * PER_LAYER_TOKEN * 1024


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_the_hybrid_preset_runs_from_the_command_line_with_bytes_by_layer_type(gemma, tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--preset", "hybrid_sliding",
                           "--max-new-tokens", "4", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    status = {column["name"]: column["status"] for column in record["columns"]}
    assert status == {"dynamic": "ok", "dynamic all-full": "ok", "sliding_window": "ok", "static": "ok",
                      "no_cache": "ok", "quantized quanto int4 r128": "ok", "sink 4+252": "unavailable"}
    dynamic = record["columns"][0]
    assert set(dynamic["cache_bytes_by_layer_type"]) == {"full_attention", "sliding_attention"}
    assert record["model"]["name"] == "gemma-3-270m"
    assert "cache by layer type" in done.stdout


@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_a_local_gguf_file_loads_through_the_convert_once_cache(bundled, tmp_path, monkeypatch):
    """The bundled SmolLM2's own GGUF file, given as a path: converted into a folder keyed by its content hash,
    it generates the bundled model's greedy tokens."""
    from kvlab.models.bundled import MODELS
    from kvlab.models.loading import ModelSpec, load_model

    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    path = MODELS["bundled"].package_folder() / MODELS["bundled"].gguf_file
    loaded = load_model(ModelSpec(str(path), device="cpu"))
    assert loaded.name == path.stem
    converted = list((tmp_path / "models").iterdir())
    assert len(converted) == 1 and converted[0].name.startswith(path.stem + "-")
    prompt = torch.tensor([bundled.tokenizer("The sky is blue because")["input_ids"]])
    settings = GenerationSettings(max_new_tokens=8, stop_at_eos=False, fidelity=False)
    tokens = [collect(run_compare(model, prompt, [{"strategy": "dynamic"}], settings)).results[0].token_ids
              for model in (loaded, bundled)]
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("spec", [pytest.param({"strategy": "expected_attention", "compression_ratio": 0.5},
                                               marks=pytest.mark.slow),
                                  pytest.param({"strategy": "snapkv", "compression_ratio": 0.5, "compress_every": 70},
                                               marks=pytest.mark.slow)])  # both in the slow tier (CI time)
def test_eviction_prunes_the_full_layers_and_leaves_the_sliding_ones(gemma, spec):
    """As kvpress leaves them, the 15 sliding layers keep their window; the 3 full layers hold half the prompt plus
    what was fed since (with compress_every 70, back at the budget after 70 tokens)."""
    text = " ".join([load_preset("hybrid_sliding").prompt.text] * 2)
    prompt = gemma.tokenizer(text, return_tensors="pt")["input_ids"][:, :150]
    new_tokens = 80
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    columns = [{"strategy": "dynamic"}, spec]
    dense, pruned = collect(run_compare(gemma, prompt, columns, settings, mode="sequential")).results
    assert pruned.status == "ok", pruned.message
    fed = new_tokens - 1
    every = spec.get("compress_every", 0)
    held_full = 75 + (fed % every if every else fed)
    assert pruned.cache_bytes_by_layer_type["full_attention"][-1] == FULL_LAYERS * PER_LAYER_TOKEN * held_full
    sliding = pruned.cache_bytes_by_layer_type["sliding_attention"][-1]
    assert sliding == dense.cache_bytes_by_layer_type["sliding_attention"][-1]
    assert sliding // (SLIDING_LAYERS * PER_LAYER_TOKEN) == 150 + fed  # every token: the window is not full yet
