"""A quantized cache for models with sliding-window layers: quantize the full-attention layers, keep the others
as transformers keeps them.

transformers' `QuantizedCache` refuses any model whose `config.layer_types` holds anything but full attention
(`cache_utils.QuantizedCache.__init__`), so Gemma 2/3, gpt-oss and other hybrid models cannot quantize even their
full-attention layers. `quantize_full_layers(config, make_layer)` builds what transformers' default cache builds
(`DynamicCache(config=...)`: a `DynamicSlidingWindowLayer` per sliding layer, keeping its last `window - 1`
tokens; a `DynamicLayer` per full-attention layer; whatever else the config asks for) and puts `make_layer()`,
a quantized layer, in place of each full-attention one. On a model whose layers are all full attention the result
holds the same layers, and the same bytes, as `QuantizedCache`. `HybridQuantizedCache` does this with
transformers' own quanto, hqq and fp8 layers. Nothing here scores, evicts or chooses a strategy.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers.cache_utils import Cache, DynamicCache, get_layer_types_and_kwargs

FULL_ATTENTION = "full_attention"


def layer_types_of(config) -> list[str]:
    """The decoder's layer types as transformers' caches read them (`get_layer_types_and_kwargs`); a config that
    function cannot read gives its own `layer_types` (or one full-attention layer)."""
    cfg = config.get_text_config(decoder=True)
    try:
        return list(get_layer_types_and_kwargs(cfg)[0])
    except (AttributeError, TypeError, ValueError):
        return list(getattr(cfg, "layer_types", None) or [FULL_ATTENTION])


def head_dim_of(config) -> int | None:
    """Per-head key/value width of the decoder, in elements; None when the config does not say."""
    cfg = config.get_text_config(decoder=True)
    width = getattr(cfg, "head_dim", None)
    if width:
        return int(width)
    hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
    return hidden // heads if hidden and heads else None


def quantize_full_layers(config, make_layer: Callable[[], object],
                         make_sliding: Callable[[int], object] | None = None) -> list:
    """The layers of `DynamicCache(config=config)` with each full-attention layer replaced by `make_layer()`, and,
    with `make_sliding`, each sliding-window layer by `make_sliding(window)`.

    Raises:
        ValueError: nothing would be quantized (no full-attention layer, and no sliding one to quantize).
    """
    types = layer_types_of(config)
    layers = DynamicCache(config=config).layers
    quantized = [FULL_ATTENTION] + (["sliding_attention"] if make_sliding is not None else [])
    if not set(quantized) & set(types):
        raise ValueError(f"this model has no full-attention layers to quantize (its layers: {sorted(set(types))})")
    return [make_layer() if kind == FULL_ATTENTION
            else make_sliding(layer.sliding_window) if make_sliding is not None and kind == "sliding_attention"
            else layer for kind, layer in zip(types, layers)]


def backend_layer_class(backend: str):
    """transformers' quantized layer class of `backend` (quanto, hqq, fp8).

    Raises:
        ValueError: an unknown backend.
    """
    from transformers.cache_utils import Fp8QuantizedLayer, HQQQuantizedLayer, QuantoQuantizedLayer

    classes = {"quanto": QuantoQuantizedLayer, "hqq": HQQQuantizedLayer, "fp8": Fp8QuantizedLayer}
    if backend not in classes:
        raise ValueError(f"backend must be one of {list(classes)}, got {backend!r}")
    return classes[backend]


class HybridQuantizedCache(Cache):
    """transformers' `QuantizedCache` for any model: its full-attention layers are the backend's quantized layers
    (`QuantoQuantizedLayer`, `HQQQuantizedLayer`, `Fp8QuantizedLayer`, built with `layer_kwargs`: `nbits`,
    `axis_key`, `axis_value`, `q_group_size`, `residual_length`; none for fp8), the other layers are what
    `DynamicCache(config=config)` gives them (a sliding layer keeps its window).

    Raises:
        ValueError: an unknown backend, or a model without full-attention layers.
    """

    def __init__(self, backend: str, config, **layer_kwargs):
        layer_class = backend_layer_class(backend)
        super().__init__(layers=quantize_full_layers(config, lambda: layer_class(**layer_kwargs)))
