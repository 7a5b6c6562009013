"""`static`: transformers' StaticCache, preallocated to `max_cache_len` tokens."""

from dataclasses import dataclass

from .base import Strategy, StrategyError, register, require_int


@register
@dataclass
class Static(Strategy):
    """Knobs: `max_cache_len` (tokens; None = prompt + max_new_tokens), `compile`
    (wrap the decode forward in `torch.compile`, static shapes make it reusable)."""

    name = "static"
    summary = "Preallocates max_cache_len tokens up front and writes in place. Exact; fixed memory, compile-friendly, refuses to overflow."
    max_cache_len: int | None = None
    compile: bool = False

    def __post_init__(self):
        if self.max_cache_len is not None:
            require_int("max_cache_len", self.max_cache_len, 1)
        if not isinstance(self.compile, bool):
            raise StrategyError(f"compile must be true or false, got {self.compile!r}")

    def describe(self) -> str:
        return self.label or f"static{'' if self.max_cache_len is None else f' {self.max_cache_len}'}{' compiled' if self.compile else ''}"

    def unavailable_reason(self, loaded) -> str | None:
        if self.compile and loaded.device.type != "cuda":
            return ("compile=true needs a CUDA GPU here: on this CPU build every decode step recompiled "
                    "(36-69 s per token measured), so kvlab does not offer it; use compile=false")
        return None

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        needed = prompt_tokens + max_new_tokens
        if self.max_cache_len is not None and self.max_cache_len < needed:
            raise StrategyError(
                f"static cache too small: max_cache_len={self.max_cache_len} tokens, but prompt ({prompt_tokens}) "
                f"+ max_new_tokens ({max_new_tokens}) = {needed}; raise max_cache_len to at least {needed}"
            )

    def capacity(self, max_total_tokens: int) -> int:
        return self.max_cache_len or max_total_tokens

    def build_cache(self, loaded, max_total_tokens: int):
        from transformers import StaticCache

        return StaticCache(config=loaded.config, max_cache_len=self.capacity(max_total_tokens))

    def forward(self, loaded, cache, sequence, new_tokens: int):
        if self.compile and new_tokens == 1:
            from ..compiled import compiled_decode

            out = compiled_decode(loaded)(input_ids=sequence[:, -1:], cache=cache, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1, :]
        return super().forward(loaded, cache, sequence, new_tokens)

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        return self.capacity(max_total_tokens)

    def cache_code(self):
        size = self.max_cache_len or "inputs.input_ids.shape[1] + max_new_tokens"
        return ["from transformers import StaticCache"], f"cache = StaticCache(config=model.config, max_cache_len={size})"
