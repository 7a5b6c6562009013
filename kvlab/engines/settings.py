"""One engine's nearest setting to a kvlab strategy, the engines, and where each setting was checked.

The sources and versions are shared by the strategy classes and the quantization backends that name them;
`no_equivalent(reason)` is the answer for a strategy no engine offers. Each version below is the release whose own
files the settings were read from (the engines' choice lists are copied, with their files, in
`kvlab.engines.choices`, and a unit test holds every flag value to them). This module holds data; which setting
a strategy maps to is said beside the strategy (`Strategy.serving_settings`) or its backend
(`kvlab.caches.quant.QuantBackend.serving`), with the shared per-bits choices in `kvlab.engines.kv_types`.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vLLM", "SGLang", "TensorRT-LLM", "llama.cpp")

VLLM_VERSION = "0.34.0"
"""Read from the files of the vllm 0.34.0 wheel on PyPI (the tag v0.34.0 below)."""
VLLM_CACHE = "https://github.com/vllm-project/vllm/blob/v0.34.0/vllm/config/cache.py"
VLLM_ARGS = "https://github.com/vllm-project/vllm/blob/v0.34.0/vllm/engine/arg_utils.py"
VLLM_TQ_SOURCE = ("https://github.com/vllm-project/vllm/blob/1471680b24719d9d3b2fe1235878196142af89cc/"
                  "vllm/model_executor/layers/quantization/turboquant/config.py")
VLLM_INT4_SOURCE = ("https://github.com/vllm-project/vllm/blob/a7f284a2e24b86c171ef714c5ff492acf0baee6d/"
                    "vllm/v1/attention/ops/int4_per_token_head.py")

SGLANG_VERSION = "0.5.23"
"""Read from the files of the sglang 0.5.23 wheel on PyPI (the tag v0.5.23 below)."""
SGLANG_TREE = "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/arg_groups/fields/"
SGLANG_MODEL_ARGS = SGLANG_TREE + "model.py"
SGLANG_MEMORY_ARGS = SGLANG_TREE + "memory.py"
SGLANG_SCHEDULE_ARGS = SGLANG_TREE + "schedule.py"

TRT_VERSION = "1.4.0rc4"
"""TensorRT-LLM 1.4 is not on PyPI (its index is NVIDIA's, unreachable here): the newest 1.4 whose documentation
could be read is 1.4.0rc4; a 1.4 final release was not verified."""
TRT_DOCS = "https://nvidia.github.io/TensorRT-LLM/1.4.0rc4/"
TRT_QUANT = TRT_DOCS + "features/quantization.html"
TRT_KV_CONFIG = TRT_DOCS + "llm-api/reference/KvCacheConfig.html"
TRT_TRIATTENTION_VERSION = "1.3.0rc27"
TRT_TRIATTENTION = ("https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/"
                    "TriAttentionKvCacheCompressionConfig.html")

LLAMA_COMMIT = "0c1e570"
LLAMA_VERSION = f"{LLAMA_COMMIT} (llama-cpp-python 0.3.36)"
"""The llama.cpp that llama-cpp-python 0.3.36 vendors: its `common/arg.cpp` and `src/llama-kv-cache.cpp`."""
LLAMA_ARGS = f"https://github.com/ggml-org/llama.cpp/blob/{LLAMA_COMMIT}/common/arg.cpp"
LLAMA_KV_CACHE = f"https://github.com/ggml-org/llama.cpp/blob/{LLAMA_COMMIT}/src/llama-kv-cache.cpp"
LLAMA_SERVER = LLAMA_ARGS

MEASURED_LLAMACPP = ("kvlab's q4_0 layers 0.0427 against llama.cpp's own 0.0527 mean KL on the same 300 tokens "
                     "(docs/strategies.md#llamacpp_quantized-llamacpps-kv-cache-types)")
MEASURED_VLLM = ("kvlab's PPL ratio per preset on both bundled models beside vLLM's own figure, in the table "
                 "below and docs/strategies.md#vllm_kv_cache-vllms---kv-cache-dtype-one-to-one")

LLAMA_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
"""llama.cpp's KV-cache types, the one list (`-ctk`/`-ctv`: common/arg.cpp's kv_cache_types at the commit
llama-cpp-python 0.3.36 vendors, in its order): `engine:llamacpp` takes them as `type_k`/`type_v`, and kvlab's
`llamacpp_quantized` stores them (`kvlab.caches.ggml_blocks` holds the block types' layouts)."""
LLAMA_FLOAT_TYPES = LLAMA_KV_TYPES[:3]
"""The types llama.cpp stores as plain floats (no blocks, no rotation)."""
LLAMA_QUANTIZED_TYPES = LLAMA_KV_TYPES[3:]
"""The block types: 32 values per block with a float16 scale (and a float16 minimum for the _1 types)."""


@dataclass(frozen=True)
class ServingSetting:
    """One engine's nearest setting: `setting` is the flag or config (None: no serving equivalent, `note` says
    why), `version` the release it was checked in, `source` where that is written, `note` how it differs,
    `measured` where kvlab measured this setting (or its format) itself, as a docs link with the figure."""

    engine: str
    setting: str | None
    version: str = ""
    source: str = ""
    note: str = ""
    measured: str = ""

    def line(self) -> str:
        """One comment-ready line: `vLLM 0.34.0: --kv-cache-dtype fp8 (note) <source>`."""
        if self.setting is None:
            return f"{self.engine}: no serving equivalent: {self.note}"
        note = f" ({self.note})" if self.note else ""
        measured = f"; measured: {self.measured}" if self.measured else ""
        return f"{self.engine} {self.version}: {self.setting}{note} <{self.source}>{measured}"


def no_equivalent(reason: str) -> list[ServingSetting]:
    """Every engine: no serving equivalent, for `reason`."""
    return [ServingSetting(engine, None, note=reason) for engine in ENGINES]
