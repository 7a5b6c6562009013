"""What a pruning keeps: `prune_layer` (a layer's best-scored positions per KV head), the `EvictionRecord` of
what every layer kept, and the held/evicted runs the Inspect strip draws.

Shared by the prefill hooks (`kvlab.eviction.prefill`) and the compression while decoding
(`kvlab.eviction.decoding`); this module scores nothing and installs no hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .scoring import LayerInputs

Scorer = Callable[[LayerInputs], torch.Tensor]
"""(layer inputs) -> (batch, kv_heads, seq) scores, higher kept."""
KeptTokens = Callable[[int, int], int]
"""(seq, layer_idx) -> positions each KV head of that layer keeps."""


@dataclass
class LayerEviction:
    """What one layer kept at its last compression. kept: (kv_heads, kept) absolute positions, ascending, int64 on
    the CPU. scores: (kv_heads, positions) the method's score of every position scored, indexed by absolute
    position, float32 on the CPU; NaN for a position the layer no longer held when it was scored.
    compressions: how many times the layer was compressed while decoding (`kvlab.eviction.decoding`)."""

    layer_idx: int
    kept: torch.Tensor
    scores: torch.Tensor
    compressions: int = 0

    @property
    def kept_tokens(self) -> int:
        return int(self.kept.shape[-1])


def _runs(mask: list[bool]) -> tuple[tuple[str, int, int], ...]:
    """(state, start, stop) runs of `held`/`evicted` over a per-position mask."""
    runs: list[tuple[str, int, int]] = []
    for position, kept in enumerate(mask):
        state = "held" if kept else "evicted"
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], position + 1)
        else:
            runs.append((state, position, position + 1))
    return tuple(runs)


def held_runs(held: torch.Tensor, seen_tokens: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Per KV head, (state, start, stop) runs of `held`/`evicted` over positions 0..seen_tokens-1, from `held`
    ((kv_heads, held) absolute positions a layer holds, `held_positions()`). The Inspect strip."""
    mask = torch.zeros(held.shape[0], seen_tokens, dtype=torch.bool)
    mask.scatter_(1, held.long().clamp(max=seen_tokens - 1), True)
    return tuple(_runs(row) for row in mask.tolist())


@dataclass
class EvictionRecord:
    """Per layer, what a prefill (and any compression while decoding) kept (`layers`), and the layers left whole
    with the reason (`skipped`). prompt_tokens: positions scored at prefill (the part of the prompt compressed)."""

    prompt_tokens: int = 0
    layers: dict[int, LayerEviction] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)

    def kept_mask(self, layer_idx: int) -> torch.Tensor:
        """(kv_heads, positions scored) bool: True where layer `layer_idx` kept the position."""
        layer = self.layers[layer_idx]
        mask = torch.zeros(layer.scores.shape, dtype=torch.bool)
        mask.scatter_(1, layer.kept, True)
        return mask

    def note_compression(self, layer_idx: int, before: torch.Tensor, scores: torch.Tensor, after: torch.Tensor,
                         seen_tokens: int, pruned: bool = True) -> None:
        """Record a compression while decoding: `before`/`after` (kv_heads, held) absolute positions held before
        and after, `scores` (kv_heads, len(before)) their scores in storage order."""
        by_position = torch.full((before.shape[0], seen_tokens), float("nan"))
        by_position.scatter_(1, before.long().cpu(), scores.detach().float().cpu())
        previous = self.layers.get(layer_idx)
        count = (previous.compressions if previous else 0) + int(pruned)
        self.layers[layer_idx] = LayerEviction(layer_idx, after.sort(dim=-1).values.cpu(), by_position, count)


def prune_layer(layer, scores: torch.Tensor, kept: int) -> torch.Tensor:
    """Keep the `kept` best-scored positions of every KV head in a cache layer's `keys`/`values`
    (batch, kv_heads, seq, head_dim), in score order as kvpress's gather leaves them. Returns the kept
    positions, (batch, kv_heads, kept). When `kept == seq` nothing is dropped and the layer is left untouched,
    in position order, as kvpress leaves a prefill it does not compress (`ScorerPress.compress` returns the
    keys and values as they are at compression ratio 0): a later compression that scores neighbouring slots
    together (SnapKV's pooling) or one draw per slot (random) then sees the slots kvpress sees.

    Raises:
        ValueError: scores not (batch, kv_heads, seq) of the layer's keys, or `kept` outside 1..seq.
    """
    batch, heads, seq, _ = layer.keys.shape
    if tuple(scores.shape) != (batch, heads, seq):
        raise ValueError(f"scores must have shape {(batch, heads, seq)}, got {tuple(scores.shape)}")
    if not 1 <= kept <= seq:
        raise ValueError(f"kept must be in 1..{seq}, got {kept}")
    if kept == seq:
        return torch.arange(seq, device=scores.device).expand(batch, heads, seq)
    indices = scores.topk(kept, dim=-1).indices
    gather_slots(layer, indices)
    return indices


def gather_slots(layer, indices: torch.Tensor) -> None:
    """Keep the slots `indices` (batch, kv_heads, kept) of a cache layer's `keys`/`values`, in that order; a layer
    that tracks the positions it holds (kvlab's `PrunedLayer`) follows (`keep_slots`)."""
    gather = indices.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
    layer.keys = layer.keys.gather(2, gather).contiguous()
    layer.values = layer.values.gather(2, gather).contiguous()
    keep_slots = getattr(layer, "keep_slots", None)
    if callable(keep_slots):
        keep_slots(indices)
