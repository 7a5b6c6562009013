"""Exact byte accounting of a KV cache, and the analytical prediction beside it.

Bytes are counted from the tensors a cache actually holds, never from process
RSS: for plain layers `keys` and `values`; for quantized layers the packed data
plus scales/zero points (quanto's `WeightQBitsTensor` is walked through
`__tensor_flatten__`, so its dequantized size is never counted) plus the
full-precision residual, as the layer's quantization backend names them
(`kvlab.caches.quant`); for every layer any other tensor it keeps (a static
layer's `cumulative_length`, a sliding layer's 8-byte window size). Bytes are
split by the device the tensors live on, so an offloaded cache shows what sits
in host memory, and by layer type (`cache_bytes_by_layer_type`: full, sliding or
other attention, transformers' names), so a hybrid model's sliding layers show
apart from its full ones; the prediction is split the same way. `layer_parts`
splits one layer's bytes into keys/values, packed data, scales/zero points, the
full-precision residual and the rest (the Inspect tab's table);
`predicted_next_cache_bytes` says what a cache will hold after its next step
(the budget check of `kvlab.budget`). This module measures; it does not render.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch


def tensor_bytes_by_device(obj, into: dict[str, int] | None = None) -> dict[str, int]:
    """Storage bytes of every tensor reachable from `obj`, keyed by device string.

    `obj` may be a tensor (a tensor subclass is broken into its inner tensors),
    a tuple/list, or a mapping; anything else counts 0.
    """
    into = defaultdict(int) if into is None else into
    if isinstance(obj, torch.Tensor):
        inner = _inner_tensors(obj)
        if inner is None:
            into[str(obj.device)] += obj.nelement() * obj.element_size()
        else:
            for part in inner:
                tensor_bytes_by_device(part, into)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            tensor_bytes_by_device(item, into)
    elif isinstance(obj, Mapping):
        for item in obj.values():
            tensor_bytes_by_device(item, into)
    return into


_INNER_NAMES: dict[type, list[str]] = {}
"""Inner tensor attribute names per tensor subclass: `__tensor_flatten__` is costly on quanto's
tensors (it rebuilds size/stride strings) and the names never change within a type."""


def _inner_tensors(tensor: torch.Tensor):
    kind = type(tensor)
    if kind in (torch.Tensor, torch.nn.Parameter) or not hasattr(tensor, "__tensor_flatten__"):
        return None
    names = _INNER_NAMES.get(kind)
    if names is None:
        names = _INNER_NAMES[kind] = list(tensor.__tensor_flatten__()[0])
    return [getattr(tensor, name) for name in names]


def layer_bytes_by_device(layer) -> dict[str, int]:
    """Bytes held by one cache layer (all its tensor attributes), by device."""
    counted = defaultdict(int)
    for value in vars(layer).values():
        tensor_bytes_by_device(value, counted)
    return counted


LAYER_PARTS = ("keys_values", "packed", "scales", "residual", "other")
"""What `layer_parts` splits a layer into: plain `keys`/`values`; a quantized layer's packed data, its scales and
zero points, and its full-precision residual (`keys`/`values` beside quantized states); any other tensor."""


def layer_parts(layer) -> dict[str, dict[str, int]]:
    """One cache layer's bytes split into LAYER_PARTS, each by device string; the parts add up to
    `layer_bytes_by_device(layer)`. A layer a quantization backend made is split as its backend says
    (`kvlab.caches.quant.QuantBackend.layer_parts`); any other layer's `keys`/`values` are `keys_values`."""
    from .caches.quant import backend_of_layer

    parts = {name: defaultdict(int) for name in LAYER_PARTS}
    backend = backend_of_layer(layer)
    if backend is not None:
        for part, objects in backend.layer_parts(layer).items():
            tensor_bytes_by_device(objects, parts[part])
    else:
        for name, value in vars(layer).items():
            tensor_bytes_by_device(value, parts["keys_values" if name in ("keys", "values") else "other"])
    return {name: dict(by_device) for name, by_device in parts.items()}


def cache_bytes_by_device(cache) -> dict[str, int]:
    """Bytes held by a whole `transformers` Cache (or None), by device string."""
    counted = defaultdict(int)
    if cache is None:
        return {}
    for layer in getattr(cache, "layers", []):
        for device, size in layer_bytes_by_device(layer).items():
            counted[device] += size
    return dict(counted)


def cache_bytes(cache) -> int:
    """Total bytes held by a cache across devices (0 for None)."""
    return sum(cache_bytes_by_device(cache).values())


