"""Copies of the serving engines' own lists of choices for the flags the serving map uses, each with the file and
version it was copied from, and the check that holds a `ServingSetting` to them.

`flag_values(engine, setting)` finds the flags and config fields a setting string names and the values it gives
them; `problems(setting)` lists what an engine's copy does not accept (an unknown flag, a value outside its
choices). tests/unit/test_engine_choices.py runs it over every row of the serving map. Nothing here runs an
engine or reads one at run time: when an engine is re-checked, these lists are re-copied from its files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .settings import (LLAMA_ARGS, LLAMA_KV_TYPES, LLAMA_VERSION, SGLANG_MEMORY_ARGS, SGLANG_MODEL_ARGS, SGLANG_SCHEDULE_ARGS,
                       SGLANG_VERSION, TRT_KV_CONFIG, TRT_QUANT, TRT_TRIATTENTION, TRT_TRIATTENTION_VERSION,
                       TRT_VERSION, VLLM_ARGS, VLLM_CACHE, VLLM_VERSION, ServingSetting)


@dataclass(frozen=True)
class Choices:
    """One engine flag's accepted values (`values`, empty: any value) as `source` at `version` lists them."""

    engine: str
    flag: str
    version: str
    source: str
    values: tuple[str, ...] = ()


VLLM_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6")
"""`CacheDType` in vllm/config/cache.py of vllm 0.34.0 (`--kv-cache-dtype` takes these)."""

SGLANG_KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
"""`kv_cache_dtype` choices in python/sglang/srt/arg_groups/fields/model.py of sglang 0.5.23."""

TRT_KV_CACHE_DTYPES = ("auto", "fp8", "nvfp4")
"""`KvCacheConfig(dtype=...)` values TensorRT-LLM 1.4.0rc4's quantization page documents (its `dtype` field is a
plain str there); an unreleased `turboquant4` seen in its main branch's tests is left out until a release has it."""

TRT_EVICTION_MODES = ("union", "per_head", "per_layer_perhead")
"""`TriAttentionKvCacheCompressionConfig.eviction_mode`'s Literal in TensorRT-LLM 1.3.0rc27."""

LLAMA_KV_CACHE_TYPES = LLAMA_KV_TYPES
"""`kv_cache_types` in common/arg.cpp of the llama.cpp llama-cpp-python 0.3.36 vendors (`-ctk`, `-ctv`): the one
list, `kvlab.engines.settings.LLAMA_KV_TYPES`."""

CHOICES = (
    Choices("vLLM", "--kv-cache-dtype", VLLM_VERSION, VLLM_CACHE, VLLM_KV_CACHE_DTYPES),
    *(Choices("vLLM", flag, VLLM_VERSION, VLLM_ARGS) for flag in (
        "--kv-cache-dtype-skip-layers", "--gpu-memory-utilization", "--max-model-len", "--kv-offloading-size",
        "--disable-sliding-window")),
    Choices("SGLang", "--kv-cache-dtype", SGLANG_VERSION, SGLANG_MODEL_ARGS, SGLANG_KV_CACHE_DTYPES),
    Choices("SGLang", "--mem-fraction-static", SGLANG_VERSION, SGLANG_SCHEDULE_ARGS),
    Choices("SGLang", "--swa-full-tokens-ratio", SGLANG_VERSION, SGLANG_SCHEDULE_ARGS),
    Choices("SGLang", "--enable-hierarchical-cache", SGLANG_VERSION, SGLANG_MEMORY_ARGS),
    Choices("SGLang", "--hicache-ratio", SGLANG_VERSION, SGLANG_MEMORY_ARGS),
    Choices("TensorRT-LLM", "KvCacheConfig.dtype", TRT_VERSION, TRT_QUANT, TRT_KV_CACHE_DTYPES),
    *(Choices("TensorRT-LLM", f"KvCacheConfig.{field}", TRT_VERSION, TRT_KV_CONFIG) for field in (
        "free_gpu_memory_fraction", "host_cache_size", "max_attention_window", "sink_token_length",
        "use_kv_cache_manager_v2")),
    Choices("TensorRT-LLM", "TriAttentionKvCacheCompressionConfig.eviction_mode", TRT_TRIATTENTION_VERSION,
            TRT_TRIATTENTION, TRT_EVICTION_MODES),
    *(Choices("TensorRT-LLM", f"TriAttentionKvCacheCompressionConfig.{field}", TRT_TRIATTENTION_VERSION,
              TRT_TRIATTENTION) for field in ("budget", "beta", "normalize_scores", "calibration_path")),
    *(Choices("llama.cpp", flag, LLAMA_VERSION, LLAMA_ARGS, LLAMA_KV_CACHE_TYPES) for flag in ("-ctk", "-ctv")),
    Choices("llama.cpp", "-fa", LLAMA_VERSION, LLAMA_ARGS, ("on", "off", "auto")),
    *(Choices("llama.cpp", flag, LLAMA_VERSION, LLAMA_ARGS) for flag in (
        "--ctx-size", "--context-shift", "--keep", "--no-kv-offload", "--swa-full")),
)
BY_FLAG = {(c.engine, c.flag): c for c in CHOICES}
ALIASES = {"--cache-type-k": "-ctk", "--cache-type-v": "-ctv", "--flash-attn": "-fa", "-nkvo": "--no-kv-offload",
           "-c": "--ctx-size"}
"""llama.cpp's long and short spellings of one option (common/arg.cpp lists both)."""

_FLAG = re.compile(r"(?<![\w-])(--?[a-z][\w-]*)(?: +([^\s-][^\s]*))?")
_CONFIG = re.compile(r"\b(KvCacheConfig|TriAttentionKvCacheCompressionConfig)\(([^)]*)\)")
_FIELD = re.compile(r"(\w+)=(\"[^\"]*\"|\[[^\]]*\]|[^,\s)]+)")


def flag_values(engine: str, setting: str) -> list[tuple[str, str | None]]:
    """The (flag, value) pairs `setting` gives `engine`: command-line flags (`--kv-cache-dtype fp8`; value None
    for a switch or a placeholder such as `GiB`, `N`, `<...>`) and config fields
    (`KvCacheConfig(dtype="fp8")` gives `("KvCacheConfig.dtype", "fp8")`)."""
    pairs: list[tuple[str, str | None]] = []
    for config, body in _CONFIG.findall(setting):
        pairs += [(f"{config}.{name}", value.strip('"')) for name, value in _FIELD.findall(body)]
    for flag, value in _FLAG.findall(_CONFIG.sub("", setting)):
        placeholder = not value or value.isupper() or value.startswith(("<", "[", "("))
        pairs.append((ALIASES.get(flag, flag), None if placeholder else value))
    return pairs


def problems(setting: ServingSetting) -> list[str]:
    """What `setting` names that its engine's copied lists do not accept: an unknown flag or field, or a value
    outside the flag's choices, each as one line naming the flag, the value and the source. Empty when all is
    known, and for a setting of None (no serving equivalent)."""
    if setting.setting is None:
        return []
    found = []
    for flag, value in flag_values(setting.engine, setting.setting):
        known = BY_FLAG.get((setting.engine, flag))
        if known is None:
            found.append(f"{setting.engine} flag {flag!r} is not in kvlab.engines.choices")
        elif known.values and value not in known.values:
            found.append(f"{setting.engine} {flag} {value!r} is not among {known.version}'s choices "
                         f"({', '.join(known.values)}; {known.source})")
    return found
