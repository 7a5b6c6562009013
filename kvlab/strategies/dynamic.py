"""`dynamic`: transformers' DynamicCache, growing by concatenation (the default).

By default the cache is built from the model's config, as transformers builds
it when `generate()` gets no cache: on a hybrid model (Gemma 2/3, gpt-oss) its
sliding layers are `DynamicSlidingWindowLayer`s that keep only their window
and its full-attention layers keep every token; on a model whose layers are all
full attention every layer keeps every token. `layer_types: full` builds
`DynamicCache()` without the config: every layer keeps every token, the sliding
ones too (their attention still only reads the window, so the output is the
same and only the memory differs)."""

from dataclasses import dataclass

from ..engines import ServingSetting
from ..engines.settings import (LLAMA_ARGS, LLAMA_VERSION, SGLANG_MODEL_ARGS, SGLANG_VERSION, TRT_KV_CONFIG,
                                TRT_VERSION, VLLM_CACHE, VLLM_VERSION)
from .base import Strategy, StrategyError, register
from .knob_yaml import shown

LAYER_TYPES = ("model", "full")


@register
@dataclass
class Dynamic(Strategy):
    """Knob: `layer_types` (`model`: the cache follows `config.layer_types`, transformers' default; `full`:
    every layer keeps every token)."""

    name = "dynamic"
    is_croppable = True
    summary = ("Keeps every token's keys and values, growing one token at a time (on a hybrid model its sliding "
               "layers keep their window, as transformers' default cache does). Exact; memory grows linearly.")
    title_knobs = ("layer_types",)
    layer_types: str = "model"

    def __post_init__(self):
        if self.layer_types not in LAYER_TYPES:
            raise StrategyError(f"layer_types must be one of {list(LAYER_TYPES)}, got {shown(self.layer_types)}")

    def title(self) -> str:
        return self.name if self.layer_types == "model" else f"{self.name} all-full"

    @property
    def follows_layer_types(self) -> bool:
        return self.layer_types == "model"

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import DynamicCache

        return DynamicCache(config=loaded.config) if self.follows_layer_types else DynamicCache()

    def cache_code(self):
        code = "cache = DynamicCache(config=model.config)" if self.follows_layer_types else "cache = DynamicCache()"
        return ["from transformers import DynamicCache"], code

    def serving_settings(self) -> list:
        return [ServingSetting("vLLM", "--kv-cache-dtype auto (the default)", VLLM_VERSION, VLLM_CACHE,
                               "a paged cache grown block by block"),
                ServingSetting("SGLang", "--kv-cache-dtype auto (the default)", SGLANG_VERSION, SGLANG_MODEL_ARGS),
                ServingSetting("TensorRT-LLM", 'KvCacheConfig(dtype="auto") (the default paged KV cache)',
                               TRT_VERSION, TRT_KV_CONFIG),
                ServingSetting("llama.cpp", "-ctk f16 -ctv f16 (the default)", LLAMA_VERSION, LLAMA_ARGS)]