def bytes_per_token(config, dtype: torch.dtype) -> int:
    """Dense K+V bytes one token adds to the cache: 2·layers·kv_heads·head_dim·element_size."""
    cfg = config.get_text_config(decoder=True)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head * element


def predicted_cache_bytes(config, dtype: torch.dtype, tokens: int) -> int:
    """Analytical dense cache size for `tokens` cached tokens, in bytes."""
    return bytes_per_token(config, dtype) * max(int(tokens), 0)


_LAYOUTS: dict[tuple, tuple] = {}
"""`layer_types_and_windows` per config (read every decode step by the prediction; about half a millisecond)."""
MAX_LAYOUTS = 32


def _layout_key(config) -> tuple:
    """The config object and the attributes its layer layout comes from (a changed one reads it again)."""
    text = getattr(config, "text_config", None)
    parts = [config] + ([text] if text is not None else [])
    return tuple((id(part), repr(getattr(part, "layer_types", None)), getattr(part, "sliding_window", None),
                  getattr(part, "num_hidden_layers", None)) for part in parts)


def layer_types_and_windows(config) -> tuple[list[str], list[int | None]]:
    """Per decoder layer of `config`: its type (transformers' names: `full_attention`, `sliding_attention`, ...)
    and its sliding window in tokens (None for a full-attention layer), as transformers' caches read them
    (`get_layer_types_and_kwargs`: a config with `sliding_window` and no `layer_types` is sliding throughout).
    An inconsistent config counts as all full attention. Remembered per config (its layout attributes are part
    of the key); the lists returned are copies."""
    key = _layout_key(config)
    hit = _LAYOUTS.get(key)
    if hit is None or hit[0] is not config:
        if len(_LAYOUTS) >= MAX_LAYOUTS:
            _LAYOUTS.pop(next(iter(_LAYOUTS)))
        hit = _LAYOUTS[key] = (config, *_read_layout(config))
    return list(hit[1]), list(hit[2])


def _read_layout(config) -> tuple[list[str], list[int | None]]:
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True)
    try:
        types, kwargs = get_layer_types_and_kwargs(cfg)
    except (AttributeError, TypeError, ValueError):
        return ["full_attention"] * cfg.num_hidden_layers, [None] * cfg.num_hidden_layers
    windows = [None if kind == "full_attention" else (extra or {}).get("sliding_window")
               for kind, extra in zip(types, kwargs)]
    return list(types), windows


def layer_windows(config) -> list[int | None]:
    """Per decoder layer, its sliding window in tokens or None (see `layer_types_and_windows`)."""
    return layer_types_and_windows(config)[1]


def cache_bytes_by_layer_type(cache, layer_types: list[str]) -> dict[str, int]:
    """Bytes held by a cache (all devices), summed per layer type; `layer_types[i]` names cache layer i (a layer
    past the list counts as `other`). Empty for None."""
    counted: dict[str, int] = defaultdict(int)
    for index, layer in enumerate(getattr(cache, "layers", None) or []):
        kind = layer_types[index] if index < len(layer_types) else "other"
        counted[kind] += sum(layer_bytes_by_device(layer).values())
    return dict(counted)


def predicted_cache_bytes_by_layer_type(config, dtype: torch.dtype, held_by_layer: list[int]) -> dict[str, int]:
    """The dense formula per layer type: 2·kv_heads·head_dim·element_size·tokens held, summed over each type's
    layers, for `held_by_layer[i]` tokens held by layer i (in bytes)."""
    types = layer_types_and_windows(config)[0]
    per_layer_token = bytes_per_token(config, dtype) // max(len(types), 1)
    predicted: dict[str, int] = defaultdict(int)
    for kind, held in zip(types, held_by_layer):
        predicted[kind] += per_layer_token * max(int(held), 0)
    return dict(predicted)


def predicted_next_cache_bytes(config, dtype: torch.dtype, measured_bytes: int, held_now: list[int],
                               held_next: list[int]) -> int:
    """Bytes a cache will hold after its next step: `measured_bytes` now plus the dense bytes of the tokens that
    step adds per layer (`held_now[i]` -> `held_next[i]` tokens held by layer i, from
    `Strategy.held_tokens_by_layer`; a sliding layer that has filled its window adds nothing).

    Exact for dynamic, static and sink caches; for a quantized cache an upper bound (the new token joins the
    full-precision residual, and a flush of the residual into the quantized states only shrinks it).
    """
    growth = sum(predicted_cache_bytes_by_layer_type(config, dtype, held_next).values()) \
        - sum(predicted_cache_bytes_by_layer_type(config, dtype, held_now).values())
    return measured_bytes + growth

