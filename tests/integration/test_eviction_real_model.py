"""The eviction preset on the real bundled model (SmolLM2-135M-Instruct, fp32, CPU), few tokens.

Every column runs; each evicting column holds (1 - ratio) of dense's prompt bytes plus the decoded tokens, to the
byte, with the dense prediction beside it; the sink column (window sized to the same tokens) ends at the same bytes;
a budgeted dynamic column falls back to an evicting cache and keeps its text.
"""

import pytest

from kvlab.accounting import bytes_per_token
from kvlab.compare.runner import collect, run_compare
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.presets import load_preset

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
