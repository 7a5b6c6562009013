"""Pruning each layer's cached keys/values at prefill, by forward hooks on the attention modules.

`prune_at_prefill(model, score, kept_tokens)` is a context manager: while open, each attention module of
`model` gets a forward hook that runs after the layer has written the prompt's keys and values into the
cache (transformers 5.2x passes the cache to the attention module as `cache=`), scores the layer's positions
per KV head (a function of `kvlab.eviction.scoring`), and replaces the layer's `keys`/`values` with the
`kept_tokens(seq, layer_idx)` best-scored positions of every KV head, so the cache stays a
(batch, kv_heads, kept, head_dim) tensor. The prefill's own attention already ran on every position, so
only later tokens see the pruned cache. This is how kvpress's `BasePress.forward_hook` works
(kvpress `presses/base_press.py`), written here for transformers 5.2x's hook arguments.

Positions: the pruned cache counts fewer tokens than were fed, so whoever feeds later tokens must pass
`position_ids` with their true index (`true_position_ids`); the causal mask comes from the cache's own
length. Sliding-window layers (Gemma 3) are left as they are, as kvpress does: they keep their window. A
`PrunedCache` with a `quantized_layer` has each layer quantized right after it is pruned.

The hooks are removed when the block exits, also on an exception. This module does not decode.
"""

from __future__ import annotations

import contextlib

import torch

from .decoding import CacheCompressor, compress_while_decoding
from .kept import EvictionRecord, KeptTokens, LayerEviction, Scorer, prune_layer
from .scoring import LayerInputs


def decoder_of(model):
    """The model's decoder (the module holding `layers` and `rotary_emb`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return getattr(decoder, "language_model", decoder)


def sliding_layer_indices(model) -> set[int]:
    """Indices of the decoder layers that attend through a sliding window (`config.layer_types`)."""
    config = model.config.get_text_config(decoder=True)
    types = getattr(config, "layer_types", None) or []
    return {i for i, kind in enumerate(types) if kind != "full_attention"}


def true_position_ids(sequence_tokens: int, new_tokens: int, device=None) -> torch.Tensor:
    """(1, new_tokens) rotary positions of the last `new_tokens` of a sequence of `sequence_tokens`: their index
    in the token sequence, not in the pruned cache."""
    return torch.arange(sequence_tokens - new_tokens, sequence_tokens, device=device)[None]


@contextlib.contextmanager
def prune_at_prefill(model, score: Scorer, kept_tokens: KeptTokens, record: EvictionRecord | None = None,
                     compress_every: int = 0, compress_to: KeptTokens | None = None,
                     compress_all: CacheCompressor | None = None):
    """While open, every forward of `model` on an empty cache prunes each full-attention layer's cache to
    `kept_tokens(seq, layer_idx)` positions per KV head ranked by `score`; yields the `EvictionRecord` filled
    in (batch row 0). A later forward (the cache already held tokens) is not pruned, unless `compress_every` is
    set: then each layer buffers the tokens fed and, every `compress_every` of them, is compressed back to
    `compress_to(record.prompt_tokens, layer_idx)` (default `kept_tokens`: the prefill's budget) positions
    (`kvlab.eviction.decoding`, kvpress's DecodingPress), or with `compress_all` (TriAttention) all at once.
    The buffer lives on the cache, so the block may be opened anew for each forward.

    Raises:
        ValueError: `compress_every` < 0; from inside the forward, the scorer or the budget refuses the prompt
            (e.g. shorter than SnapKV's window) or the buffered tokens.
    """
    if compress_every < 0:
        raise ValueError(f"compress_every must be >= 0, got {compress_every}")
    record = EvictionRecord() if record is None else record
    decoder = decoder_of(model)
    rotary = getattr(decoder, "rotary_emb", None)
    sliding = sliding_layer_indices(model)

    def hook(module, args, kwargs, output):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if cache is None or hidden is None:
            return output
        layer = cache.layers[module.layer_idx]
        seq = hidden.shape[1]
        if layer.keys is None or getattr(layer, "_quantized_keys", None) is not None:
            return output  # nothing written, or a layer quantized after its prefill's pruning
        cos, sin = kwargs["position_embeddings"]
        if layer.keys.shape[2] != seq:  # the cache held tokens before this forward: not a prefill
            if compress_every and record.prompt_tokens:
                kept = (compress_to or kept_tokens)(record.prompt_tokens, module.layer_idx)
                compress_while_decoding(module, cache, (hidden.detach(), cos, sin), score, kept, compress_every,
                                        rotary, record, compress_all)
            return output
        inputs = LayerInputs(module, hidden, layer.keys, layer.values, cos, sin, rotary)
        scores = score(inputs)
        kept = prune_layer(layer, scores, kept_tokens(seq, module.layer_idx))
        record.prompt_tokens = seq
        record.layers[module.layer_idx] = LayerEviction(
            module.layer_idx, kept[0].sort(dim=-1).values.cpu(), scores[0].detach().float().cpu())
        quantize = getattr(cache, "quantize_layer", None)
        if quantize is not None:  # eviction composed with quantization (`kvlab.eviction.cache`)
            quantize(module.layer_idx)
        return output

    handles = []
    try:
        for index, layer in enumerate(decoder.layers):
            if index in sliding:
                record.skipped[index] = "sliding-window layer: keeps its window, not pruned (as kvpress)"
                continue
            handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        yield record
    finally:
        for handle in handles:
            handle.remove()
