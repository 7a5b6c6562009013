"""The rotation backend: TurboQuant-MSE (Zandieh et al., arXiv 2504.19874, Algorithm 1), kvlab's own
`RotationQuantizedLayer` (`kvlab.caches.rotation_cache`) on transformers' `QuantizedLayer` residual.

Each key and value vector is stored as its float16 norm (scales) and, per coordinate of the randomly rotated unit
vector, a `key_bits`/`value_bits` Lloyd-Max code (packed); the newest `residual_length` tokens wait in full
precision. One float32 rotation and the codebooks serve every layer of a cache: the first layer to use them lists
them in `shared_tables` (`shared_tensors`), counted once per cache, under `other`. Its knobs are the
`rotation_quantized` strategy's (`key_bits`, `value_bits`, `residual_length`, `seed`, `sliding`), not
`quantized`'s; as a `quantize=` value it is `rotation_k<b>v<b>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...engines import ServingSetting
from ...engines.kv_types import engine_settings, llama_setting, llama_type
from ...engines.settings import MEASURED_LLAMACPP
from .base import QuantBackend
from .registry import register_backend

QUANTIZE_VALUE = re.compile(r"rotation_k([1-4])v([1-4])")
TURBOQUANT_TYPES = {(4, 4): "turboquant_4bit_nc", (3, 3): "turboquant_3bit_nc", (3, 4): "turboquant_k3v4_nc",
                    (8, 4): "turboquant_k8v4"}
"""vLLM's TurboQuant `--kv-cache-dtype` values by (key bits, value bits) (the vLLM blog of 2026-05-11)."""


