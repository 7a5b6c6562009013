"""The vllm backend: vLLM's `--kv-cache-dtype` formats, one to one: the TurboQuant presets `turboquant_k8v4`,
`turboquant_4bit_nc`, `turboquant_k3v4_nc`, `turboquant_3bit_nc` and `int4_per_token_head`
(`kvlab.caches.vllm_turboquant`, `kvlab.caches.vllm_int4`, layers and cache in `kvlab.caches.vllm_cache`).

Followed from vLLM's own code (github.com/vllm-project/vllm, files at these commits):
- `vllm/model_executor/layers/quantization/turboquant/config.py` @ 1471680b24719d9d3b2fe1235878196142af89cc:
  `TQ_PRESETS` (key bits 8/4/3/3, value bits 4/4/4/3, norm correction off/on/on/on), `key_packed_size`,
  `value_packed_size`, `slot_size_aligned`, `get_boundary_skip_layers` (first and last 2 layers of a dense
  model unquantized), QJL omitted, and the cost figures its docstring states (2.6× / +1.17 % PPL, 3.8× /
  +2.71 %, ~3.5× / +10.63 %, 4.9× / +20.59 %);
- `.../turboquant/centroids.py` @ 4a9f0a66010761a0a99bc8501199e5eac846f5ca: Lloyd-Max for N(0, 1/d);
- `vllm/v1/attention/backends/turboquant_attn.py` and `vllm/v1/attention/ops/triton_turboquant_store.py` @
  0135d081c30fa476130ae77a152539ce317ab8b1: one orthonormal Hadamard rotation for every layer, no random signs;
  prefill attends to the raw keys and values; the store kernels' bit layout, norms and uniform value codes;
- `vllm/v1/attention/ops/triton_turboquant_decode.py` @ 055e47c28003156421365af985d676fc921cb075: the norm
  correction (centroid vector divided by its norm before the inverse rotation) and the dequantization;
- `vllm/model_executor/layers/attention/attention.py` @ 0014ca6b9929614f1b72c4bb11e5238de49cba89 and
  `vllm/v1/kv_cache_interface.py` @ 001cabc1be16a59a70d720ed61a13b678c060a18: a TurboQuant layer's page is
  block_size · num_kv_heads · slot_size_aligned bytes (`TQFullAttentionSpec`); a skipped layer is `auto`;
- `vllm/v1/attention/ops/int4_per_token_head.py` @ a7f284a2e24b86c171ef714c5ff492acf0baee6d: the randomized
  Hadamard transform, the asymmetric 4-bit codes, the zero point in the float32 scale's low mantissa bits.

Bytes per token (`vllm_bytes_per_token`): Σ over layers of num_kv_heads · slot_size_aligned for a TurboQuant
layer, num_kv_heads · (head_dim + 8) for an int4 one, 2 · num_kv_heads · head_dim · element_size for a boundary
(or, TurboQuant on Gemma 3, sliding) layer; the tables (rotation, codebooks, signs) are counted once per cache.
Its knobs are the `vllm_kv_cache` strategy's; as a `quantize=` value it is the flag's value (every layer the
eviction keeps is encoded; no boundary layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...engines import ENGINES, ServingSetting
from ...engines.settings import LLAMA_SERVER, LLAMA_VERSION, VLLM_INT4_SOURCE, VLLM_TQ_SOURCE
from ..vllm_int4 import KV_CACHE_DTYPE as INT4
from ..vllm_turboquant import PRESETS, ROTATIONS, VALUE_CODES, SlotFormat, is_power_of_two
from .base import QuantBackend
from .registry import register_backend

KV_CACHE_DTYPES = (*PRESETS, INT4)
DEFAULTS = {"kv_cache_dtype": "turboquant_4bit_nc", "values": "uniform", "norm_correction": None, "qjl": False,
            "rotation": "hadamard", "boundary_layers": None}
"""The `vllm_kv_cache` strategy's knobs and defaults (None: as the preset says)."""
VLLM_COST = {"turboquant_k8v4": ("2.6×", "+1.17 %"), "turboquant_4bit_nc": ("3.8×", "+2.71 %"),
             "turboquant_k3v4_nc": ("~3.5×", "+10.63 %"), "turboquant_3bit_nc": ("4.9×", "+20.59 %")}
