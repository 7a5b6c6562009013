"""Every flag value in the serving map is one its engine accepts: each `ServingSetting` of every registered
strategy, at its default knobs and at the knob values that change the answer, is held to the copies of the
engines' own lists of choices in `kvlab.engines.choices`; a value outside them fails naming the row."""

import pytest

from kvlab.caches.quant.vllm import KV_CACHE_DTYPES
from kvlab.engines import ServingSetting
from kvlab.engines.choices import CHOICES, LLAMA_KV_CACHE_TYPES, flag_values, problems
from kvlab.strategies import STRATEGIES, make_strategy
from kvlab.strategies.serving import serving_settings

pytestmark = pytest.mark.unit

KNOB_ROWS = [
    *({"strategy": "quantized", "backend": "quanto", "nbits": n} for n in (2, 4)),
    *({"strategy": "quantized", "backend": "hqq", "nbits": n} for n in (1, 2, 3, 4, 8)),
    {"strategy": "quantized", "backend": "fp8", "nbits": 8},
    *({"strategy": "rotation_quantized", "key_bits": k, "value_bits": v} for k in (1, 2, 3, 4) for v in (1, 2, 3, 4)),
    *({"strategy": "vllm_kv_cache", "kv_cache_dtype": dtype} for dtype in KV_CACHE_DTYPES),
    *({"strategy": "llamacpp_quantized", "type_k": kind, "type_v": kind} for kind in LLAMA_KV_CACHE_TYPES),
    {"strategy": "llamacpp_quantized", "type_k": "q8_0", "type_v": "q4_0", "attn_rot": False},
    {"strategy": "snapkv", "quantize": "quanto4"},
    {"strategy": "snapkv", "quantize": "rotation_k4v2"},
    {"strategy": "sink", "window_length": 64, "num_sink_tokens": 4},
]


def rows():
    """(row name, knobs) for every registered strategy at its defaults, then the knob rows above."""
    yield from ((name, {}) for name in STRATEGIES)
    for spec in KNOB_ROWS:
        knobs = {k: v for k, v in spec.items() if k != "strategy"}
        yield f"{spec['strategy']}:{knobs}", spec


@pytest.mark.parametrize("row, spec", list(rows()))
def test_every_flag_value_is_in_its_engines_list(row, spec):
    name = spec.get("strategy", row)
    settings = serving_settings(name, {k: v for k, v in spec.items() if k != "strategy"})
    found = [f"{row}: {line}" for s in settings for line in problems(s)]
    assert not found, "\n".join(found)


def test_a_value_outside_the_list_fails_naming_flag_value_and_source():
    stale = ServingSetting("vLLM", "--kv-cache-dtype int2_per_token_head", "0.34.0", "https://x")
    (line,) = problems(stale)
    assert "--kv-cache-dtype 'int2_per_token_head'" in line and "vllm/config/cache.py" in line
    assert problems(ServingSetting("vLLM", "--swap-space GiB", "0.34.0", "https://x")) == [
        "vLLM flag '--swap-space' is not in kvlab.engines.choices"]
    assert problems(ServingSetting("llama.cpp", "llama-server -ctk q3_k -ctv q4_0 -fa on", "x", "https://x"))
    assert problems(ServingSetting("TensorRT-LLM", 'KvCacheConfig(dtype="int8")', "x", "https://x"))
    assert problems(ServingSetting("SGLang", None, note="none")) == []


def test_flag_values_reads_flags_switches_aliases_and_config_fields():
    assert flag_values("llama.cpp", "LLAMA_ATTN_ROT_DISABLE=1 llama-server --cache-type-k q8_0 -ctv q4_0 -fa on") == [
        ("-ctk", "q8_0"), ("-ctv", "q4_0"), ("-fa", "on")]
    assert flag_values("TensorRT-LLM", 'KvCacheConfig(sink_token_length=4, max_attention_window=[64])') == [
        ("KvCacheConfig.sink_token_length", "4"), ("KvCacheConfig.max_attention_window", "[64]")]
    assert flag_values("vLLM", "--kv-cache-dtype auto (the default)") == [("--kv-cache-dtype", "auto")]
    assert flag_values("SGLang", "--enable-hierarchical-cache --hicache-ratio R") == [
        ("--enable-hierarchical-cache", None), ("--hicache-ratio", None)]


def test_each_copied_list_names_its_file_and_version():
    for choices in CHOICES:
        assert choices.version and choices.source.startswith("https://"), choices
    assert "v0.34.0" in next(c.source for c in CHOICES if c.flag == "--kv-cache-dtype" and c.engine == "vLLM")
    assert "v0.5.23" in next(c.source for c in CHOICES if c.flag == "--kv-cache-dtype" and c.engine == "SGLang")


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_row_names_the_version_it_was_checked_in(name):
    for s in make_strategy({"strategy": name}).serving_settings():
        text = s.line()
        assert s.version in text if s.setting else ("checked in" in s.note or name == "no_cache"), (name, text)
