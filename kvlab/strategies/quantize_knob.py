"""The `quantize` knob of the scored-eviction strategies: which quantized layer holds what a prune kept.

Values: `none` (off), or a value a quantization backend answers to (`kvlab.caches.quant`, in registry order):
`quanto2`, `quanto4` (optimum-quanto, `q_group_size` 64), `hqq1` … `hqq8` (hqq, the bits hqq takes: 1, 2, 3,
4, 8), `fp8` (per tensor), `rotation_k<b>v<b>` (TurboQuant-MSE, keys and values at 1-4 bits each, e.g.
`rotation_k4v2`; `kvlab.caches.rotation_cache`). The layer keeps the newest `residual_length` tokens in full
precision, as `quantized` and `rotation_quantized` do. This module parses the knob and asks the backend for the
layers and their snippet; the pruning is `kvlab.eviction`'s.
"""

from __future__ import annotations

from .base import StrategyError
from .knob_yaml import shown

OFF = "none"


def allowed() -> str:
    """Every value the knob takes, for messages: `none, quanto2, quanto4, hqq1, ..., rotation_k<1-4>v<1-4> ...`."""
    from ..caches.quant import quantize_choices

    return f"{OFF}, {quantize_choices()}"


def parse(value):
    """(backend, layer knobs) for a `quantize` value, None for `none`: (the quanto backend, {"nbits": 4}),
    (fp8, {}), (rotation, {"key_bits": 4, "value_bits": 2}); the backend is a `kvlab.caches.quant.QuantBackend`.

    Raises:
        StrategyError: any other value (the message lists the allowed ones).
    """
    from ..caches.quant import parse_quantize

    text = str(value)
    if text == OFF:
        return None
    parsed = parse_quantize(text)
    if parsed is None:
        raise StrategyError(f"quantize must be one of {allowed()}; got {shown(value)}")
    return parsed


def describe(value) -> str:
    """`quanto int4`, `fp8`, `rotation k4/v2` ('' for none)."""
    parsed = parse(value)
    if parsed is None:
        return ""
    backend, knobs = parsed
    return backend.describe_quantize(knobs)


def unavailable_reason(value, config) -> str | None:
    """Why the quantized layer cannot hold this model's keys, or None (the backend's reason: e.g. quanto/hqq need
    head_dim divisible by their group size and their packages installed)."""
    parsed = parse(value)
    if parsed is None:
        return None
    backend, knobs = parsed
    return backend.quantize_unavailable_reason(str(value), knobs, config)


def layer_factory(value, config, residual_length: int):
    """A function returning a fresh quantized layer for `quantize=value` on `config`'s model, or None for none.
    Rotation layers of one factory share one rotation and codebook (`SharedTables`), as in one cache."""
    parsed = parse(value)
    if parsed is None:
        return None
    backend, knobs = parsed
    return backend.quantize_layer_factory(knobs, config, residual_length)


def cache_code(value, residual_length: int) -> tuple[list[str], str]:
    """(imports, lines building `cache`, a `PrunedCache` whose pruned layers are then quantized)."""
    backend, knobs = parse(value)
    imports, prelude, layer = backend.quantize_code(knobs, residual_length)
    comment = "  # each full-attention layer is pruned at prefill, then what it kept is quantized"
    return (["from kvlab.eviction.cache import PrunedCache", *imports],
            f"{prelude}cache = PrunedCache(model.config, quantized_layer={layer}){comment}")