"""vLLM's own cost figure per preset (compression, PPL increase), from its `TurboQuantConfig` docstring."""
VLLM_VERSION = "0.34"
MIN_HEAD_DIM = 8
TURBOQUANT_ONLY = ("values", "norm_correction", "qjl", "rotation")


def full_knobs(knobs: dict) -> dict:
    """`knobs` with every missing one at its default."""
    return {**DEFAULTS, **{name: value for name, value in knobs.items() if name in DEFAULTS}}


def slot_format(knobs: dict, head_dim: int) -> SlotFormat:
    """The TurboQuant slot these knobs give for head_dim (the preset's bits; its norm correction unless set)."""
    key_bits, value_bits, correction = PRESETS[knobs["kv_cache_dtype"]]
    correction = correction if knobs["norm_correction"] is None else bool(knobs["norm_correction"])
    return SlotFormat(head_dim, key_bits, value_bits, correction, knobs["values"], bool(knobs["qjl"]), knobs["rotation"])


def boundary_layers(knobs: dict) -> int:
    """Layers kept in the model's dtype at each end: the knob, else vLLM's 2 for TurboQuant and 0 for int4."""
    from ..vllm_cache import BOUNDARY_LAYERS

    if knobs["boundary_layers"] is not None:
        return knobs["boundary_layers"]
    return 0 if knobs["kv_cache_dtype"] == INT4 else BOUNDARY_LAYERS


def make_codec(knobs: dict, head_dim: int):
    """The codec of these (checked) knobs for head_dim, on the CPU."""
    from ..vllm_int4 import Int4PerTokenHeadCodec
    from ..vllm_turboquant import TurboQuantCodec

    if knobs["kv_cache_dtype"] == INT4:
        return Int4PerTokenHeadCodec(head_dim)
    return TurboQuantCodec(slot_format(knobs, head_dim))


def _hadamard_width(width: int) -> bool:
    return is_power_of_two(width) and width >= MIN_HEAD_DIM


def _text_config(config):
    from ...models.loading import head_dim

    cfg = config.get_text_config(decoder=True)
    return cfg, head_dim(cfg), getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads


