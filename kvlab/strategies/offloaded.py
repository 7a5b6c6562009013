"""`offloaded` and `offloaded_static`: caches whose layers wait in CPU memory while
other layers run on the GPU (`DynamicCache(offloading=True)`,
`StaticCache(offloading=True)`). They need CUDA: on a CPU-only torch the first
update raises "Torch not compiled with CUDA enabled", so kvlab reports them as
unavailable before running."""

from dataclasses import dataclass

from .base import Strategy, cuda_reason, register, require_int
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


@register
@dataclass
class OffloadedStatic(Strategy):
    name = "offloaded_static"
    is_croppable = True
    summary = "Static (preallocated) cache kept in CPU RAM, each layer prefetched to the GPU when needed. Exact; fixed host memory, transfer cost."
    max_cache_len: int | None = None

    def __post_init__(self):
        if self.max_cache_len is not None:
            require_int("max_cache_len", self.max_cache_len, 1)

    def unavailable_reason(self, loaded) -> str | None:
        return cuda_reason()

    @property
    def follows_layer_types(self) -> bool:
        return True

    def window_tokens(self, window: int) -> int:
        return window

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        Static(max_cache_len=self.max_cache_len).check_fits(prompt_tokens, max_new_tokens)

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import StaticCache

        return StaticCache(config=loaded.config, max_cache_len=self.max_cache_len or max_total_tokens, offloading=True)

    def capacity(self, max_total_tokens: int) -> int:
        """`max_cache_len`, else `max_total_tokens`, tokens."""
        return self.max_cache_len or max_total_tokens

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        return self.capacity(max_total_tokens)

    def cache_code(self):
        size = self.max_cache_len or "inputs.input_ids.shape[1] + max_new_tokens"
        return ["from transformers import StaticCache"], f"cache = StaticCache(config=model.config, max_cache_len={size}, offloading=True)"
