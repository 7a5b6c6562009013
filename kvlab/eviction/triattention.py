"""TriAttention's key scores and keep sets (Mao et al. 2026, "TriAttention: Efficient Long Reasoning with
Trigonometric KV Compression", arXiv:2604.04921), as TensorRT-LLM 1.3.0rc27 ships it
(`TriAttentionKvCacheCompressionConfig(budget, beta, eviction_mode, normalize_scores)`).

Sources followed (read at these commits):
- TensorRT-LLM `tensorrt_llm/_torch/kv_cache_compression/triattention/triattention.py` (commit
  04a7ad556180c6b5b16978d0dc71b7b6cc32eba0: the trigger, the pinned prompt, the keep count) and
  `triattention_kernels.py` (commit 0b959b24bb7a40e4d54826022537dbcf3a97850f: the mean-phase table, the
  z-normalization, the per-head reductions, lowest-index-wins ties), and the score oracle
  `torch_tri_score_oracle` in `tests/unittest/_torch/kv_cache_compression/conftest.py` (the post-RoPE score);
- the authors' reference, github.com/WeianMao/triattention at c3744ee6a50522a1559a577f85aef2b165a344f2:
  `triattention/methods/pruning_utils.py` (`compute_frequency_statistics_from_means`, `score_keys_for_round`,
  `build_geometric_offsets`) and `triattention/methods/triattention.py` (the three selections).

The score of a cached key k (post-RoPE, as the cache holds it; complex pairs k_f = k[f] + i k[f + d/2], the
half-split RoPE of transformers' `rotate_half`) for query head h, with the head's calibrated pre-RoPE query
centre q_f = E[q_f] and mean magnitude E|q_f| (`kvlab.eviction.calibration`), RoPE frequencies w_f and
scale s_f (`attention_scaling`; 1 for plain RoPE), at round start t (the tokens seen, the next query's position):

    S(k) = sum_f s_f^2 [ Re(q_f * conj(k_f) * M_f) + (E|q_f| - |q_f|) |k_f| ],
    M_f = mean over offsets o in {1, 2, 4, ..., 65536} of exp(i w_f (t + o)).

With the pre-RoPE key k'_f = k_f exp(-i w_f p) / s_f at position p this is the paper's trigonometric series,
mean_o sum_f |q_f||k'_f| cos(w_f (t - p + o) + arg q_f - arg k'_f) plus the norm term, times s_f^3 instead of
the reference's s_f^2 (the same ranking: s is one constant per model; equal for plain RoPE): TensorRT-LLM
scores the cached keys without inverting RoPE, as here; the reference inverts it first.

Selection (`select_keep`), over the decoded positions only (the prompt is pinned, never scored): each query
head's scores z-normalized over them (population std, at least 1e-6) unless `normalize_scores` is false, then
`union`: one set for every layer and KV head, the top `budget` by the maximum over all layers' query heads
(the reference takes the union of each head's top-B and re-ranks it by that maximum, which keeps the same set:
a token in the top B by the maximum is in the top B of the head that gives its maximum); `per_head`: per KV
head, shared by all layers, the mean over layers of the maximum over its query group; `per_layer_perhead`:
per layer and KV head, the maximum over its query group. Ties go to the earlier position, as TensorRT-LLM's
settle kernel does. This module scores and compacts; it holds no hooks (`triattention_hooks` opens kvlab's
`prune_at_prefill` with them) and does not calibrate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .kept import EvictionRecord, gather_slots
from .prefill import prune_at_prefill

EVICTION_MODES = ("union", "per_head", "per_layer_perhead")
"""TensorRT-LLM's `eviction_mode` values, its default first."""
OFFSET_MAX_LENGTH = 65536
"""Largest future distance scored: offsets 1, 2, 4, ... 65536 (the reference's and TensorRT-LLM's default)."""
STD_EPSILON = 1e-6
"""Smallest standard deviation a z-normalized row is divided by (TensorRT-LLM's `STD_EPSILON`)."""


@dataclass(frozen=True)
class LayerCentres:
    """One full-attention layer's calibration. q_mean: (heads, F) complex128, the mean pre-RoPE query per
    frequency pair; q_abs_mean: (heads, F) float64, the mean of |q_f|; omega: (F,) float64 RoPE frequencies
    (radians per position); scale_sq: (F,) float64, the squared RoPE `attention_scaling`. F = head_dim / 2."""

    q_mean: torch.Tensor
    q_abs_mean: torch.Tensor
    omega: torch.Tensor
    scale_sq: torch.Tensor