def vllm_bytes_per_token(config, knobs: dict, element_size: int) -> int:
    """vLLM's formula: bytes one token adds to the cache of `config`'s model (its full-attention and, for int4,
    sliding layers; a sliding layer the preset keeps, and every boundary layer, at `element_size` per value)."""
    from ..hybrid import FULL_ATTENTION, layer_types_of
    from ..vllm_cache import boundary_indices

    knobs = full_knobs(knobs)
    _, width, heads = _text_config(config)
    types = layer_types_of(config)
    skipped = set(boundary_indices(len(types), boundary_layers(knobs)))
    encoded = (heads * (width + 8) if knobs["kv_cache_dtype"] == INT4
               else heads * slot_format(knobs, width).slot_size_aligned)
    encodes = {FULL_ATTENTION} | ({"sliding_attention"} if knobs["kv_cache_dtype"] == INT4 else set())
    return sum(encoded if index not in skipped and kind in encodes else 2 * heads * width * element_size
               for index, kind in enumerate(types))


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed or isinstance(value, bool) != isinstance(next(iter(allowed)), bool):
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def check_vllm_knobs(knobs: dict) -> None:
    """Raise ValueError naming the allowed values unless the knobs make a format vLLM's code or the paper has."""
    _check_choice("kv_cache_dtype", knobs["kv_cache_dtype"], KV_CACHE_DTYPES)
    _check_choice("values", knobs["values"], VALUE_CODES)
    _check_choice("rotation", knobs["rotation"], ROTATIONS)
    _check_choice("qjl", knobs["qjl"], (False, True))
    if knobs["norm_correction"] is not None:
        _check_choice("norm_correction", knobs["norm_correction"], (False, True))
    count = knobs["boundary_layers"]
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise ValueError(f"boundary_layers must be an integer >= 0 (or empty: the preset's), got {count!r}")
    changed = [name for name in TURBOQUANT_ONLY if knobs[name] != DEFAULTS[name]]
    if knobs["kv_cache_dtype"] == INT4 and changed:
        raise ValueError(f"{INT4} takes no {', '.join(changed)}: those knobs are the TurboQuant presets' "
                         f"({', '.join(PRESETS)})")
    fp8_keys = PRESETS.get(knobs["kv_cache_dtype"], (0,))[0] == 8
    if fp8_keys and knobs["qjl"]:
        raise ValueError(f"qjl=true splits Lloyd-Max key bits; {knobs['kv_cache_dtype']} stores float8 keys: use "
                         f"{', '.join(name for name, preset in PRESETS.items() if preset[0] != 8)}")
    coded = [name for name in ("norm_correction", "rotation") if knobs[name] not in (None, False, "hadamard")]
    if fp8_keys and knobs["values"] == "uniform" and coded:
        raise ValueError(f"{', '.join(coded)} only acts on Lloyd-Max codes, and {knobs['kv_cache_dtype']} with "
                         "values=uniform has none (float8 keys): set values=lloyd_max or pick another preset")


