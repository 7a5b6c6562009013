"""`sliding_window`: the model's own sliding-window layers (e.g. Gemma 3) keep only
their window; full-attention layers keep everything. Model-native only: a model
without sliding layers gets a clear message (use `sink` for a window on any model).
On a hybrid model it builds the same cache as `dynamic` with its default
`layer_types: model` (transformers' default); it is the column that names the
window, and the one that refuses a model without one."""

from dataclasses import dataclass

from ..engines import ServingSetting
from ..engines.settings import (LLAMA_ARGS, LLAMA_VERSION, SGLANG_SCHEDULE_ARGS, SGLANG_VERSION, TRT_KV_CONFIG,
                                TRT_VERSION, VLLM_ARGS, VLLM_VERSION)
from .base import Strategy, register, sliding_layer_types


@register
@dataclass
class SlidingWindow(Strategy):
    name = "sliding_window"
    summary = "Uses the model's own sliding-window layers: those keep only the last `sliding_window` tokens. Exact for models trained that way."
    is_sliding = True

    def caveat(self) -> str:
        return ("each sliding layer keeps its last sliding_window - 1 tokens (transformers' DynamicSlidingWindowLayer); "
                "exact, since those layers never attend further back")

    def unavailable_reason(self, loaded) -> str | None:
        if not sliding_layer_types(loaded):
            return ("this model has no sliding-window layers (config.layer_types is all full attention); "
                    "sliding_window is model-native only, use sink for a window on any model")
        return None

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import DynamicCache

        return DynamicCache(config=loaded.config)

    def cache_code(self):
        return ["from transformers import DynamicCache"], "cache = DynamicCache(config=model.config)"

    def serving_settings(self) -> list:
        own = "the model's own sliding layers are honoured by default"
        return [ServingSetting("vLLM", "the default (--disable-sliding-window turns it off)", VLLM_VERSION,
                               VLLM_ARGS, own),
                ServingSetting("SGLang", "the default (--swa-full-tokens-ratio sizes the sliding pool)",
                               SGLANG_VERSION, SGLANG_SCHEDULE_ARGS, own),
                ServingSetting("TensorRT-LLM", "KvCacheConfig(max_attention_window=[...])", TRT_VERSION,
                               TRT_KV_CONFIG, "a window per layer; also forces a window on full-attention layers"),
                ServingSetting("llama.cpp", "the default (--swa-full keeps the full cache)", LLAMA_VERSION,
                               LLAMA_ARGS, own)]
