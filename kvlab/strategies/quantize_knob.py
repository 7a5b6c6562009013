"""The `quantize` knob of the scored-eviction strategies: which quantized layer holds what a prune kept.

Values: `none` (off), `quanto2`, `quanto4` (optimum-quanto, `q_group_size` 64), `hqq1` … `hqq8` (hqq, the bits
hqq takes: 1, 2, 3, 4, 8), `fp8` (per tensor), `rotation_k<b>v<b>` (TurboQuant-MSE, keys and values at 1-4 bits
each, e.g. `rotation_k4v2`; `kvlab.caches.rotation_cache`). The layer keeps the newest `residual_length` tokens in
full precision, as `quantized` and `rotation_quantized` do. This module parses the knob and makes the layers
and their snippet; the pruning is `kvlab.eviction`'s.
"""

from __future__ import annotations

import re

from .base import StrategyError

OFF = "none"
GROUP_SIZE = 64
"""quanto's and hqq's `q_group_size` here (transformers' default)."""
BACKEND_BITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}
ROTATION = re.compile(r"rotation_k([1-4])v([1-4])")
ALLOWED = "none, quanto2, quanto4, hqq1, hqq2, hqq3, hqq4, hqq8, fp8, rotation_k<1-4>v<1-4> (e.g. rotation_k4v2)"


def parse(value) -> tuple[str, dict] | None:
    """(backend, layer knobs) for a `quantize` value, None for `none`: ("quanto", {"nbits": 4}),
    ("fp8", {}), ("rotation", {"key_bits": 4, "value_bits": 2}).

    Raises:
        StrategyError: any other value (the message lists the allowed ones).
    """
    text = str(value)
    if text == OFF:
        return None
    if text == "fp8":
        return "fp8", {}
    rotation = ROTATION.fullmatch(text)
    if rotation:
        return "rotation", {"key_bits": int(rotation[1]), "value_bits": int(rotation[2])}
    for backend, bits in BACKEND_BITS.items():
        if text.startswith(backend) and text[len(backend):] in {str(b) for b in bits}:
            return backend, {"nbits": int(text[len(backend):])}
    raise StrategyError(f"quantize must be one of {ALLOWED}; got {value!r}")


def describe(value) -> str:
    """`quanto int4`, `fp8`, `rotation k4/v2` ('' for none)."""
    parsed = parse(value)
    if parsed is None:
        return ""
    backend, knobs = parsed
    if backend == "rotation":
        return f"rotation k{knobs['key_bits']}/v{knobs['value_bits']}"
    return backend if backend == "fp8" else f"{backend} int{knobs['nbits']}"


def unavailable_reason(value, config) -> str | None:
    """Why the quantized layer cannot hold this model's keys, or None (quanto/hqq need head_dim divisible by
    GROUP_SIZE; their packages must be installed)."""
    import importlib.util

    from ..caches.hybrid import head_dim_of

    parsed = parse(value)
    if parsed is None or parsed[0] in ("fp8", "rotation"):
        return None
    package = {"quanto": "optimum.quanto", "hqq": "hqq"}[parsed[0]]
    try:
        installed = importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:
        installed = False
    if not installed:
        return f"quantize={value} needs the `{package}` package, which is not installed"
    width = head_dim_of(config)
    if width is not None and width % GROUP_SIZE:
        return f"quantize={value} groups {GROUP_SIZE} channels, which does not divide this model's head_dim ({width})"
    return None


def layer_factory(value, config, residual_length: int):
    """A function returning a fresh quantized layer for `quantize=value` on `config`'s model, or None for none.
    Rotation layers of one factory share one rotation and codebook (`SharedTables`), as in one cache."""
    parsed = parse(value)
    if parsed is None:
        return None
    backend, knobs = parsed
    if backend == "rotation":
        from ..caches.rotation_cache import RotationQuantizedLayer, SharedTables
        from ..models.loading import head_dim

        tables = SharedTables(head_dim(config.get_text_config(decoder=True)), knobs["key_bits"],
                              knobs["value_bits"], 0)
        return lambda: RotationQuantizedLayer(tables, residual_length=residual_length, **knobs)
    from ..caches.quant import get_backend

    layer_class = get_backend(backend).layer_classes()[0]
    if backend == "fp8":
        return layer_class
    if backend == "quanto":
        from ..caches.backends import prepare_quanto

        prepare_quanto(build=False)
    return lambda: layer_class(q_group_size=GROUP_SIZE, residual_length=residual_length, **knobs)


def cache_code(value, residual_length: int) -> tuple[list[str], str]:
    """(imports, lines building `cache`, a `PrunedCache` whose pruned layers are then quantized)."""
    backend, knobs = parse(value)
    imports = ["from kvlab.eviction.cache import PrunedCache"]
    comment = "  # each full-attention layer is pruned at prefill, then what it kept is quantized"
    if backend == "rotation":
        imports.append("from kvlab.caches.rotation_cache import RotationQuantizedLayer, SharedTables")
        bits = f"key_bits={knobs['key_bits']}, value_bits={knobs['value_bits']}"
        return imports, (f"tables = SharedTables(model.config.head_dim, {knobs['key_bits']}, {knobs['value_bits']}, "
                         f"0)  # one rotation and codebook for every layer\n"
                         f"cache = PrunedCache(model.config, quantized_layer=lambda: RotationQuantizedLayer(tables, "
                         f"{bits}, residual_length={residual_length})){comment}")
    from ..caches.quant import get_backend

    name = get_backend(backend).layer_classes()[0].__name__
    imports.append(f"from transformers.cache_utils import {name}")
    args = "" if backend == "fp8" else (f"nbits={knobs['nbits']}, q_group_size={GROUP_SIZE}, "
                                        f"residual_length={residual_length}")
    return imports, f"cache = PrunedCache(model.config, quantized_layer=lambda: {name}({args})){comment}"