@dataclass(frozen=True)
class VllmBackend(QuantBackend):
    """vLLM's KV-cache formats; served by the `vllm_kv_cache` strategy."""

    def version(self) -> str:
        from ... import __version__

        return f"kvlab {__version__} (vLLM {VLLM_VERSION} formats)"

    def layer_classes(self) -> tuple[type, ...]:
        from ..vllm_cache import VllmKVLayer

        return (VllmKVLayer,)

    def check_knobs(self, knobs: dict, defaults: dict) -> dict:
        check_vllm_knobs(full_knobs(knobs))
        return {}

    def title(self, knobs: dict) -> str:
        return f"vLLM {knobs['kv_cache_dtype']}"

    def caveat(self, knobs: dict) -> str:
        knobs = full_knobs(knobs)
        ends = boundary_layers(knobs)
        kept = f"; the first and last {ends} layers keep the model's dtype (vLLM's boundary layers)" if ends else ""
        return ("the prompt is attended exactly at prefill (vLLM's first prefill chunk) and stored encoded; every "
                f"later token reads all keys and values decoded, its own too{kept}")

    def warm_up_knobs(self, knobs: dict) -> dict:
        return {}

    def unavailable_reason(self, config, knobs: dict) -> str | None:
        """head_dim not a power of two (>= MIN_HEAD_DIM), no full-attention layer, or nothing left to encode (a
        config that does not state head_dim is not refused for it)."""
        from ..hybrid import FULL_ATTENTION, head_dim_of, layer_types_of
        from ..vllm_cache import boundary_indices

        knobs = full_knobs(knobs)
        width = head_dim_of(config)
        if width is not None and not _hadamard_width(width):
            return (f"{knobs['kv_cache_dtype']} rotates by a Hadamard matrix, which needs a power-of-two head_dim "
                    f">= {MIN_HEAD_DIM}; this model's is {width}")
        types = layer_types_of(config)
        if FULL_ATTENTION not in types:
            return f"this model has no full-attention layers to quantize (its layers: {sorted(set(types))})"
        skipped = boundary_indices(len(types), boundary_layers(knobs))
        if len(skipped) == len(types):
            return (f"boundary_layers={boundary_layers(knobs)} keeps all {len(types)} layers of this model in its "
                    "dtype (vLLM's first and last layers); nothing is quantized: set boundary_layers=0")
        return None

    def build_cache(self, config, knobs: dict):
        """The cache vLLM holds under these knobs (`kvlab.caches.vllm_cache.build_vllm_cache`)."""
        return vllm_kv_cache(config, **full_knobs(knobs))

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        knobs = full_knobs(knobs)
        extra = "".join(f", {name}={value!r}" for name, value in knobs.items()
                        if name != "kv_cache_dtype" and value != DEFAULTS[name])
        return (["from kvlab.caches.quant.vllm import vllm_kv_cache"],
                f"cache = vllm_kv_cache(model.config, {knobs['kv_cache_dtype']!r}{extra})"
                f"  # vLLM --kv-cache-dtype {knobs['kv_cache_dtype']}")

    # ----- the `quantize=` knob -----

    def quantize_choices(self) -> str:
        return ", ".join(KV_CACHE_DTYPES)

    def parse_quantize(self, text: str) -> dict | None:
        return {"kv_cache_dtype": text} if text in KV_CACHE_DTYPES else None

    def describe_quantize(self, knobs: dict) -> str:
        return knobs["kv_cache_dtype"]

    def quantize_unavailable_reason(self, value: str, knobs: dict, config) -> str | None:
        from ..hybrid import head_dim_of

        width = head_dim_of(config)
        if width is not None and not _hadamard_width(width):
            return f"quantize={value} needs a power-of-two head_dim >= {MIN_HEAD_DIM}; this model's is {width}"
        return None

    def quantize_layer_factory(self, knobs: dict, config, residual_length: int):
        """Layers of one factory share one codec (no residual: `residual_length` does not apply)."""
        from ..vllm_cache import SharedCodec, VllmKVLayer

        knobs = full_knobs(knobs)
        shared = SharedCodec(make_codec(knobs, _text_config(config)[1]))
        return lambda: VllmKVLayer(shared, knobs["kv_cache_dtype"])

    def quantize_code(self, knobs: dict, residual_length: int) -> tuple[list[str], str, str]:
        dtype = knobs["kv_cache_dtype"]
        return (["from kvlab.caches.quant.vllm import shared_codec", "from kvlab.caches.vllm_cache import VllmKVLayer"],
                f"shared = shared_codec(model.config, {dtype!r})  # one codec for every layer\n",
                f"lambda: VllmKVLayer(shared, {dtype!r})")

    # ----- byte layout -----

    def layer_parts(self, layer) -> dict[str, list]:
        """The codec's split of the encoded tokens (codes `packed`, norms/scales `scales`, alignment `other`), the
        empty `keys`/`values` as `residual`, the shared tables and anything else `other`."""
        parts: dict[str, list] = {"keys_values": [], "packed": [], "scales": [], "residual": [], "other": []}
        for name, value in vars(layer).items():
            if name == "_quantized_keys" and value is not None:
                for kind, views in layer.codec.parts(value).items():
                    parts[kind] += views
            elif name in ("keys", "values"):
                parts["residual"].append(value)
            else:
                parts["other"].append(value)
        return parts

    def held_tokens(self, layer) -> int:
        return layer.held_tokens()

    def residual_tokens(self, layer) -> int:
        return 0

    def quantized_shape(self, layer) -> tuple[int, ...] | None:
        state = getattr(layer, "state", None)
        if state is None:
            return None
        return (*next(iter(state.values())).shape[:3], layer.codec.head_dim)

    def residual_length(self, layer) -> int | None:
        return None

    def packing_period_elements(self, layer) -> int:
        """Every vector is encoded on its own: the bytes repeat every head_dim values."""
        codec = getattr(layer, "codec", None)
        return codec.head_dim if codec is not None else 1

    def shared_tensors(self, layer):
        return getattr(layer, "shared_tables", None)

    # ----- serving -----

    def serving(self, knobs: dict) -> list[ServingSetting]:
        """vLLM's flag itself (and `--kv-cache-dtype-skip-layers` for extra boundary layers), with vLLM's own cost
        figure; what vLLM does not offer (the paper's knobs, fewer boundary layers) is said in the note."""
        knobs = full_knobs(knobs)
        return [_vllm_setting(knobs), *_other_engines(knobs["kv_cache_dtype"])]


