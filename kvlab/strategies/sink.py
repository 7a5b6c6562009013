"""`sink`: StreamingLLM's attention-sink cache (Xiao et al. 2023, "Efficient
Streaming Language Models with Attention Sinks", arXiv:2309.17453), which
transformers 5 removed. It keeps the first `num_sink_tokens` tokens plus the most
recent ones, `window_length` in all, so memory stays constant however long the
run. `num_sink_tokens: 0` is the paper's window-attention baseline."""

from dataclasses import dataclass

from ..engines import ServingSetting
from ..engines.settings import LLAMA_ARGS, LLAMA_VERSION, SGLANG_VERSION, TRT_KV_CONFIG, TRT_VERSION, VLLM_VERSION
from .base import Strategy, StrategyError, register


@register
@dataclass
class Sink(Strategy):
    """Knobs: `window_length` (tokens kept, sinks included) and `num_sink_tokens`."""

    name = "sink"
    summary = ("Keeps the first few tokens (attention sinks) and a window of the most recent ones; constant memory "
               "for endless runs. Approximate once the window is full.")
    lossy = True
    is_streaming = True
    title_knobs = ("window_length", "num_sink_tokens")
    window_length: int = 256
    num_sink_tokens: int = 4

    def __post_init__(self):
        from ..caches.sink import validate_knobs

        try:
            validate_knobs(self.window_length, self.num_sink_tokens)
        except ValueError as err:
            raise StrategyError(str(err)) from err

    def title(self) -> str:
        if self.num_sink_tokens == 0:
            return f"window {self.window_length}"
        return f"sink {self.num_sink_tokens}+{self.window_length - self.num_sink_tokens}"

    def caveat(self) -> str:
        return (f"exact until {self.window_length} tokens are cached; after that older tokens are evicted "
                "and the output is approximate")

    def unavailable_reason(self, loaded) -> str | None:
        from ..caches.rotary import unsupported_reason

        return unsupported_reason(loaded.config)

    def build_cache(self, loaded, max_total_tokens: int):
        from ..caches.sink import SinkCache

        return SinkCache.from_model(loaded.model, self.window_length, self.num_sink_tokens)

    def forward(self, loaded, cache, sequence, new_tokens: int):
        """Feeds long inputs through the window in chunks (see `prefill_in_chunks`); (1, vocab) logits."""
        from ..caches.sink import prefill_in_chunks

        if new_tokens <= self.window_length - self.num_sink_tokens:
            return super().forward(loaded, cache, sequence, new_tokens)
        return prefill_in_chunks(loaded.model, sequence[:, -new_tokens:], cache, logits_to_keep=1).logits[:, -1, :]

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        return min(seen_tokens, self.window_length)

    def forward_code(self) -> tuple[list[str], list[str]]:
        chunk = self.window_length - self.num_sink_tokens
        return ["from kvlab.caches.sink import prefill_in_chunks"], [
                f"if input_ids.shape[1] > {chunk}:  # longer than the window minus the sinks: stream it in chunks",
                "    out = prefill_in_chunks(model, input_ids, cache, logits_to_keep=1)",
                "else:",
                "    out = model(input_ids=input_ids, cache=cache, use_cache=True, position_ids=position_ids, "
                "logits_to_keep=1)"]

    def cache_code(self):
        return ["from kvlab.caches.sink import SinkCache"], (
            f"cache = SinkCache.from_model(model, window_length={self.window_length}, "
            f"num_sink_tokens={self.num_sink_tokens})"
        )

    def serving_settings(self) -> list:
        """TensorRT-LLM's KvCacheConfig takes `num_sink_tokens` and `window_length` (StreamingLLM); llama.cpp's
        context shift keeps `num_sink_tokens`; vLLM and SGLang have no attention-sink window."""
        sinks, window = int(self.num_sink_tokens), int(self.window_length)
        paged = ("no attention-sink window in its options (checked in {}): the paged cache keeps every token of a "
                 "request; its 'sinks' are gpt-oss's learned attention sinks, not StreamingLLM")
        return [ServingSetting("vLLM", None, note=paged.format(f"vLLM {VLLM_VERSION}")),
                ServingSetting("SGLang", None, note=paged.format(f"SGLang {SGLANG_VERSION}")),
                ServingSetting("TensorRT-LLM", f"KvCacheConfig(sink_token_length={sinks}, "
                               f"max_attention_window=[{window}])", TRT_VERSION, TRT_KV_CONFIG,
                               "StreamingLLM's sink tokens and window, as here"),
                ServingSetting("llama.cpp", f"--context-shift --keep {sinks}", LLAMA_VERSION, LLAMA_ARGS,
                               "when the context is full, half of the tokens after the kept ones are dropped at once, "
                               "not a rolling window")]
