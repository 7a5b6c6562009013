"""The hqq backend: Half-Quadratic Quantization (1, 2, 3, 4 or 8 bits), transformers' `HQQQuantizedLayer`.

Groups of `q_group_size` channels along `axis_key`/`axis_value` (0 or 1); the state is hqq's (packed data, meta)
pair, the meta dict holding the scale, the zero point and the shape the data stands for (`quantized_shape` reads
it). hqq reads values while packing, so the planner measures it on the CPU and extrapolates by its packing period
(8/nbits values per byte, 10 per 32-bit word at 3 bits). hqq itself is imported on first use
(`kvlab.caches.deferred_hqq`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import register_backend
from .transformers_layers import TransformersBackend


@dataclass(frozen=True)
class HQQBackend(TransformersBackend):
    """transformers' hqq backend; its quantized shape is kept in the meta dict."""

    def quantized_shape(self, layer) -> tuple[int, ...] | None:
        state = getattr(layer, "_quantized_keys", None)
        if isinstance(state, (tuple, list)) and len(state) > 1 and isinstance(state[1], dict) and "shape" in state[1]:
            return tuple(int(n) for n in state[1]["shape"])
        return super().quantized_shape(layer)


HQQ = register_backend(HQQBackend(
    name="hqq", pip="hqq", package="hqq", nbits=(1, 2, 3, 4, 8), default_nbits=4, axes=(0, 1),
    layer_name="HQQQuantizedLayer"))
