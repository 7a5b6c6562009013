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
    ({"strategy": "quantized", "backend": "fp8", "nbits": 8}, "vLLM 0.34.0: --kv-cache-dtype fp8"),
    ({"strategy": "quantized", "backend": "quanto", "nbits": 4}, "vLLM 0.34.0: --kv-cache-dtype int4_per_token_head"),
    ({"strategy": "quantized", "backend": "quanto", "nbits": 4}, "llama-server -ctk q4_0 -ctv q4_0 -fa on"),
    ({"strategy": "quantized", "backend": "hqq", "nbits": 8}, "--kv-cache-dtype int8_per_token_head"),
    ({"strategy": "rotation_quantized", "key_bits": 3, "value_bits": 4}, "--kv-cache-dtype turboquant_k3v4_nc"),
    ({"strategy": "rotation_quantized"}, "llama.cpp 0c1e570 (llama-cpp-python 0.3.36): llama-server -ctk q4_0"),
    ({"strategy": "sink", "window_length": 64, "num_sink_tokens": 4},
     "KvCacheConfig(sink_token_length=4, max_attention_window=[64])"),
    ({"strategy": "snapkv"}, "SGLang: no serving equivalent: no token eviction by a score"),
    ({"strategy": "snapkv"}, "TensorRT-LLM 1.3.0rc27: TriAttentionKvCacheCompressionConfig("),
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
    parts = [s for s in settings if "quantize=rotation_k4v2 part only" in s.note]
    assert [s.engine for s in parts] == ["vLLM", "SGLang", "TensorRT-LLM", "llama.cpp"]
    assert parts[0].setting == "--kv-cache-dtype turboquant_4bit_nc"
    assert [s.engine for s in settings if s.setting and s not in parts] == ["TensorRT-LLM"]  # TriAttention
    assert any("-ctk q4_0" in (s.setting or "") for s in serving_settings("tova", {"quantize": "quanto4"}))