def _vllm_setting(knobs: dict) -> ServingSetting:
    dtype = knobs["kv_cache_dtype"]
    ends, preset_ends = boundary_layers(knobs), boundary_layers({**knobs, "boundary_layers": None})
    setting = f"--kv-cache-dtype {dtype}"
    if ends > preset_ends:
        setting += f" --kv-cache-dtype-skip-layers <first and last {ends}>"
    paper = [f"{name}={str(knobs[name]).lower()}" for name in TURBOQUANT_ONLY if knobs[name] != DEFAULTS[name]]
    cost = VLLM_COST.get(dtype)
    notes = [f"vLLM's own figure: {cost[0]} smaller, {cost[1]} PPL" if cost else
             "dynamic per-token-head scales after a randomized Hadamard transform, as kvlab's"]
    if paper:
        notes.append(f"vLLM has no {', '.join(paper)}: the flag gives vLLM's own choice")
    if ends < preset_ends:
        notes.append(f"vLLM always keeps the first and last {preset_ends} layers unquantized")
    source = VLLM_INT4_SOURCE if dtype == INT4 else VLLM_TQ_SOURCE
    return ServingSetting("vLLM", setting, VLLM_VERSION, source, "; ".join(notes))


def _other_engines(dtype: str) -> list[ServingSetting]:
    if dtype != INT4:
        other = "no rotation-quantized KV type in the options checked; its plain fp8 / q4_0 cache types are the nearest"
        return [ServingSetting(engine, None, note=other) for engine in ENGINES[1:]]
    other = "no 4-bit integer KV type with per-token-head scales in the options checked"
    return [ServingSetting("SGLang", None, note=other), ServingSetting("TensorRT-LLM", None, note=other),
            ServingSetting("llama.cpp", "--cache-type-k q4_0 --cache-type-v q4_0 -fa on", LLAMA_VERSION, LLAMA_SERVER,
                           "also Hadamard-rotated when head_dim % 64 == 0, but one fp16 scale per 32 values and no "
                           "zero point")]


def vllm_kv_cache(config, kv_cache_dtype: str = DEFAULTS["kv_cache_dtype"], **knobs):
    """The cache vLLM holds for `config`'s model under `--kv-cache-dtype kv_cache_dtype` (and the paper's knobs:
    `values`, `norm_correction`, `qjl`, `rotation`, `boundary_layers`; see `kvlab.caches.vllm_turboquant`).

    Raises:
        ValueError: a knob out of range (the message lists the allowed values), or a model it cannot serve.
    """
    from ..vllm_cache import SharedCodec, build_vllm_cache

    unknown = sorted(set(knobs) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; allowed: {sorted(set(DEFAULTS) - {'kv_cache_dtype'})}")
    full = full_knobs({**knobs, "kv_cache_dtype": kv_cache_dtype})
    check_vllm_knobs(full)
    reason = VLLM.unavailable_reason(config, full)
    if reason:
        raise ValueError(reason)
    shared = SharedCodec(make_codec(full, _text_config(config)[1]))
    return build_vllm_cache(config, shared, kv_cache_dtype, boundary_layers(full), encode_sliding=kv_cache_dtype == INT4)


def shared_codec(config, kv_cache_dtype: str, **knobs):
    """One `SharedCodec` for `config`'s head_dim under these knobs (the layers of an eviction's `quantize=`)."""
    from ..vllm_cache import SharedCodec

    full = full_knobs({**knobs, "kv_cache_dtype": kv_cache_dtype})
    check_vllm_knobs(full)
    return SharedCodec(make_codec(full, _text_config(config)[1]))


VLLM = register_backend(VllmBackend(name="vllm", in_quantized=False, takes=(), granularity="per token and KV head"))
