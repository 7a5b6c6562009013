"""`dynamic`: transformers' DynamicCache, growing by concatenation (the default)."""

from dataclasses import dataclass

from .base import Strategy, register


@register
@dataclass
class Dynamic(Strategy):
    name = "dynamic"
    is_croppable = True
    summary = "Keeps every token's keys and values, growing one token at a time. Exact; memory grows linearly with length."

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import DynamicCache

        return DynamicCache()

    def cache_code(self):
        return ["from transformers import DynamicCache"], "cache = DynamicCache()"
