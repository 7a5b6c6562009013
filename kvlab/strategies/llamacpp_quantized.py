"""`llamacpp_quantized`: the KV cache as llama.cpp stores it with `-ctk <type_k> -ctv <type_v>`, inside
transformers, so one setting can be judged on the same weights in both engines.

Keys and values are stored per token in ggml's block types along head_dim (q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1:
32 values per block with a float16 scale, and a float16 minimum for the _1 types; or plain f32/f16/bf16), bit for bit as
ggml's reference quantization, and Hadamard-rotated as llama.cpp (PR #21038) rotates a quantized cache when
head_dim is divisible by 64 (`attn_rot: false` is its `LLAMA_ATTN_ROT_DISABLE=1`). llama.cpp keeps no
full-precision part, so `residual_length` is 0 by default; on a model with sliding-window layers (Gemma 3) those
are stored in the same types, as llama.cpp's sliding-window cache is (`sliding: keep` leaves them to
transformers). The backend object (`kvlab.caches.quant.llamacpp`) checks the knobs, builds the cache
(`kvlab.caches.ggml_cache`) and gives its refusal reason, snippet, bytes and serving note; this module holds the
knobs and asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .base import Strategy, StrategyError, register

BACKEND = "llamacpp"
"""The quantization backend (`kvlab.caches.quant`) this strategy is the column of."""


@register
@dataclass
class LlamaCppQuantized(Strategy):
    """Knobs: `type_k`, `type_v` (llama.cpp's cache types: q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, f32, f16, bf16),
    `attn_rot` (rotate as llama.cpp does; false as `LLAMA_ATTN_ROT_DISABLE=1`), `residual_length` (newest decoded
    tokens kept in full precision; 0, llama.cpp's, keeps none) and `sliding` (`quantize`: a hybrid model's
    sliding layers stored the same way, as llama.cpp does; `keep`: left to transformers)."""

    name = "llamacpp_quantized"
    summary = ("llama.cpp's KV cache types (-ctk/-ctv: q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 blocks of 32 with a "
               "float16 scale), Hadamard-rotated as llama.cpp does, every token stored as it arrives. Lossy.")
    lossy = True
    title_knobs = ("type_k", "type_v")
    type_k: str = "q4_0"
    type_v: str = "q4_0"
    attn_rot: bool = True
    residual_length: int = 0
    sliding: str = "quantize"

    def __post_init__(self):
        try:
            self.quantizer.check_knobs(self.knobs(), {f.name: f.default for f in fields(self)})
        except ValueError as err:
            raise StrategyError(str(err)) from err

    @property
    def quantizer(self):
        """The llamacpp backend object (`kvlab.caches.quant.llamacpp.LlamaCppBackend`)."""
        from ..caches.quant import get_backend

        return get_backend(BACKEND)

    @property
    def follows_layer_types(self) -> bool:
        return True

    def title(self) -> str:
        return self.quantizer.title(self.knobs())

    def caveat(self) -> str:
        return self.quantizer.caveat(self.knobs())

    def unavailable_reason(self, loaded) -> str | None:
        return self.quantizer.unavailable_reason(loaded.config, self.knobs())

    def build_cache(self, loaded, max_total_tokens: int):
        try:
            return self.quantizer.build_cache(loaded.config, self.knobs())
        except ValueError as err:
            raise StrategyError(str(err)) from err

    def cache_code(self):
        return self.quantizer.cache_code(self.knobs())

    def serving_settings(self) -> list:
        """The backend's serving note: llama.cpp's own flags for these types (`QuantBackend.serving`)."""
        return self.quantizer.serving(self.knobs())
