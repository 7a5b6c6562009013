"""`rotation_quantized`: rotation quantization of the KV cache, TurboQuant-MSE (Zandieh et al., "TurboQuant: Online
Vector Quantization with Near-optimal Distortion Rate", arXiv 2504.19874, Algorithm 1), on transformers'
`QuantizedLayer` residual (KIVI, Liu et al. 2024).

Each key and value vector (one head, one position) is stored as its float16 norm and, per coordinate of the
randomly rotated unit vector, the index of the Lloyd-Max codebook of a random unit vector's coordinates, keys at
`key_bits` and values at `value_bits` per coordinate; the newest `residual_length` tokens wait in full precision.
Bytes per quantized token and layer: kv_heads·(key_bits·ceil(d/8) + 2 + value_bits·ceil(d/8) + 2), plus
2·kv_heads·d·element_size per residual token, plus one float32 rotation (4·d²) and the two codebooks per cache,
counted once (`kvlab.caches.rotation_quant`'s docstring gives the layout byte by byte). On a model with
sliding-window layers (Gemma 3) only the full-attention layers are quantized and the sliding layers keep their
window as transformers' default cache does; `sliding: quantize` stores that window rotation-quantized too
(the oldest positions are dropped from the codes exactly, nothing is quantized twice). The backend object
(`kvlab.caches.quant.rotation`) checks the knobs, builds the cache (`kvlab.caches.rotation_cache`) and gives its
refusal reason, snippet and serving note; this module holds the knobs and asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .base import Strategy, StrategyError, register

DEFAULT_RESIDUAL_LENGTH = 128
"""transformers' `QuantizedLayer` default, as for `quantized`."""
BACKEND = "rotation"
"""The quantization backend (`kvlab.caches.quant`) this strategy is the column of."""


@register
@dataclass
class RotationQuantized(Strategy):
    """Knobs: `key_bits`, `value_bits` (1-4 bits per coordinate each, e.g. k4/v2), `residual_length` (newest
    tokens kept in full precision, as KIVI), `seed` (draws the random rotation) and `sliding` (`keep`: a hybrid
    model's sliding layers keep their window in full precision; `quantize`: quantized too)."""

    name = "rotation_quantized"
    summary = ("TurboQuant: rotates each key/value vector at random and stores its norm and 1-4-bit Lloyd-Max "
               "codes per coordinate; the newest residual_length tokens stay in full precision. Lossy.")
    lossy = True
    title_knobs = ("key_bits", "value_bits", "residual_length")
    key_bits: int = 4
    value_bits: int = 4
    residual_length: int = DEFAULT_RESIDUAL_LENGTH
    seed: int = 0
    sliding: str = "keep"

    def __post_init__(self):
        try:
            self.quantizer.check_knobs(self.knobs(), {f.name: f.default for f in fields(self)})
        except ValueError as err:
            raise StrategyError(str(err)) from err

    @property
    def quantizer(self):
        """The rotation backend object (`kvlab.caches.quant.rotation.RotationBackend`)."""
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
        """The backend's serving note for these bits (vLLM's TurboQuant types; `QuantBackend.serving`)."""
        return self.quantizer.serving(self.knobs())
