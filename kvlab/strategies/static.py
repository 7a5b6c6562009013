"""`static`: transformers' StaticCache, preallocated to `max_cache_len` tokens."""

from dataclasses import dataclass, replace
from typing import ClassVar

from ..engines import ServingSetting
from ..generation import MAX_NEW_TOKENS_CAP, MAX_PROMPT_TOKENS
from ..engines.settings import (LLAMA_ARGS, LLAMA_VERSION, SGLANG_SCHEDULE_ARGS, SGLANG_VERSION, TRT_KV_CONFIG,
                                TRT_VERSION, VLLM_ARGS, VLLM_VERSION)
from .base import Strategy, StrategyError, register, require_int
from .knob_yaml import shown

COMPILE_BUCKET = 256
"""With compile and no max_cache_len, the cache holds prompt + new tokens rounded up to a multiple of this,
so runs with different prompt lengths share one compiled forward."""
MAX_CACHE_LEN = 2 * (MAX_PROMPT_TOKENS + MAX_NEW_TOKENS_CAP)
"""Largest `max_cache_len` a column takes, in tokens: twice the longest run (KVLAB_MAX_PROMPT_TOKENS +
KVLAB_MAX_NEW_TOKENS), so a chat can grow its cache, while a typed 10**12 is refused before a cache of that
size is allocated (a preallocating cache takes all of its memory at once). Plan needs no max_cache_len: it
sizes a static cache by each context it plans."""


@register
@dataclass
class Static(Strategy):
    """Knobs: `max_cache_len` (tokens; None = prompt + max_new_tokens), `compile`
    (wrap the decode forward in `torch.compile`, static shapes make it reusable)."""

    name = "static"
    summary = "Preallocates max_cache_len tokens up front and writes in place. Exact; fixed memory, compile-friendly, refuses to overflow."
    is_croppable = True
    title_knobs = ("max_cache_len", "compile")
    offloading: ClassVar[bool] = False
    """Whether layers wait in CPU memory (`StaticCache(offloading=True)`, see `OffloadedStatic`)."""
    max_cache_len: int | None = None
    compile: bool = False

    def __post_init__(self):
        if self.max_cache_len is not None:
            require_int("max_cache_len", self.max_cache_len, 1)
            if self.max_cache_len > MAX_CACHE_LEN:
                raise StrategyError(
                    f"max_cache_len={self.max_cache_len:,} tokens is past the {MAX_CACHE_LEN:,} a static cache here "
                    f"may preallocate (twice KVLAB_MAX_PROMPT_TOKENS + KVLAB_MAX_NEW_TOKENS)")
        if not isinstance(self.compile, bool):
            raise StrategyError(f"compile must be true or false, got {shown(self.compile)}")

    def title(self) -> str:
        size = "" if self.max_cache_len is None else f" {self.max_cache_len}"
        return f"static{size}{' compiled' if self.compile else ''}"

    def caveat(self) -> str:
        if self.compile:
            return (f"compile: the first decode step of each cache size compiles the forward (about 30 s on a "
                    f"2-core CPU), and that step's latency includes it; without max_cache_len the cache is "
                    f"rounded up to a multiple of {COMPILE_BUCKET} tokens so later prompts reuse the compiled code")
        return ""

    def warm_up(self, loaded, **kwargs) -> None:
        """The default warm-up without `compile` (compiling is per cache size and stays in the first compiled
        step, as the caveat says)."""
        Strategy.warm_up(replace(self, compile=False) if self.compile else self, loaded, **kwargs)

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        needed = prompt_tokens + max_new_tokens
        if self.max_cache_len is not None and self.max_cache_len < needed:
            raise StrategyError(
                f"static cache too small: max_cache_len={self.max_cache_len} tokens, but prompt ({prompt_tokens}) "
                f"+ max_new_tokens ({max_new_tokens}) = {needed}; raise max_cache_len to at least {needed}"
            )

    @property
    def is_compileable(self) -> bool:
        return self.compile

    @property
    def follows_layer_types(self) -> bool:
        """StaticCache is built from the config: a sliding layer is a `StaticSlidingWindowLayer`."""
        return True

    def window_tokens(self, window: int) -> int:
        """A `StaticSlidingWindowLayer` allocates min(max_cache_len, window) slots (the window, at most)."""
        return window

    def capacity(self, max_total_tokens: int) -> int:
        """`max_cache_len`, else `max_total_tokens` (rounded up to COMPILE_BUCKET with compile), tokens."""
        if self.max_cache_len:
            return self.max_cache_len
        if self.compile:
            return -(-max_total_tokens // COMPILE_BUCKET) * COMPILE_BUCKET
        return max_total_tokens

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import StaticCache

        return StaticCache(config=loaded.config, max_cache_len=self.capacity(max_total_tokens),
                           offloading=self.offloading)

    def forward(self, loaded, cache, sequence, new_tokens: int):
        if self.compile and new_tokens == 1:
            from ..caches.compiled import decode_step

            return decode_step(loaded, cache, sequence[:, -1:], sequence.shape[1] - 1)
        return super().forward(loaded, cache, sequence, new_tokens)

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        return self.capacity(max_total_tokens)

    def cache_code(self):
        size = self.max_cache_len or "inputs.input_ids.shape[1] + max_new_tokens"
        offloading = ", offloading=True" if self.offloading else ""
        return (["from transformers import StaticCache"],
                f"cache = StaticCache(config=model.config, max_cache_len={size}{offloading})")

    def serving_settings(self) -> list:
        """Every engine allocates its KV pool once at start, as a static cache is."""
        return [ServingSetting("vLLM", "--gpu-memory-utilization F --max-model-len N", VLLM_VERSION, VLLM_ARGS,
                               "the KV pool is allocated once at start, as a static cache is"),
                ServingSetting("SGLang", "--mem-fraction-static F", SGLANG_VERSION, SGLANG_SCHEDULE_ARGS,
                               "the KV pool is allocated once at start"),
                ServingSetting("TensorRT-LLM", "KvCacheConfig(free_gpu_memory_fraction=F)", TRT_VERSION,
                               TRT_KV_CONFIG, "the KV pool is allocated once at start"),
                ServingSetting("llama.cpp", "--ctx-size N", LLAMA_VERSION, LLAMA_ARGS,
                               "the cache is allocated for N tokens at start")]
