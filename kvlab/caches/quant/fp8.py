"""The fp8 backend: every token's keys and values in float8 with one scale per tensor, transformers'
`Fp8QuantizedLayer`.

Per tensor: it takes none of the group knobs (`residual_length`, `q_group_size`, the axes) and no package beyond
transformers; its state is a (float8 data, scale) pair. As a `quantize=` value it is just `fp8`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engines import ServingSetting
from ...engines.kv_types import llama_setting
from ...engines.settings import (SGLANG_MODEL_ARGS, SGLANG_VERSION, TRT_QUANT, TRT_VERSION, VLLM_CACHE,
                                 VLLM_VERSION)
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

    def serving(self, knobs: dict) -> list[ServingSetting]:
        """Each engine's fp8 type, one scale per tensor as here; llama.cpp's q8_0 (8-bit integers in blocks of
        32, the nearest it ships: its type list has no fp8)."""
        what = "kvlab's fp8 with one scale per tensor"
        return [ServingSetting("vLLM", "--kv-cache-dtype fp8", VLLM_VERSION, VLLM_CACHE,
                               "fp8 (e4m3) with a per-tensor scale, as here"),
                ServingSetting("SGLang", "--kv-cache-dtype fp8_e4m3", SGLANG_VERSION, SGLANG_MODEL_ARGS,
                               "fp8 (e4m3) with a per-tensor scale, as here"),
                ServingSetting("TensorRT-LLM", 'KvCacheConfig(dtype="fp8")', TRT_VERSION, TRT_QUANT,
                               "fp8 with a per-tensor scale, as here"),
                llama_setting("q8_0", "q8_0", f"no fp8 type: 8-bit integers in blocks of 32 with one fp16 scale "
                                              f"each are the nearest, against {what}")]


FP8 = register_backend(Fp8Backend(
    name="fp8", nbits=(8,), default_nbits=8, takes=(), granularity="per tensor",
    layer_name="Fp8QuantizedLayer"))
