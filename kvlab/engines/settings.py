"""One engine's nearest setting to a kvlab strategy, the engines, and where each setting was checked.

The sources and versions are shared by the strategy classes and the quantization backends that name them;
`no_equivalent(reason)` is the answer for a strategy no engine offers. This module holds data; which setting a
strategy maps to is said beside the strategy (`Strategy.serving_settings`) or its backend
(`kvlab.caches.quant.QuantBackend.serving`).
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vLLM", "SGLang", "TensorRT-LLM", "llama.cpp")

VLLM_ARGS = "https://docs.vllm.ai/en/v0.5.3/models/engine_args.html"
VLLM_ARGS_042 = "https://docs.vllm.ai/en/v0.4.2/models/engine_args.html"
VLLM_KV = "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/"
VLLM_TURBOQUANT = "https://github.com/vllm-project/vllm/pull/38479"
VLLM_TQ_SOURCE = ("https://github.com/vllm-project/vllm/blob/1471680b24719d9d3b2fe1235878196142af89cc/"
                  "vllm/model_executor/layers/quantization/turboquant/config.py")
VLLM_INT4_SOURCE = ("https://github.com/vllm-project/vllm/blob/a7f284a2e24b86c171ef714c5ff492acf0baee6d/"
                    "vllm/v1/attention/ops/int4_per_token_head.py")
SGLANG_ARGS = "https://docs.sglang.io/docs/advanced_features/server_arguments"
SGLANG_KV = "https://docs.sglang.io/docs/advanced_features/quantized_kv_cache"
TRT_LONG = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/docs/source/features/long-sequence.md"
TRT_RUN = "https://github.com/NVIDIA/TensorRT-LLM/blob/v0.9.0/examples/run.py"
TRT_QUANT = "https://github.com/NVIDIA/TensorRT-LLM/blob/main/examples/quantization/README.md"
LLAMA_SERVER = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"
LLAMA_ARGS = "https://github.com/ggml-org/llama.cpp/blob/master/common/arg.cpp"
LLAMA_VERSION = "0.4.0"
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
    why), `version` the release it was checked in, `source` where that is written, `note` how it differs."""

    engine: str
    setting: str | None
    version: str = ""
    source: str = ""
    note: str = ""

    def line(self) -> str:
        """One comment-ready line: `vLLM 0.4.2: --kv-cache-dtype fp8 (note) <source>`."""
        if self.setting is None:
            return f"{self.engine}: no serving equivalent: {self.note}"
        note = f" ({self.note})" if self.note else ""
        return f"{self.engine} {self.version}: {self.setting}{note} <{self.source}>"


def no_equivalent(reason: str) -> list[ServingSetting]:
    """Every engine: no serving equivalent, for `reason`."""
    return [ServingSetting(engine, None, note=reason) for engine in ENGINES]
