"""`offloaded` and `offloaded_static`: caches whose layers wait in CPU memory while
other layers run on the GPU (`DynamicCache(offloading=True)`,
`StaticCache(offloading=True)`). They need CUDA: on a CPU-only torch the first
update raises "Torch not compiled with CUDA enabled", so kvlab reports them as
unavailable before running."""

from dataclasses import dataclass
from typing import ClassVar

from ..engines import ServingSetting
from ..engines.settings import (LLAMA_ARGS, LLAMA_VERSION, SGLANG_MEMORY_ARGS, SGLANG_VERSION, TRT_KV_CONFIG,
                                TRT_VERSION, VLLM_ARGS, VLLM_VERSION)
from .base import Strategy, cuda_reason, register
from .static import Static


@register
@dataclass
class Offloaded(Strategy):
    name = "offloaded"
    summary = "Dynamic cache whose layers sit in CPU RAM and are prefetched to the GPU one layer ahead. Exact; saves GPU memory, costs transfer time."
    is_croppable = True

    def unavailable_reason(self, loaded) -> str | None:
        return cuda_reason()

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import DynamicCache

        return DynamicCache(offloading=True)

    def cache_code(self):
        return ["from transformers import DynamicCache"], "cache = DynamicCache(offloading=True)"

    def serving_settings(self) -> list:
        """No engine prefetches a running request's KV cache layer by layer; vLLM, SGLang and TensorRT-LLM keep
        KV blocks in host memory as a second tier, and llama.cpp can keep the whole cache in host memory."""
        tier = "KV blocks moved to host memory and back, not layer-by-layer prefetch of a running request"
        return [ServingSetting("vLLM", "--kv-offloading-size GiB", VLLM_VERSION, VLLM_ARGS,
                               f"a CPU offloading buffer (--kv-offloading-backend native): {tier}"),
                ServingSetting("SGLang", "--enable-hierarchical-cache --hicache-ratio R", SGLANG_VERSION,
                               SGLANG_MEMORY_ARGS, f"a host-memory tier of the prefix cache: {tier}"),
                ServingSetting("TensorRT-LLM", "KvCacheConfig(host_cache_size=BYTES)", TRT_VERSION, TRT_KV_CONFIG,
                               f"reusable blocks offloaded to host memory: {tier}"),
                ServingSetting("llama.cpp", "--no-kv-offload (-nkvo)", LLAMA_VERSION, LLAMA_ARGS,
                               "the KV cache stays in host memory and attention runs there")]


@register
@dataclass
class OffloadedStatic(Static):
    """`Static` whose layers wait in CPU memory (`StaticCache(offloading=True)`). Knob: `max_cache_len` only;
    `compile` is a class constant (False) here, not a knob."""

    name = "offloaded_static"
    summary = "Static (preallocated) cache kept in CPU RAM, each layer prefetched to the GPU when needed. Exact; fixed host memory, transfer cost."
    title_knobs = ()
    offloading = True
    compile: ClassVar[bool] = False

    def unavailable_reason(self, loaded) -> str | None:
        return cuda_reason()

    def title(self) -> str:
        return self.name

    def caveat(self) -> str:
        return ""

    serving_settings = Offloaded.serving_settings