def geometric_offsets(max_length: int = OFFSET_MAX_LENGTH) -> torch.Tensor:
    """(n,) float64 offsets 1, 2, 4, ... up to `max_length` (at least 1)."""
    return torch.tensor([float(2**i) for i in range(int(math.log2(max(1, max_length))) + 1)], dtype=torch.float64)


def mean_phase(omega: torch.Tensor, round_start: int, offsets: torch.Tensor) -> torch.Tensor:
    """(F,) complex128 mean over `offsets` of exp(i omega (round_start + offset)) (TensorRT-LLM's mean-phase row)."""
    angle = (float(round_start) + offsets.double())[:, None] * omega.double()[None, :]
    return torch.complex(torch.cos(angle).mean(0), torch.sin(angle).mean(0))


def key_scores(keys: torch.Tensor, centres: LayerCentres, round_start: int,
               offsets: torch.Tensor | None = None) -> torch.Tensor:
    """(heads, n) float32 scores of cached keys for every query head (see the module docstring).

    Args:
        keys: (kv_heads, n, head_dim) keys as cached (RoPE applied); query head h reads KV head h // group.
        centres: the layer's `LayerCentres` (heads a multiple of kv_heads, F = head_dim / 2).
        round_start: the tokens seen (the absolute position of the next query).
        offsets: future distances (default `geometric_offsets()`).

    Raises:
        ValueError: the shapes do not match.
    """
    kv_heads, n, head_dim = keys.shape
    heads, freqs = centres.q_mean.shape
    if head_dim != 2 * freqs or heads % kv_heads:
        raise ValueError(f"keys of {kv_heads} KV heads x {head_dim} do not match query centres of {heads} heads x "
                         f"{freqs} frequency pairs")
    offsets = geometric_offsets() if offsets is None else offsets
    device = keys.device
    k = keys.double()
    k = torch.complex(k[..., :freqs], k[..., freqs:]).repeat_interleave(heads // kv_heads, dim=0)
    q_mean = centres.q_mean.to(device)[:, None, :]
    phase = mean_phase(centres.omega, round_start, offsets).to(device)
    trig = (q_mean * k.conj() * phase).real
    norm = (centres.q_abs_mean.to(device) - centres.q_mean.to(device).abs())[:, None, :] * k.abs()
    return ((trig + norm) * centres.scale_sq.to(device)).sum(-1).float()


def z_normalize(scores: torch.Tensor) -> torch.Tensor:
    """Each row of (..., n) scores minus its mean, over its population standard deviation (at least STD_EPSILON)."""
    mean = scores.mean(-1, keepdim=True)
    std = scores.std(-1, unbiased=False, keepdim=True).clamp_min(STD_EPSILON)
    return (scores - mean) / std


def top_in_order(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` highest of each row of (..., n) `scores` (ties: the lower index), ascending."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :count]
    return order.sort(dim=-1).values


def select_keep(eviction_mode: str, scores: dict[int, torch.Tensor], kv_heads: int,
                budget: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (kept (kv_heads, budget) indices into the decoded positions, ascending; (kv_heads, n) the score
    each KV head ranked by), from per layer (heads, n) scores of the same n decoded positions per KV head, already
    normalized as asked. `union` and `per_head` need the layers (and `union` the KV heads) to hold the same
    positions; the caller checks that.

    Raises:
        ValueError: an unknown mode.
    """
    grouped = {i: s.view(kv_heads, s.shape[0] // kv_heads, s.shape[1]).amax(1) for i, s in scores.items()}
    if eviction_mode == "per_layer_perhead":
        return {i: (top_in_order(g, budget), g) for i, g in grouped.items()}
    if eviction_mode == "per_head":
        shared = torch.stack(list(grouped.values())).mean(0)
        kept = top_in_order(shared, budget)
        return {i: (kept, shared) for i in grouped}
    if eviction_mode == "union":
        combined = torch.stack([s.amax(0) for s in scores.values()]).amax(0).expand(kv_heads, -1)
        kept = top_in_order(combined[:1], budget).expand(kv_heads, -1)
        return {i: (kept, combined) for i in grouped}
    raise ValueError(f"eviction_mode must be one of {', '.join(EVICTION_MODES)}, got {eviction_mode!r}")


def _regions(layer, prompt_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt slots (kv_heads, prompt), decoded slots (kv_heads, n), their positions), each ascending by position.

    Raises:
        RuntimeError: a KV head does not hold the whole prompt.
    """
    positions = layer.positions
    order = torch.sort(positions, dim=-1, stable=True).indices
    ordered = positions.gather(1, order)
    if not torch.equal(ordered[:, :prompt_tokens], torch.arange(prompt_tokens).expand(positions.shape[0], -1)):
        raise RuntimeError("a TriAttention layer lost a prompt position: the prompt is pinned")
    return order[:, :prompt_tokens], order[:, prompt_tokens:], ordered[:, prompt_tokens:]


def evict_layers(cache, layers: list[int], centres: dict[int, LayerCentres], prompt_tokens: int, budget: int,
                 eviction_mode: str, normalize_scores: bool = True, record: EvictionRecord | None = None) -> bool:
    """One TriAttention eviction round over the pruned `layers` of a `PrunedCache`: when they hold more than
    `budget` decoded positions (after the pinned `prompt_tokens`), score those positions, keep the prompt and
    `budget` of them per KV head (`select_keep`), in position order, and note it in `record`. Returns whether
    it evicted (TensorRT-LLM skips a round at or under budget).

    Raises:
        RuntimeError: the layers do not hold the positions the mode needs (a cache TriAttention did not build).
    """
    held = {i: cache.layers[i] for i in layers}
    regions = {i: _regions(layer, prompt_tokens) for i, layer in held.items()}
    decoded = regions[layers[0]][2].shape[1]
    if decoded <= budget:
        return False
    positions = [region[2] for region in regions.values()]
    if eviction_mode != "per_layer_perhead" and any(not torch.equal(p, positions[0]) for p in positions):
        raise RuntimeError("TriAttention's union and per_head modes need every layer to hold the same positions")
    if eviction_mode == "union" and not bool((positions[0] == positions[0][:1]).all()):
        raise RuntimeError("TriAttention's union mode needs every KV head to hold the same positions")
    scores = {}
    for i, layer in held.items():
        slots = regions[i][1].to(layer.keys.device)
        keys = layer.keys[0].gather(1, slots[..., None].expand(-1, -1, layer.keys.shape[-1]))
        raw = key_scores(keys, centres[i], layer.seen)
        scores[i] = z_normalize(raw) if normalize_scores else raw
    kv_heads = positions[0].shape[0]
    for i, (kept, ranked) in select_keep(eviction_mode, scores, kv_heads, budget).items():
        layer = held[i]
        prompt_slots, slots, _ = regions[i]
        before = layer.positions
        keep = torch.cat([prompt_slots, slots.gather(1, kept.cpu())], dim=1)
        by_slot = torch.full(before.shape, float("nan"))
        by_slot.scatter_(1, slots, ranked.detach().float().cpu())
        gather_slots(layer, keep[None].to(layer.keys.device).expand(layer.keys.shape[0], -1, -1))
        if record is not None:
            record.note_compression(i, before, by_slot, layer.positions, layer.seen)
    return True


def unscored(inputs) -> torch.Tensor:
    """The prefill's scores: none (NaN), as TensorRT-LLM does no context-phase work; every prompt position is kept."""
    return torch.full(inputs.keys.shape[:3], float("nan"), device=inputs.keys.device)


def triattention_hooks(model, centres: dict[int, LayerCentres], budget: int, beta: int, eviction_mode: str = "union",
                       normalize_scores: bool = True, record: EvictionRecord | None = None):
    """`prune_at_prefill` for TriAttention: the prefill keeps the whole prompt; then, every `beta` tokens fed after
    it, `evict_layers` on every full-attention layer of the `PrunedCache` at once. Yields the `EvictionRecord`
    (`record`, or a new one: pass the cache's own when the block is opened for each forward). The hooks are
    removed when the block exits."""

    def compress(cache, layers: list[int], noted: EvictionRecord) -> bool:
        return evict_layers(cache, layers, centres, noted.prompt_tokens, budget, eviction_mode, normalize_scores,
                            noted)

    return prune_at_prefill(model, unscored, lambda seq, layer: seq, record, beta, None, compress)
