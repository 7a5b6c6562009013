"""The eviction preset on the real bundled model (SmolLM2-135M-Instruct, fp32, CPU), few tokens.

Every column runs; each evicting column holds (1 - ratio) of dense's prompt bytes plus the decoded tokens, to the
byte, with the dense prediction beside it; the sink column (window sized to the same tokens) ends at the same bytes;
a budgeted dynamic column falls back to an evicting cache and keeps its text.
"""

import pytest

from kvlab.accounting import bytes_per_token
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.compare.preset import load_preset

NEW_TOKENS = 4


@pytest.fixture(scope="module")
def preset_run(bundled):
    preset = load_preset("eviction")
    prompt = encode_prompt(bundled.tokenizer, preset.prompt.text, chat=preset.prompt.chat)
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    results = collect(run_compare(bundled, prompt, preset.columns, settings, mode="sequential")).results
    return prompt.shape[1], results


def test_every_column_of_the_eviction_preset_runs_at_the_predicted_bytes(bundled, preset_run):
    prompt_tokens, results = preset_run
    per_token = bytes_per_token(bundled.config, bundled.model.dtype)
    assert all(r.status == "ok" for r in results), {r.name: r.message for r in results}
    dense = results[0]
    kept = int(prompt_tokens * 0.5)
    for result in results[1:-1]:
        for step, measured in enumerate(result.cache_bytes):
            assert measured == (kept + step) * per_token, result.name
        assert result.predicted_cache_bytes == dense.cache_bytes
        assert len(result.token_ids) == NEW_TOKENS
    sink = results[-1]
    assert sink.name.startswith("sink")
    assert sink.cache_bytes[-1] == min(prompt_tokens + NEW_TOKENS - 1, 90) * per_token


def test_a_budgeted_column_falls_back_to_an_evicting_cache(bundled):
    prompt = encode_prompt(bundled.tokenizer, load_preset("eviction").prompt.text, chat=False)
    per_token = bytes_per_token(bundled.config, bundled.model.dtype)
    budget_mib = (prompt.shape[1] + 1) * per_token / (1 << 20)
    column = {"strategy": "dynamic", "budget_mib": budget_mib,
              "fallback": [{"strategy": "snapkv", "compression_ratio": 0.5}]}
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)
    result = collect(run_compare(bundled, prompt, [column], settings, mode="sequential")).results[0]
    assert result.status == "ok", result.message
    assert [f["to"] for f in result.fallbacks] and "snapkv" in str(result.fallbacks[0])
    assert len(result.token_ids) == 6 and max(result.cache_bytes) <= budget_mib * (1 << 20)


def test_snapkv_half_then_quanto_int4_holds_under_0_3_of_dynamic_after_a_1000_token_prefill(bundled):
    """Eviction composed with quantization on the real model: 30 layers x 3 KV heads x 64 dims, float32; each layer
    keeps 500 positions, stored in quanto's int4 layout (2 values per byte, a float32 scale and shift per 64)."""
    import torch

    from kvlab.accounting import cache_bytes
    from kvlab.quality.defaults import shipped_text
    from kvlab.strategies import make_strategy

    ids = bundled.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :1000]
    strategy = make_strategy({"strategy": "snapkv", "compression_ratio": 0.5, "quantize": "quanto4"})
    cache = strategy.build_cache(bundled, 1001)
    with torch.inference_mode():
        strategy.forward(bundled, cache, ids, 1000)
    values = 3 * 500 * 64
    expected = 30 * 2 * (values // 2 + 8 * values // 64)
    dense = 1000 * bytes_per_token(bundled.config, bundled.model.dtype)
    assert cache_bytes(cache) == expected == 3_600_000 and expected <= 0.3 * dense  # 0.078 of 46,080,000 B
