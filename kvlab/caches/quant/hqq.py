"""The hqq backend: Half-Quadratic Quantization (1, 2, 3, 4 or 8 bits), transformers' `HQQQuantizedLayer`, and
`HQQAxis1Layer`, which makes `axis_key`/`axis_value` 1 work at every length.

Groups of `q_group_size` channels along `axis_key`/`axis_value` (0 or 1); the state is hqq's (packed data, meta)
pair, the meta dict holding the scale, the zero point and the shape the data stands for (`quantized_shape` reads
it). hqq reads values while packing, so the planner measures it on the CPU and extrapolates by its packing period
(8/nbits values per byte, 10 per 32-bit word at 3 bits). hqq itself is imported on first use
(`kvlab.caches.deferred_hqq`).

Axis 1 upstream (hqq 0.2.8, transformers 5.24): hqq quantizes a (batch, kv_heads, tokens, head_dim) state at
axis 1 as rows of `q_group_size` values (`W.reshape([-1, group_size])`), then packs those rows in 8/nbits
slices of `len(W) // (8/nbits)` rows (`BitPack.pack_4bit_u8`: `(W[:step] << 4) | W[step:]`). When the row count
is not a multiple of 8/nbits (an odd batch·kv_heads·tokens·head_dim/q_group_size at 4 bits: SmolLM2's 3 KV heads
at an odd length) the two slices differ by a row, broadcasting packs one row too many or too few, and
`Quantizer.dequantize` fails reshaping ("The size of tensor a (4) must match the size of tensor b (3)"); at
3 bits it cuts the unpacked rows at `shape[0]·shape[1] // group_size`, which for a 4-D state is not the row count.
A transformers `QuantizedLayer` re-quantizes its whole state at every flush, so at residual 0 every step hits
both lengths. `HQQAxis1Layer` hands hqq a 2-D (rows, q_group_size) tensor with zero rows appended up to a
multiple of the packing period (2 at 4 bits, 4 at 2, 8 at 1; none at 3 or 8 bits) and drops them after
de-quantizing: each group is quantized exactly as upstream quantizes it, the appended groups cost their packed
bytes and scale/zero (counted: at most 7 groups per state). Axis 0 groups across tokens and never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import HQQQuantizedLayer

from .registry import register_backend
from .transformers_layers import TransformersBackend

PACKING_ROWS = {1: 8, 2: 4, 4: 2}
"""Rows hqq packs together per bit width (`BitPack.pack_<n>bit_u8`); 3 bits pads itself, 8 bits packs nothing."""
UNPADDED_SHAPE = "unpadded_shape"
"""The meta key `HQQAxis1Layer` keeps the quantized state's own (batch, kv_heads, tokens, head_dim) shape in."""


class HQQAxis1Layer(HQQQuantizedLayer):
    """transformers' `HQQQuantizedLayer` whose axis-1 states are padded to hqq's packing period (see the module
    docstring); axis 0 is transformers' own. Same arguments as `HQQQuantizedLayer`."""

    def _quantize(self, tensor, axis):
        if axis != 1:
            return super()._quantize(tensor, axis)
        rows = tensor.reshape(-1, self.q_group_size)
        period = PACKING_ROWS.get(self.nbits, 1)
        padding = -rows.shape[0] % period
        if padding:
            rows = torch.cat([rows, rows.new_zeros(padding, rows.shape[1])])
        qtensor, meta = super()._quantize(rows, axis)
        meta[UNPADDED_SHAPE] = tensor.shape
        return qtensor, meta

    def _dequantize(self, qtensor):
        meta = qtensor[1]
        tensor = super()._dequantize(qtensor)
        if UNPADDED_SHAPE not in meta:
            return tensor
        shape = meta[UNPADDED_SHAPE]
        return tensor.reshape(-1)[:shape.numel()].reshape(shape)


@dataclass(frozen=True)
class HQQBackend(TransformersBackend):
    """transformers' hqq backend; its quantized shape is kept in the meta dict; an axis of 1 gets
    `HQQAxis1Layer`."""

    def make_layer(self, **kwargs):
        """`HQQAxis1Layer` when an axis is 1 (upstream fails at some lengths), else transformers' layer."""
        if 1 in (kwargs.get("axis_key", 0), kwargs.get("axis_value", 0)):
            return HQQAxis1Layer(**kwargs)
        return super().make_layer(**kwargs)

    def build_cache(self, config, knobs: dict):
        """transformers' `QuantizedCache` at axis 0; `HQQAxis1Layer`s in place of the full-attention layers when an
        axis is 1."""
        if 1 not in (knobs.get("axis_key", 0), knobs.get("axis_value", 0)):
            return super().build_cache(config, knobs)
        return super(TransformersBackend, self).build_cache(config, knobs)

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        """transformers' snippet at axis 0; at axis 1 the same layers built by hand from `HQQAxis1Layer`."""
        if 1 not in (knobs.get("axis_key", 0), knobs.get("axis_value", 0)):
            return super().cache_code(knobs)
        args = ", ".join(f"{key}={value!r}" for key, value in self.layer_kwargs(knobs).items())
        return (["from transformers import Cache, DynamicCache",
                 "from transformers.cache_utils import get_layer_types_and_kwargs",
                 "from kvlab.caches.quant.hqq import HQQAxis1Layer"],
                f"layer_types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))\n"
                f"# transformers' HQQQuantizedLayer at axis 1 fails whenever hqq's packing rows do not pair up; "
                f"HQQAxis1Layer pads them\n"
                f"cache = Cache(layers=[HQQAxis1Layer({args}) if kind == \"full_attention\" else layer\n"
                f"                      for kind, layer in zip(layer_types, DynamicCache(config=model.config).layers)])")

    def quantized_shape(self, layer) -> tuple[int, ...] | None:
        state = getattr(layer, "_quantized_keys", None)
        if isinstance(state, (tuple, list)) and len(state) > 1 and isinstance(state[1], dict):
            shape = state[1].get(UNPADDED_SHAPE, state[1].get("shape"))
            if shape is not None:
                return tuple(int(n) for n in shape)
        return super().quantized_shape(layer)


HQQ = register_backend(HQQBackend(
    name="hqq", pip="hqq", package="hqq", nbits=(1, 2, 3, 4, 8), default_nbits=4, axes=(0, 1),
    layer_name="HQQQuantizedLayer"))
