"""The fp8 backend: every token's keys and values in float8 with one scale per tensor, transformers'
`Fp8QuantizedLayer`.

Per tensor: it takes none of the group knobs (`residual_length`, `q_group_size`, the axes) and no package beyond
transformers; its state is a (float8 data, scale) pair. As a `quantize=` value it is just `fp8`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import register_backend
from .transformers_layers import TransformersBackend


@dataclass(frozen=True)
class Fp8Backend(TransformersBackend):
    """transformers' fp8 backend: one value of bits, no groups."""

    def caveat(self, knobs: dict) -> str:
        return "fp8: every token stored in 8 bits with one scale per tensor"

    def quantize_choices(self) -> str:
        return self.name

    def parse_quantize(self, text: str) -> dict | None:
        return {} if text == self.name else None

    def describe_quantize(self, knobs: dict) -> str:
        return self.name

    def tensorrt_kv_dtype(self, nbits: int) -> str:
        return "fp8"


FP8 = register_backend(Fp8Backend(
    name="fp8", nbits=(8,), default_nbits=8, takes=(), granularity="per tensor",
    layer_name="Fp8QuantizedLayer"))
