"""A quantized cache for models with sliding-window layers: quantize the full-attention layers, keep the others
as transformers keeps them.

transformers' `QuantizedCache` refuses any model whose `config.layer_types` holds anything but full attention
(`cache_utils.QuantizedCache.__init__`), so Gemma 2/3, gpt-oss and other hybrid models cannot quantize even their
full-attention layers. `quantize_full_layers(config, make_layer)` builds what transformers' default cache builds
(`DynamicCache(config=...)`: a `DynamicSlidingWindowLayer` per sliding layer, keeping its last `window - 1`
tokens; a `DynamicLayer` per full-attention layer; whatever else the config asks for) and puts `make_layer()`,
a quantized layer, in place of each full-attention one. On a model whose layers are all full attention the result
holds the same layers, and the same bytes, as `QuantizedCache`; the quantization backends build their caches with
it (`kvlab.caches.quant`, where `HybridQuantizedCache` does this with transformers' own quanto, hqq and fp8
layers). Nothing here scores, evicts or chooses a strategy.
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


def non_full_layer_types(config) -> list[str]:
    """The decoder's layer types other than full attention (e.g. `sliding_attention`), sorted, as transformers'
    caches see them (`get_layer_types_and_kwargs`: a config without `layer_types` but with a `sliding_window`,
    such as Phi-3.5's, has sliding layers) together with the config's own `layer_types`."""
    cfg = config.get_text_config(decoder=True)
    types = set(getattr(cfg, "layer_types", None) or [])
    try:
        types |= set(get_layer_types_and_kwargs(cfg)[0])
    except (AttributeError, TypeError, ValueError):
        pass  # an inconsistent config (a sliding type without a window): its layer_types alone
    return sorted(types - {FULL_ATTENTION, "dummy"})


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