@dataclass(frozen=True)
class RotationBackend(QuantBackend):
    """TurboQuant-MSE rotation quantization; served by the `rotation_quantized` strategy."""

    def version(self) -> str:
        from ... import __version__

        return f"kvlab {__version__}"

    def layer_classes(self) -> tuple[type, ...]:
        from ..rotation_cache import RotationQuantizedLayer

        return (RotationQuantizedLayer,)

    def check_knobs(self, knobs: dict, defaults: dict) -> dict:
        """Bits 1-4 each, residual_length and seed integers >= 0, sliding `keep` or `quantize`."""
        from ..rotation_cache import SLIDING_CHOICES, check_knobs

        check_knobs(knobs["key_bits"], knobs["value_bits"], knobs["residual_length"], knobs["seed"])
        if knobs["sliding"] not in SLIDING_CHOICES:
            raise ValueError(f"sliding must be one of {list(SLIDING_CHOICES)}, got {knobs['sliding']!r}")
        return {}

    def title(self, knobs: dict) -> str:
        return f"rotation k{knobs['key_bits']}/v{knobs['value_bits']} r{knobs['residual_length']}"

    def caveat(self, knobs: dict) -> str:
        return (f"the prompt is quantized at prefill; then up to residual_length={knobs['residual_length']} new "
                "tokens wait in full precision before being quantized")

    def warm_up_knobs(self, knobs: dict) -> dict:
        return {}

    def unavailable_reason(self, config, knobs: dict) -> str | None:
        """head_dim below the codebooks' minimum, or nothing to quantize (no full-attention layer, and the
        sliding ones kept unless `sliding: quantize`)."""
        from ..hybrid import FULL_ATTENTION, head_dim_of, layer_types_of
        from ..lloyd_max import MIN_HEAD_DIM

        width = head_dim_of(config)
        if width is not None and width < MIN_HEAD_DIM:
            return f"rotation quantization needs head_dim >= {MIN_HEAD_DIM}; this model's is {width}"
        types = set(layer_types_of(config))
        if FULL_ATTENTION not in types and not (knobs["sliding"] == "quantize" and "sliding_attention" in types):
            return (f"this model has no full-attention layers to quantize (all its layers are "
                    f"{', '.join(sorted(set(layer_types_of(config))))})")
        return None

    def build_cache(self, config, knobs: dict):
        """A `RotationQuantizedCache` (raises ValueError for knobs or a model it cannot take)."""
        from ..rotation_cache import RotationQuantizedCache

        return RotationQuantizedCache(config, key_bits=knobs["key_bits"], value_bits=knobs["value_bits"],
                                      residual_length=knobs["residual_length"], seed=knobs["seed"],
                                      sliding=knobs["sliding"])

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        return ["from kvlab.caches.rotation_cache import RotationQuantizedCache"], (
            f"cache = RotationQuantizedCache(model.config, key_bits={knobs['key_bits']}, "
            f"value_bits={knobs['value_bits']}, residual_length={knobs['residual_length']}, seed={knobs['seed']}"
            + (f", sliding={knobs['sliding']!r}" if knobs["sliding"] != "keep" else "")
            + ")  # TurboQuant-MSE, arXiv 2504.19874")

    def quantize_choices(self) -> str:
        return "rotation_k<1-4>v<1-4> (e.g. rotation_k4v2)"

    def parse_quantize(self, text: str) -> dict | None:
        match = QUANTIZE_VALUE.fullmatch(text)
        return {"key_bits": int(match[1]), "value_bits": int(match[2])} if match else None

    def describe_quantize(self, knobs: dict) -> str:
        return f"rotation k{knobs['key_bits']}/v{knobs['value_bits']}"

    def quantize_unavailable_reason(self, value: str, knobs: dict, config) -> str | None:
        return None

    def quantize_layer_factory(self, knobs: dict, config, residual_length: int):
        """Layers of one factory share one rotation and codebook (`SharedTables`), as in one cache."""
        from ...models.loading import head_dim
        from ..rotation_cache import RotationQuantizedLayer, SharedTables

        tables = SharedTables(head_dim(config.get_text_config(decoder=True)), knobs["key_bits"],
                              knobs["value_bits"], 0)
        return lambda: RotationQuantizedLayer(tables, residual_length=residual_length, **knobs)

    def quantize_code(self, knobs: dict, residual_length: int) -> tuple[list[str], str, str]:
        bits = f"key_bits={knobs['key_bits']}, value_bits={knobs['value_bits']}"
        return (["from kvlab.caches.rotation_cache import RotationQuantizedLayer, SharedTables"],
                f"tables = SharedTables(model.config.head_dim, {knobs['key_bits']}, {knobs['value_bits']}, "
                f"0)  # one rotation and codebook for every layer\n",
                f"lambda: RotationQuantizedLayer(tables, {bits}, residual_length={residual_length})")

    def split_state(self, state) -> tuple[list, list]:
        """A `PackedVectors`: its bit-packed codes are packed, its float16 norms the scales."""
        if not hasattr(state, "indices"):
            return super().split_state(state)
        return [state.indices], [state.norms]

    def shared_tensors(self, layer):
        return getattr(layer, "shared_tables", None)

    def serving(self, knobs: dict) -> list[ServingSetting]:
        """vLLM's TurboQuant `--kv-cache-dtype` of these bits (the 4-bit one for a pair it has no preset for);
        SGLang and TensorRT-LLM: their 4-bit float type (fp8 above 4 bits), no rotation; llama.cpp: its block
        types for the key and value bits, Hadamard-rotated as every quantized llama.cpp KV cache is."""
        bits = (int(knobs.get("key_bits", 4)), int(knobs.get("value_bits", 4)))
        dtype = TURBOQUANT_TYPES.get(bits, "turboquant_4bit_nc")
        what = f"kvlab's rotated k{bits[0]}/v{bits[1]} Lloyd-Max codes"
        vllm_note = ("vLLM's TurboQuant: a Hadamard rotation, Lloyd-Max key codes (fp8 keys for k8), uniform "
                     "value codes and a norm correction; kvlab's vllm_kv_cache is that preset one to one"
                     if bits in TURBOQUANT_TYPES else
                     f"no k{bits[0]}/v{bits[1]} preset: 4-bit keys and values is the nearest")
        type_k, type_v = llama_type(bits[0]), llama_type(bits[1])
        rotated = ("Hadamard-rotated when head_dim % 64 == 0, as here, then uniform codes in blocks of 32 with one "
                   "fp16 scale each, not Lloyd-Max codes and a norm")
        lower = [f"{name} {b}-bit" for name, b in zip(("K", "V"), bits) if b < 4]
        llama_note = (f"no {' / '.join(lower)} type: q4_0 is the nearest; " if lower else "") + rotated
        return [*engine_settings(max(bits), what, (dtype, vllm_note)),
                llama_setting(type_k, type_v, llama_note, MEASURED_LLAMACPP if (type_k, type_v) == ("q4_0", "q4_0")
                              else "")]


ROTATION = register_backend(RotationBackend(name="rotation", in_quantized=False))
