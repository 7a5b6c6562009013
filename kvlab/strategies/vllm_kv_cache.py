"""`vllm_kv_cache`: the KV cache vLLM holds under `--kv-cache-dtype <kv_cache_dtype>`, one to one: the TurboQuant
presets `turboquant_k8v4`, `turboquant_4bit_nc`, `turboquant_k3v4_nc`, `turboquant_3bit_nc` and
`int4_per_token_head` (the formats: `kvlab.caches.vllm_turboquant`, `kvlab.caches.vllm_int4`; the vLLM files and
commits followed: `kvlab.caches.quant.vllm`).

A TurboQuant preset stores per token and KV head one slot: the key as float8 (k8) or as Hadamard-rotated
Lloyd-Max codes plus a float16 norm, the value as uniform codes plus a float16 scale and min; the `_nc` presets
renormalize the codebook vector before rotating it back; the first and last 2 layers keep the model's dtype.
`int4_per_token_head` stores 4-bit codes after a randomized Hadamard transform with one float32 scale (zero point
inside) per key and per value. The knobs where vLLM and the TurboQuant paper (arXiv 2504.19874) differ show both:
`values` (uniform: vLLM; lloyd_max: the paper), `norm_correction` (empty: the preset's), `qjl` (false: vLLM
drops QJL; true: the paper's TurboQuant-prod keys), `rotation` (hadamard: vLLM; haar: the paper's random
rotation), `boundary_layers` (empty: vLLM's 2 for TurboQuant, 0 for int4). The backend object
(`kvlab.caches.quant.vllm`) checks the knobs, builds the cache and gives its refusal reason, snippet and serving
note; this module holds the knobs and asks it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .base import Strategy, StrategyError, register

BACKEND = "vllm"
"""The quantization backend (`kvlab.caches.quant`) this strategy is the column of."""


@register
@dataclass
class VllmKVCache(Strategy):
    """Knobs: `kv_cache_dtype` (turboquant_k8v4 | turboquant_4bit_nc | turboquant_k3v4_nc | turboquant_3bit_nc |
    int4_per_token_head), and for the TurboQuant presets `values` (uniform | lloyd_max), `norm_correction` (empty:
    the preset's; true | false), `qjl` (false | true), `rotation` (hadamard | haar); `boundary_layers` (empty: the
    preset's; layers kept in the model's dtype at each end)."""

    name = "vllm_kv_cache"
    summary = ("vLLM's --kv-cache-dtype formats one to one: the TurboQuant presets (rotated Lloyd-Max or fp8 keys, "
               "uniform 3-4-bit values) and int4_per_token_head. Lossy.")
    lossy = True
    title_knobs = ("kv_cache_dtype",)
    kv_cache_dtype: str = "turboquant_4bit_nc"
    values: str = "uniform"
    norm_correction: bool | None = None
    qjl: bool = False
    rotation: str = "hadamard"
    boundary_layers: int | None = None

    def __post_init__(self):
        try:
            self.quantizer.check_knobs(self.knobs(), {f.name: f.default for f in fields(self)})
        except ValueError as err:
            raise StrategyError(str(err)) from err

    @property
    def quantizer(self):
        """The vllm backend object (`kvlab.caches.quant.vllm.VllmBackend`)."""
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
        """vLLM's flag for these knobs with vLLM's own cost figure (`QuantBackend.serving`)."""
        return self.quantizer.serving(self.knobs())
