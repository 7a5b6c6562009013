"""Every registered strategy class has its own nearest serving-engine settings (or the reason there is none) for
vLLM, SGLang, TensorRT-LLM and llama.cpp, the "view code" shows them, and docs/serving.md is their table."""

from pathlib import Path

import pytest

from kvlab.generation import GenerationSettings
from kvlab.strategies import STRATEGIES, Strategy, make_strategy
from kvlab.strategies.serving import ENGINES, serving_settings, serving_table
from kvlab.ui.shared.code import code_snippet

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def answering_class(cls: type) -> type:
    """The class in `cls`'s MRO whose `serving_settings` `cls` uses."""
    return next(base for base in cls.__mro__ if "serving_settings" in vars(base))


def test_every_registered_strategy_has_an_entry():
    """Beside its own method: a class's answer is its own or an unregistered base's (the eviction base), never the
    contract's default nor another registered strategy's (offloaded_static is a Static, and says its own)."""
    registered = set(STRATEGIES.values())
    missing = sorted(name for name, cls in STRATEGIES.items()
                     if answering_class(cls) is Strategy or answering_class(cls) in registered - {cls})
    assert not missing, (f"strategies without a serving-engine entry of their own: {missing}; give each class a "
                         "serving_settings() method (an engine setting or the reason there is none) and a row "
                         "to docs/serving.md")


def test_a_registered_subclass_without_its_own_entry_is_caught():
    from kvlab.strategies.dynamic import Dynamic

    class Renamed(Dynamic):
        name = "renamed_dynamic"

    assert answering_class(Renamed) is Dynamic and Dynamic in set(STRATEGIES.values())
    with pytest.raises(KeyError, match="'bare' has no serving-engine entry"):
        type("Bare", (Strategy,), {"name": "bare"})().serving_settings()


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


def test_the_doc_table_is_the_classes_output():
    assert serving_table() in DOC.read_text()


def test_eviction_composed_with_quantization_maps_its_quantized_part():
    settings = serving_settings("snapkv", {"quantize": "rotation_k4v2"})
    assert [s.setting for s in settings if s.setting] == ["--kv-cache-dtype turboquant_4bit_nc"]
    assert "quantize=rotation_k4v2 part only" in settings[-1].note
    assert any("--cache-type-k q4_0" in (s.setting or "") for s in serving_settings("tova", {"quantize": "quanto4"}))
