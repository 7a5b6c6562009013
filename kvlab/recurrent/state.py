"""A recurrent-state cache measured honestly: a tiny Mamba-2 (transformers' `Mamba2ForCausalLM`) built from its
config with seeded random weights, since no state-space weights ship offline. STRUCTURE_ONLY labels every figure:
structure only, random weights, the text means nothing.

transformers 5.2x keeps a Mamba-2's cache in a `DynamicCache` of `LinearAttentionLayer`s: per layer a
convolution state (the last `conv_kernel` inputs) and an SSM state (heads × head_dim × state_size), both of fixed
size, so `state_bytes` is the same after 64 tokens as after 4,096, where a KV cache grows by the same bytes per
token. `crop_error` asks whether `Cache.crop(-n)` rolls that state back: it feeds a sequence token by token with
the layers recording their past (`activate_past_recording`), crops `n` tokens, feeds the next one and compares
its logits with a fresh run's. On transformers 5.24 the crop rolls back only the convolution states and leaves
the SSM state as it was, so the logits differ (`crop_reason` says so with the figure); 5.25 made these layers
croppable. The models themselves (`tiny_mamba2`, and `attention_reference`, the KV side of the comparison) are
built by `kvlab.models.recurrent` and re-exported here. `predicted_state_bytes` says from a config what the state
holds; `state_parts` counts it from a cache. This module measures; it builds no model and renders nothing.
"""

from __future__ import annotations

import torch

from ..models.recurrent import (SEED, STRUCTURE_ONLY, TINY_VOCAB, attention_reference,  # noqa: F401 (re-exported)
                                tiny_mamba2)

CROP_TOLERANCE = 1e-6
"""Largest |logit difference| between a cropped and a fresh run for the crop to count as a rollback."""


def _ids(tokens: int, seed: int = SEED) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (1, tokens), generator=torch.Generator().manual_seed(seed))


def state_bytes(model, tokens: int) -> int:
    """Bytes the model's cache holds after a prefill of `tokens` random ids, counted from its tensors
    (`kvlab.accounting.cache_bytes`)."""
    from ..accounting import cache_bytes

    with torch.inference_mode():
        return cache_bytes(model(_ids(tokens), use_cache=True).cache)


def _feed(model, ids: torch.Tensor, cache) -> torch.Tensor:
    """Feed `ids` (1, seq) one id per forward into `cache`; the last forward's logits (vocab,)."""
    for t in range(ids.shape[1]):
        logits = model(ids[:, t:t + 1], cache=cache, use_cache=True).logits[0, -1]
    return logits


def crop_error(model, tokens: int = 16, crop: int = 3, stepwise: bool = True) -> float:
    """Max |logit difference| between (feed `tokens` ids one after another into a recording cache, crop the last
    `crop`, feed the next id) and a fresh run over the same ids: 0 when the crop rolls the state back exactly.

    The fresh run feeds its ids one per forward too (`stepwise`, the default), so both sides take the recurrent
    form of the scan and only the rollback can differ; with `stepwise=False` it is one forward over the whole
    sequence (the chunked scan), which differs from the recurrent form by float rounding (about 1e-6 in float32).

    Raises:
        RuntimeError: this transformers cannot crop the cache at all (its message).
    """
    from transformers import DynamicCache

    ids = _ids(tokens + 1, seed=1)
    kept = tokens - crop
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        _record_past(cache, crop)
        _feed(model, ids[:, :tokens], cache)
        cache.crop(-crop)
        cropped = model(ids[:, kept:kept + 1], cache=cache, use_cache=True).logits[0, -1]
        if stepwise:
            fresh = _feed(model, ids[:, :kept + 1], DynamicCache(config=model.config))
        else:
            fresh = model(ids[:, :kept + 1], use_cache=False).logits[0, -1]
    return float((cropped - fresh).abs().max())


def _record_past(cache, keep: int) -> None:
    """Turn on each linear-attention layer's past recording; where the layer takes it (transformers 5.25:
    `recurrent_states_to_keep`), keep the last `keep` SSM states so a crop of `keep` tokens can restore one."""
    import inspect

    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            takes_count = "recurrent_states_to_keep" in inspect.signature(layer.activate_past_recording).parameters
            layer.activate_past_recording(**({"recurrent_states_to_keep": keep} if takes_count else {}))


def crop_reason(model, crop: int = 3) -> str | None:
    """None when a crop of `crop` tokens reproduces a fresh run's logits to CROP_TOLERANCE on this transformers,
    else one line saying why not (with the measured difference)."""
    import transformers

    try:
        error = crop_error(model, crop=crop)
    except RuntimeError as err:
        return f"transformers {transformers.__version__} cannot crop this cache: {err}"
    if error <= CROP_TOLERANCE:
        return None
    return (f"transformers {transformers.__version__} crops only the convolution states of a linear-attention layer, "
            f"not its SSM state: a crop of {crop} tokens is off a fresh run by {error:.2g} in the logits "
            f"(transformers 5.25 made these layers croppable)")


def predicted_state_bytes(config, dtype: torch.dtype) -> dict[str, int]:
    """What a Mamba-2's cache holds, from its config, per part, in bytes, whatever the sequence length:
    `conv_state`: layers × (expand × hidden + 2 × n_groups × state_size) channels × conv_kernel, in the model's
    dtype; `ssm_state`: layers × num_heads × head_dim × state_size in float32 (transformers 5.24 keeps the SSM
    state in float32 whatever the model's dtype; measured in bfloat16 here); `other`, only where this
    transformers' empty cache layer already holds tensors (5.25: an 8-byte length counter per layer): layers ×
    those bytes."""
    from transformers import DynamicCache

    from ..accounting import cache_bytes

    element = torch.empty((), dtype=dtype).element_size()
    channels = config.expand * config.hidden_size + 2 * config.n_groups * config.state_size
    layers = config.num_hidden_layers
    parts = {"conv_state": layers * channels * config.conv_kernel * element,
             "ssm_state": layers * config.num_heads * config.head_dim * config.state_size * 4}
    empty = cache_bytes(DynamicCache(config=config))
    return {**parts, "other": empty} if empty else parts


def state_parts(cache) -> dict[str, int]:
    """Bytes a cache holds, split into `conv_state`, `ssm_state` (its linear-attention layers' states) and
    `other` (any other tensor, only when there is one), counted from the tensors."""
    from ..accounting import cache_bytes, tensor_bytes_by_device

    parts = {"conv_state": 0, "ssm_state": 0}
    for layer in getattr(cache, "layers", []):
        for name, attr in (("conv_state", "conv_states"), ("ssm_state", "recurrent_states")):
            parts[name] += sum(tensor_bytes_by_device(getattr(layer, attr, None) or {}).values())
    other = cache_bytes(cache) - sum(parts.values())
    return {**parts, "other": other} if other else parts
