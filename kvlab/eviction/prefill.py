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
length. Sliding-window layers (Gemma 3) are left as they are, as kvpress does: they keep their window.

The hooks are removed when the block exits, also on an exception. This module does not decode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .scoring import LayerInputs


@dataclass
class LayerEviction:
    """What one layer kept. kept: (kv_heads, kept) prompt positions, ascending, int64 on the CPU.
    scores: (kv_heads, seq) the method's score of every prompt position, float32 on the CPU."""

    layer_idx: int
    kept: torch.Tensor
    scores: torch.Tensor

    @property
    def kept_tokens(self) -> int:
        return int(self.kept.shape[-1])


@dataclass
class EvictionRecord:
    """Per layer, what a prefill kept (`layers`), and the layers left whole with the reason (`skipped`).
    prompt_tokens: positions scored (the part of the prompt that was compressed)."""

    prompt_tokens: int = 0
    layers: dict[int, LayerEviction] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)

    def head_runs(self, layer_idx: int, seen_tokens: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
        """Per KV head of layer `layer_idx`, (state, start, stop) runs over positions 0..seen_tokens-1: `held` or
        `evicted` over the scored prompt, `held` after it (tokens fed later are all kept). The Inspect strip."""
        mask = self.kept_mask(layer_idx).tolist()
        heads = []
        for row in mask:
            runs: list[tuple[str, int, int]] = []
            for position, kept in enumerate(row):
                state = "held" if kept else "evicted"
                if runs and runs[-1][0] == state:
                    runs[-1] = (state, runs[-1][1], position + 1)
                else:
                    runs.append((state, position, position + 1))
            if seen_tokens > self.prompt_tokens:
                if runs and runs[-1][0] == "held":
                    runs[-1] = ("held", runs[-1][1], seen_tokens)
                else:
                    runs.append(("held", self.prompt_tokens, seen_tokens))
            heads.append(tuple(runs))
        return tuple(heads)

    def kept_mask(self, layer_idx: int) -> torch.Tensor:
        """(kv_heads, prompt_tokens) bool: True where layer `layer_idx` kept the position."""
        layer = self.layers[layer_idx]
        mask = torch.zeros(layer.scores.shape, dtype=torch.bool)
        mask.scatter_(1, layer.kept, True)
        return mask


Scorer = Callable[[LayerInputs], torch.Tensor]
"""(layer inputs) -> (batch, kv_heads, seq) scores, higher kept."""
KeptTokens = Callable[[int, int], int]
"""(seq, layer_idx) -> positions each KV head of that layer keeps."""


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


def prune_layer(layer, scores: torch.Tensor, kept: int) -> torch.Tensor:
    """Keep the `kept` best-scored positions of every KV head in a cache layer's `keys`/`values`
    (batch, kv_heads, seq, head_dim), in score order as kvpress's gather leaves them. Returns the kept
    positions, (batch, kv_heads, kept).

    Raises:
        ValueError: scores not (batch, kv_heads, seq) of the layer's keys, or `kept` outside 1..seq.
    """
    batch, heads, seq, head_dim = layer.keys.shape
    if tuple(scores.shape) != (batch, heads, seq):
        raise ValueError(f"scores must have shape {(batch, heads, seq)}, got {tuple(scores.shape)}")
    if not 1 <= kept <= seq:
        raise ValueError(f"kept must be in 1..{seq}, got {kept}")
    indices = scores.topk(kept, dim=-1).indices
    gather = indices.unsqueeze(-1).expand(-1, -1, -1, head_dim)
    layer.keys = layer.keys.gather(2, gather).contiguous()
    layer.values = layer.values.gather(2, gather).contiguous()
    return indices


@contextlib.contextmanager
def prune_at_prefill(model, score: Scorer, kept_tokens: KeptTokens, record: EvictionRecord | None = None):
    """While open, every forward of `model` on an empty cache prunes each full-attention layer's cache to
    `kept_tokens(seq, layer_idx)` positions per KV head ranked by `score`; yields the `EvictionRecord` filled
    in (batch row 0). A forward on a cache that already holds more tokens than it was fed is not pruned.

    Raises (from inside the forward):
        ValueError: the scorer or the budget refuses the prompt (e.g. shorter than SnapKV's window).
    """
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
        if layer.keys is None or layer.keys.shape[2] != seq:
            return output
        cos, sin = kwargs["position_embeddings"]
        inputs = LayerInputs(module, hidden, layer.keys, layer.values, cos, sin, rotary)
        scores = score(inputs)
        kept = prune_layer(layer, scores, kept_tokens(seq, module.layer_idx))
        record.prompt_tokens = seq
        record.layers[module.layer_idx] = LayerEviction(
            module.layer_idx, kept[0].sort(dim=-1).values.cpu(), scores[0].detach().float().cpu())
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
