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
(the oldest positions are dropped from the codes exactly, nothing is quantized twice). The cache class is `kvlab.caches.rotation_cache`; this module
validates knobs and builds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Strategy, StrategyError, register

DEFAULT_RESIDUAL_LENGTH = 128
"""transformers' `QuantizedLayer` default, as for `quantized`."""


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
        from ..caches.rotation_cache import SLIDING_CHOICES, check_knobs

        try:
            check_knobs(self.key_bits, self.value_bits, self.residual_length, self.seed)
        except ValueError as err:
            raise StrategyError(str(err)) from err
        if self.sliding not in SLIDING_CHOICES:
            raise StrategyError(f"sliding must be one of {list(SLIDING_CHOICES)}, got {self.sliding!r}")

    @property
    def follows_layer_types(self) -> bool:
        return True

    def title(self) -> str:
        return f"rotation k{self.key_bits}/v{self.value_bits} r{self.residual_length}"

    def caveat(self) -> str:
        return (f"the prompt is quantized at prefill; then up to residual_length={self.residual_length} new tokens "
                "wait in full precision before being quantized")

    def unavailable_reason(self, loaded) -> str | None:
        from ..caches.hybrid import FULL_ATTENTION, head_dim_of, layer_types_of
        from ..caches.lloyd_max import MIN_HEAD_DIM

        width = head_dim_of(loaded.config)
        if width is not None and width < MIN_HEAD_DIM:
            return f"rotation quantization needs head_dim >= {MIN_HEAD_DIM}; this model's is {width}"
        types = set(layer_types_of(loaded.config))
        if FULL_ATTENTION not in types and not (self.sliding == "quantize" and "sliding_attention" in types):
            return (f"this model has no full-attention layers to quantize (all its layers are "
                    f"{', '.join(sorted(set(layer_types_of(loaded.config))))})")
        return None

    def build_cache(self, loaded, max_total_tokens: int):
        from ..caches.rotation_cache import RotationQuantizedCache

        try:
            return RotationQuantizedCache(loaded.config, key_bits=self.key_bits, value_bits=self.value_bits,
                                          residual_length=self.residual_length, seed=self.seed,
                                          sliding=self.sliding)
        except ValueError as err:
            raise StrategyError(str(err)) from err

    def cache_code(self):
        return ["from kvlab.caches.rotation_cache import RotationQuantizedCache"], (
            f"cache = RotationQuantizedCache(model.config, key_bits={self.key_bits}, value_bits={self.value_bits}, "
            f"residual_length={self.residual_length}, seed={self.seed}"
            + (f", sliding={self.sliding!r}" if self.sliding != "keep" else "") + ")  # TurboQuant-MSE, arXiv 2504.19874")
