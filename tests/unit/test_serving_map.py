"""Every registered strategy has its nearest serving-engine settings (or the reason there is none) for vLLM,
SGLang, TensorRT-LLM and llama.cpp, the "view code" shows them, and docs/serving.md lists them."""

from pathlib import Path

import pytest

from kvlab.generation import GenerationSettings
from kvlab.strategies import STRATEGIES, make_strategy
from kvlab.strategies.serving import ENGINES, SERVING, serving_settings
from kvlab.ui.shared.code import code_snippet

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def test_every_registered_strategy_has_an_entry():
    missing = sorted(set(STRATEGIES) - set(SERVING))
    assert not missing, (f"strategies without a serving-engine entry: {missing}; add each to SERVING in "
                         "kvlab/strategies/serving.py (an engine setting or the reason there is none) and a row "
                         "to docs/serving.md")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_engine_gets_a_setting_or_a_reason(name):
    settings = serving_settings(name, make_strategy({"strategy": name}).knobs())
    assert {s.engine for s in settings} == set(ENGINES)
    for s in settings:
        assert s.note if s.setting is None else (s.version and s.source.startswith("https://")), s


def test_unknown_strategy_names_itself():
    with pytest.raises(KeyError, match="'brand_new' has no serving-engine entry"):
        serving_settings("brand_new")


@pytest.mark.parametrize("spec, expected", [
    ({"strategy": "quantized", "backend": "fp8", "nbits": 8}, "vLLM 0.4.2: --kv-cache-dtype fp8"),
    ({"strategy": "quantized", "backend": "quanto", "nbits": 4}, "--cache-type-k q4_0 --cache-type-v q4_0 -fa on"),
    ({"strategy": "rotation_quantized", "key_bits": 3, "value_bits": 4}, "--kv-cache-dtype turboquant_k3v4_nc"),
    ({"strategy": "sink", "window_length": 64, "num_sink_tokens": 4},
     "--sink_token_length 4 --max_attention_window_size 64"),
    ({"strategy": "snapkv"}, "SGLang: no serving equivalent: score-based token eviction"),
])
def test_view_code_shows_the_nearest_setting(spec, expected):
    code = code_snippet(make_strategy(spec), GenerationSettings(max_new_tokens=4), "Hi")
    assert "# ── the nearest setting in a serving engine" in code and expected in code
    compile(code, "<snippet>", "exec")  # still runnable code: the settings are comments


def test_the_doc_table_lists_every_default_setting():
    text = DOC.read_text()
    for name in STRATEGIES:
        assert f"`{name}`" in text, name
        for s in serving_settings(name, make_strategy({"strategy": name}).knobs()):
            if s.setting:
                assert s.setting in text and s.source in text, (name, s.engine)


def test_eviction_composed_with_quantization_maps_its_quantized_part():
    settings = serving_settings("snapkv", {"quantize": "rotation_k4v2"})
    assert [s.setting for s in settings if s.setting] == ["--kv-cache-dtype turboquant_4bit_nc"]
    assert "quantize=rotation_k4v2 part only" in settings[-1].note
    assert any("--cache-type-k q4_0" in (s.setting or "") for s in serving_settings("tova", {"quantize": "quanto4"}))
