"""The llamacpp backend: keys and values stored as llama.cpp's KV cache stores them (`-ctk`/`-ctv`), kvlab's own
`GGMLQuantizedLayer` (`kvlab.caches.ggml_cache`; the formats and their sources: `kvlab.caches.ggml_blocks`).

Each token's key and value vectors are stored in ggml block types along head_dim (q8_0, q4_0, q4_1, iq4_nl,
q5_0, q5_1: 32 values per block, a float16 scale and, for the _1 types, a float16 minimum per block; or plain
f32, f16, bf16), bit for bit as ggml's reference quantization, Hadamard-rotated where llama.cpp rotates (quantized type,
head_dim divisible by 64; off with `attn_rot=false`, llama.cpp's `LLAMA_ATTN_ROT_DISABLE=1`). Bytes per token
and layer: kv_heads·head_dim/32·(type_size(type_k) + type_size(type_v)), e.g. 18 bytes per 32 values for q4_0,
34 for q8_0, and nothing else (llama.cpp keeps no full-precision part: `residual_length` 0 by default). Its knobs
are the `llamacpp_quantized` strategy's (`type_k`, `type_v`, `attn_rot`, `residual_length`, `sliding`), not
`quantized`'s; as a `quantize=` value it is a type for both (`q4_0`) or `<type_k>/<type_v>` (`q8_0/q4_0`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engines import ServingSetting
from ...engines.kv_types import engine_settings
from ...engines.settings import (LLAMA_ARGS, LLAMA_COMMIT, LLAMA_FLOAT_TYPES, LLAMA_QUANTIZED_TYPES, LLAMA_VERSION,
                                 SGLANG_MODEL_ARGS, SGLANG_VERSION, TRT_QUANT, TRT_VERSION, VLLM_CACHE, VLLM_VERSION)
from .base import QuantBackend
from .registry import register_backend

LLAMA_CPP_COMMIT = LLAMA_COMMIT
"""The llama.cpp commit whose KV cache the formats, the rotation and the serving note were read from (2026-10-01,
the one llama-cpp-python 0.3.36 vendors; PR #21038 added the rotation)."""
QUANTIZED_TYPES = LLAMA_QUANTIZED_TYPES
"""ggml block types a `quantize=` value names (`kvlab.caches.ggml_blocks.TYPES`)."""
PLAIN = LLAMA_FLOAT_TYPES
AGREEMENT = "docs/strategies.md#llamacpp_quantized-llamacpps-kv-cache-types"
MEASURED = {
    ("q4_0", "q4_0", True): f"kvlab 0.0427 against llama.cpp 0.0527 mean KL on the same 300 tokens ({AGREEMENT})",
    ("q4_0", "q4_0", False): f"kvlab 0.1131 against llama.cpp 0.1857 mean KL, rotation off ({AGREEMENT})",
    ("q8_0", "q8_0", True): (f"kvlab 0.00016 against llama.cpp 0.00439 mean KL, llama.cpp's kernel floor "
                             f"({AGREEMENT})"),
}
"""kvlab's layers against llama.cpp itself, each against its own dense run (type_k, type_v, rotation on)."""


def _bits(kind: str) -> int:
    """Bits per code of a cache type (16 for the plain ones but f32)."""
    from ..ggml_blocks import TYPES

    return TYPES[kind].bits if kind in TYPES else 32 if kind == "f32" else 16


@dataclass(frozen=True)
class LlamaCppBackend(QuantBackend):
    """llama.cpp's KV cache types; served by the `llamacpp_quantized` strategy."""

    def version(self) -> str:
        from ... import __version__

        return f"kvlab {__version__}, llama.cpp {LLAMA_CPP_COMMIT}'s formats"

    def layer_classes(self) -> tuple[type, ...]:
        from ..ggml_cache import GGMLQuantizedLayer

        return (GGMLQuantizedLayer,)

    def check_knobs(self, knobs: dict, defaults: dict) -> dict:
        """Types among llama.cpp's cache types, attn_rot a boolean, residual_length an integer >= 0, sliding
        `quantize` or `keep`."""
        from ..ggml_cache import SLIDING_CHOICES, check_knobs

        check_knobs(knobs["type_k"], knobs["type_v"], knobs["attn_rot"], knobs["residual_length"])
        if knobs["sliding"] not in SLIDING_CHOICES:
            raise ValueError(f"sliding must be one of {list(SLIDING_CHOICES)}, got {knobs['sliding']!r}")
        return {}

    def title(self, knobs: dict) -> str:
        return f"llama.cpp {knobs['type_k']}/{knobs['type_v']}"

    def caveat(self, knobs: dict) -> str:
        residual = knobs.get("residual_length", 0)
        kept = (f"; the newest decoded tokens wait in full precision until {residual} have gathered" if residual
                else ", the token being fed included, as llama.cpp writes a batch before attending to it")
        return f"every token's keys and values are stored in llama.cpp's types as they arrive{kept}"

    def warm_up_knobs(self, knobs: dict) -> dict:
        return {}

    def unavailable_reason(self, config, knobs: dict) -> str | None:
        """A block type needs head_dim divisible by 32 (llama.cpp refuses the same); nothing to store without a
        full-attention layer unless sliding layers are stored too."""
        from ..ggml_blocks import BLOCK, TYPES
        from ..hybrid import FULL_ATTENTION, head_dim_of, layer_types_of

        width = head_dim_of(config)
        blocked = [kind for kind in (knobs["type_k"], knobs["type_v"]) if kind in TYPES]
        if width is not None and blocked and width % BLOCK:
            return (f"llama.cpp's {blocked[0]} stores blocks of {BLOCK} values along head_dim; this model's head_dim "
                    f"({width}) is not a multiple of {BLOCK} (llama.cpp refuses it too)")
        types = set(layer_types_of(config))
        if FULL_ATTENTION not in types and not (knobs["sliding"] == "quantize" and "sliding_attention" in types):
            return f"this model has no full-attention layers to store (all its layers are {', '.join(sorted(types))})"
        return None

    def build_cache(self, config, knobs: dict):
        """A `GGMLQuantizedCache` (raises ValueError for knobs or a model it cannot take)."""
        from ..ggml_cache import GGMLQuantizedCache

        return GGMLQuantizedCache(config, **_cache_kwargs(knobs))

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        args = "".join(f", {key}={value!r}" for key, value in _cache_kwargs(knobs).items()
                       if key in ("type_k", "type_v") or value != {"attn_rot": True, "residual_length": 0,
                                                                   "sliding": "quantize"}[key])
        return ["from kvlab.caches.ggml_cache import GGMLQuantizedCache"], (
            f"cache = GGMLQuantizedCache(model.config{args})  # as llama.cpp's {_flags(knobs)}")

    # ----- quantize= -----

    def quantize_choices(self) -> str:
        return f"{', '.join(QUANTIZED_TYPES)} (llama.cpp's, K and V) or <type_k>/<type_v> (e.g. q8_0/q4_0)"

    def parse_quantize(self, text: str) -> dict | None:
        kinds = text.split("/")
        if len(kinds) == 1 and kinds[0] in QUANTIZED_TYPES:
            return {"type_k": kinds[0], "type_v": kinds[0]}
        allowed = QUANTIZED_TYPES + PLAIN
        if len(kinds) == 2 and all(kind in allowed for kind in kinds) and set(kinds) & set(QUANTIZED_TYPES):
            return {"type_k": kinds[0], "type_v": kinds[1]}
        return None

    def describe_quantize(self, knobs: dict) -> str:
        return self.title(knobs)

    def quantize_unavailable_reason(self, value: str, knobs: dict, config) -> str | None:
        return self.unavailable_reason(config, {**knobs, "sliding": "keep"})

    def quantize_layer_kwargs(self, knobs: dict, residual_length: int) -> dict:
        return {**knobs, "residual_length": residual_length}

    def quantize_code(self, knobs: dict, residual_length: int) -> tuple[list[str], str, str]:
        return (["from kvlab.caches.ggml_cache import GGMLQuantizedLayer"], "",
                f"lambda: GGMLQuantizedLayer(type_k={knobs['type_k']!r}, type_v={knobs['type_v']!r}, "
                f"residual_length={residual_length})")

    # ----- byte layout -----

    def split_state(self, state) -> tuple[list, list]:
        """A `Blocks`: its codes (`qs`, `qh`) are packed, its float16 scales and minimums the scales."""
        if not hasattr(state, "qs"):
            return super().split_state(state)
        return [state.qs, state.qh], [state.scales]

    def layer_parts(self, layer) -> dict[str, list]:
        """A state stored in a plain type (f16 ...) is keys/values, not packed; the rest as the default."""
        parts = super().layer_parts(layer)
        for name in ("_quantized_keys", "_quantized_values"):
            state = getattr(layer, name, None)
            if state is not None and not hasattr(state, "qs"):
                parts["packed"] = [item for item in parts["packed"] if item is not state]
                parts["keys_values"].append(state)
        return parts

    def held_tokens(self, layer) -> int:
        return layer.held_tokens()

    def quantized_shape(self, layer) -> tuple[int, ...] | None:
        state = getattr(layer, "_quantized_keys", None)
        if state is None:
            return None
        if hasattr(state, "qs"):
            return (*state.qs.shape[:3], state.values_per_row)
        return tuple(state.shape)

    def packing_period_elements(self, layer) -> int:
        from ..ggml_blocks import BLOCK

        return BLOCK

    # ----- serving -----

    def serving(self, knobs: dict) -> list[ServingSetting]:
        """llama.cpp: the same types (a quantized V needs flash attention: llama.cpp refuses it with `-fa off`),
        with the agreement kvlab measured against llama.cpp itself where it has one; the other engines: the
        type of theirs nearest in bits (`kvlab.engines.kv_types`), or their default for plain types."""
        kinds = (knobs.get("type_k", "q4_0"), knobs.get("type_v", "q4_0"))
        bits = max(_bits(kind) for kind in kinds)
        rotation = ("Hadamard-rotated when head_dim % 64 == 0, as here" if knobs.get("attn_rot", True)
                    else "rotation off, as attn_rot=false")
        v_note = ("; a quantized V needs -fa on: llama.cpp refuses it with -fa off" if kinds[1] in QUANTIZED_TYPES
                  else "")
        llama = ServingSetting("llama.cpp", _flags(knobs), LLAMA_VERSION, LLAMA_ARGS,
                               f"the same format, block for block; {rotation}{v_note}",
                               MEASURED.get((*kinds, bool(knobs.get("attn_rot", True))), ""))
        if bits >= 16:
            plain = "the model's dtype, unquantized, as llama.cpp's plain types"
            return [ServingSetting("vLLM", "--kv-cache-dtype auto", VLLM_VERSION, VLLM_CACHE, plain),
                    ServingSetting("SGLang", "--kv-cache-dtype auto", SGLANG_VERSION, SGLANG_MODEL_ARGS, plain),
                    ServingSetting("TensorRT-LLM", 'KvCacheConfig(dtype="auto")', TRT_VERSION, TRT_QUANT, plain),
                    llama]
        return [*engine_settings(bits, f"llama.cpp's {kinds[0]}/{kinds[1]} blocks of 32 with an fp16 scale each"),
                llama]


def _flags(knobs: dict) -> str:
    """`llama-server -ctk q4_0 -ctv q4_0 -fa on` for these knobs (`LLAMA_ATTN_ROT_DISABLE=1 ` before it when the
    rotation is off)."""
    prefix = "" if knobs.get("attn_rot", True) else "LLAMA_ATTN_ROT_DISABLE=1 "
    return f"{prefix}llama-server -ctk {knobs.get('type_k', 'q4_0')} -ctv {knobs.get('type_v', 'q4_0')} -fa on"


def _cache_kwargs(knobs: dict) -> dict:
    return {name: knobs[name] for name in ("type_k", "type_v", "attn_rot", "residual_length", "sliding")}


LLAMACPP = register_backend(LlamaCppBackend(name="llamacpp", in_quantized=False))
