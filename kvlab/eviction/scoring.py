"""Scoring functions of the eviction methods, following NVIDIA kvpress 0.5.5's presses.

Every function takes a `LayerInputs` (one attention layer's prefill: its input hidden states, the
keys/values it just wrote, its rotary cos/sin) and returns scores of shape (batch, kv_heads, seq):
higher is kept. The queries are computed here from the layer's own `q_proj` (pre-rotary, then rotated
as the layer does), so no method needs eager attention. Each function names the paper (arXiv id) and
the kvpress file it follows; where kvpress differs from the paper kvlab follows kvpress.

This module only scores; pruning lives in `kvlab.eviction.kept` (`prune_layer`).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

OBSERVED_ATTENTION_MAX_TOKENS = 8192
"""Longest prompt `observed_attention_scores` scores: it materialises (heads, seq, seq) float32 weights."""


@dataclass(frozen=True)
class LayerInputs:
    """One attention layer's prefill, as the hook sees it after the layer wrote its cache.

    attention: the attention module (has `q_proj`, `head_dim`, `config`, `layer_idx`).
    hidden_states: (batch, seq, hidden) the attention's input. keys, values: (batch, kv_heads, seq, head_dim)
    as cached (keys rotated). cos, sin: (batch, seq, head_dim) rotary tables of the prefill positions.
    rotary: the model's rotary embedding module (`forward(x, position_ids) -> (cos, sin)`), or None.
    next_position: the absolute position of the token after these (None: `keys.shape[2]`, true at prefill).

    While decoding (`kvlab.eviction.decoding`), hidden_states, cos and sin are the last `n` tokens fed, which
    are the last `n` cached keys; the keys before them are whatever the cache still holds.
    """

    attention: torch.nn.Module
    hidden_states: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    rotary: torch.nn.Module | None = None
    next_position: int | None = None

    @property
    def position_after(self) -> int:
        """The absolute position of the next token (`next_position`, else the cached length)."""
        return self.keys.shape[2] if self.next_position is None else self.next_position

    @property
    def num_heads(self) -> int:
        return self.attention.config.num_attention_heads

    @property
    def groups(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.keys.shape[1]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotary helper: (x1, x2) -> (-x2, x1) on the last dimension's halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def prerope_queries(attention, hidden_states: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) queries before rotary, from `q_proj` (and `q_norm` where the model has
    one, as Qwen 3 and Gemma 3 do)."""
    batch, seq, _ = hidden_states.shape
    queries = attention.q_proj(hidden_states).view(batch, seq, -1, attention.head_dim)
    if hasattr(attention, "q_norm"):
        queries = attention.q_norm(queries)
    return queries.transpose(1, 2)


def repeat_kv(keys: torch.Tensor, groups: int) -> torch.Tensor:
    """(batch, kv_heads, seq, d) -> (batch, kv_heads * groups, seq, d), each KV head repeated for its queries."""
    return keys if groups == 1 else keys.repeat_interleave(groups, dim=1)


def last_queries_attention(inputs: LayerInputs, window: int) -> torch.Tensor:
    """Causal softmax attention (float32 softmax, cast back) of the last `window` queries, rotated as the layer
    rotates them, over every cached key: (batch, heads, window, seq)."""
    seq = inputs.keys.shape[2]
    queries = prerope_queries(inputs.attention, inputs.hidden_states[:, -window:])
    cos, sin = inputs.cos[:, -window:].unsqueeze(1), inputs.sin[:, -window:].unsqueeze(1)
    queries = queries * cos + rotate_half(queries) * sin
    logits = queries @ repeat_kv(inputs.keys, inputs.groups).transpose(2, 3) / math.sqrt(inputs.attention.head_dim)
    mask = torch.triu(torch.full_like(logits, float("-inf")), diagonal=seq - window + 1)
    return F.softmax(logits + mask, dim=-1, dtype=torch.float32).to(queries.dtype)


def window_attention(inputs: LayerInputs, window: int) -> torch.Tensor:
    """`last_queries_attention` with the window's own keys dropped: (batch, heads, window, seq - window).
    kvpress `SnapKVPress.compute_window_attention`."""
    return last_queries_attention(inputs, window)[..., :-window]


def snapkv_scores(inputs: LayerInputs, window_size: int = 64, kernel_size: int = 5) -> torch.Tensor:
    """SnapKV (arXiv:2404.14469; kvpress `presses/snapkv_press.py`): the observation window's mean attention to
    each earlier key, average-pooled over `kernel_size` neighbours, averaged over each KV head's query group; the
    window itself scores above everything (always kept). kvpress averages the group (as SnapKV's issue 22 asks)
    where the paper's code repeats the cache per query head.

    Raises:
        ValueError: the prompt is not longer than `window_size`.
    """
    batch, kv_heads, seq, _ = inputs.keys.shape
    if seq <= window_size:
        raise ValueError(f"the prompt ({seq} tokens) must be longer than window_size ({window_size})")
    scores = window_attention(inputs, window_size).mean(dim=-2)
    scores = F.avg_pool1d(scores, kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    scores = scores.view(batch, kv_heads, inputs.groups, seq - window_size).mean(2)
    return F.pad(scores, (0, window_size), value=scores.max().item() + 1)


def tova_scores(inputs: LayerInputs) -> torch.Tensor:
    """TOVA (arXiv:2401.06104; kvpress `presses/tova_press.py`): the last query's attention to each earlier key,
    averaged over all query heads (the same score for every KV head); the last token is always kept (kvpress
    adds this; TOVA itself may drop it).

    Raises:
        ValueError: a one-token prompt.
    """
    if inputs.keys.shape[2] < 2:
        raise ValueError("tova needs a prompt of at least 2 tokens")
    scores = window_attention(inputs, 1).mean(dim=1)
    scores = scores.repeat(1, inputs.keys.shape[1], 1)
    return F.pad(scores, (0, 1), value=scores.max().item() + 1)


def observed_attention_scores(inputs: LayerInputs) -> torch.Tensor:
    """H2O-style observed attention (arXiv:2306.14048; kvpress `presses/observed_attention_press.py`): the causal
    attention weights of the fed queries (the whole prompt at prefill) summed over queries and divided by how many
    of them could attend to the key, averaged over each KV head's query group. kvpress reads the weights from
    eager attention; kvlab computes them from the layer's queries and keys, so any attention kernel works.

    Raises:
        ValueError: more than OBSERVED_ATTENTION_MAX_TOKENS cached keys.
    """
    batch, kv_heads, seq, _ = inputs.keys.shape
    if seq > OBSERVED_ATTENTION_MAX_TOKENS:
        raise ValueError(f"observed_attention scores at most {OBSERVED_ATTENTION_MAX_TOKENS} prompt tokens, got {seq}")
    fed = inputs.hidden_states.shape[1]
    weights = last_queries_attention(inputs, fed)
    seeing = torch.arange(seq, 0, -1, dtype=weights.dtype, device=weights.device).clamp(max=fed)
    scores = weights.sum(2) / seeing
    return scores.view(batch, kv_heads, inputs.groups, seq).mean(2)


def knorm_scores(inputs: LayerInputs) -> torch.Tensor:
    """Key norm (arXiv:2406.11430; kvpress `presses/knorm_press.py`): minus the L2 norm of each key (low-norm keys
    draw the most attention), accumulated in at least float32 so a bfloat16 cache does not tie distinct keys."""
    dtype = torch.promote_types(inputs.keys.dtype, torch.float32)
    return -torch.linalg.vector_norm(inputs.keys, dim=-1, dtype=dtype)


def random_scores(inputs: LayerInputs, seed: int = 0) -> torch.Tensor:
    """Uniform random scores (kvpress `presses/random_press.py`), from a generator on the keys' device seeded with
    `seed` at every layer as kvpress does, so a seed gives kvpress's choice on the same device."""
    keys = inputs.keys
    generator = torch.Generator(device=keys.device).manual_seed(seed)
    return torch.rand(*keys.shape[:-1], generator=generator, dtype=keys.dtype, device=keys.device)


def _averaged_rotation(inputs: LayerInputs, seq: int, n_future_positions: int) -> torch.Tensor:
    """(head_dim, head_dim) rotary rotation averaged over positions seq .. seq + n_future_positions - 1.

    Each position's rotation is cos·I + sin·S (S the rotate-half swap), so the average is mean(cos)·I +
    mean(sin)·S: kvpress averages the stacked (n_future_positions, head_dim, head_dim) matrices, the same figure
    from n_future_positions times the memory (16 KiB per position at head_dim 64)."""
    head_dim = inputs.attention.head_dim
    sample = inputs.hidden_states.new_zeros(1, 1, head_dim)
    positions = torch.arange(seq, seq + n_future_positions, device=sample.device)[None]
    if "layer_type" in inspect.signature(inputs.rotary.forward).parameters:  # Gemma 3: a rotary table per layer type
        cos, sin = inputs.rotary(sample, positions, getattr(inputs.attention, "layer_type", None) or "full_attention")
    else:
        cos, sin = inputs.rotary(sample, positions)
    cos, sin = cos[0].mean(dim=0), sin[0].mean(dim=0)
    eye = torch.eye(head_dim, dtype=cos.dtype, device=cos.device)
    swap = torch.zeros_like(eye)
    half = head_dim // 2
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    return cos.unsqueeze(1) * eye + sin.unsqueeze(1) * swap


def expected_attention_scores(inputs: LayerInputs, n_future_positions: int = 512, n_sink: int = 4,
                              use_covariance: bool = True, use_vnorm: bool = True,
                              epsilon: float = 0.0) -> torch.Tensor:
    """Expected Attention (kvpress `presses/expected_attention_press.py`; arXiv:2510.00636): the attention the next
    `n_future_positions` queries are expected to pay each key, from the mean (and covariance) of the prompt's
    pre-rotary queries after its first `n_sink`, rotated by the averaged future rotary matrix:
    softmax(K·mu/sqrt(d) + K·Sigma·K/(2d)), averaged over the query group, times the value norm (`use_vnorm`).
    The first `n_sink` cached positions are always kept. The future positions start at `inputs.position_after`;
    kvpress starts them at the fed length, which is the same at prefill and not while decoding (kvlab
    `kvlab.eviction.decoding` feeds the true position).

    Raises:
        ValueError: a prompt of `n_sink` tokens or fewer, or a model without a rotary embedding module.
    """
    batch, kv_heads, seq, head_dim = inputs.keys.shape
    if seq <= n_sink:
        raise ValueError(f"the prompt ({seq} tokens) must be longer than n_sink ({n_sink})")
    if inputs.rotary is None:
        raise ValueError("expected_attention needs the model's rotary embedding module")
    queries = prerope_queries(inputs.attention, inputs.hidden_states[:, n_sink:])
    mean = queries.mean(dim=2, keepdim=True)
    centered = queries - mean
    rotation = _averaged_rotation(inputs, inputs.position_after, n_future_positions).to(mean.device)
    mean = mean.squeeze(2) @ rotation.T
    keys = repeat_kv(inputs.keys[:, :, n_sink:], inputs.groups).transpose(2, 3)
    scores = (mean.unsqueeze(2) @ keys).squeeze(2) / math.sqrt(head_dim)
    if use_covariance:
        cov = torch.einsum("bnsi,bnsj->bnij", centered, centered) / queries.shape[2]
        cov = rotation @ cov @ rotation.T
        scores = scores + torch.einsum("bhin,bhij,bhjn->bhn", keys, cov, keys) / head_dim / 2
    scores = F.softmax(scores, dim=-1).view(batch, kv_heads, inputs.groups, seq - n_sink).mean(dim=2)
    if use_vnorm:
        scores = (scores + epsilon) * inputs.values[:, :, n_sink:].norm(dim=-1)
    return F.pad(scores, (n_sink, 0), value=scores.max().item() + 1)


def pyramid_kept_tokens(seq: int, compression_ratio: float, layer_idx: int, num_layers: int,
                        window_size: int = 64, beta: int = 20) -> int:
    """PyramidKV's per-layer budget (arXiv:2406.02069; kvpress `presses/pyramidkv_press.py`, after KVCache-Factory):
    more positions in lower layers, fewer in higher ones, `(1 - compression_ratio) * seq` on average; falls back
    to SnapKV's uniform `round(seq * (1 - compression_ratio))` when the pyramid does not fit (a short prompt).
    kvpress always applies the ratio, where the original code keeps short prompts whole. At least 1."""
    max_capacity = window_size + seq * (1 - compression_ratio)
    min_num = (max_capacity - window_size) / beta
    max_num = (max_capacity - window_size) * 2 - min_num
    if max_num >= seq - window_size:
        max_num = seq - window_size
        min_num = (max_capacity - window_size) * 2 - max_num
    if not (seq >= max_num >= min_num >= window_size):
        return max(1, round(seq * (1 - compression_ratio)))
    steps = (max_num - min_num) / (num_layers - 1) if num_layers > 1 else 0.0
    return round(max_num - layer_idx * steps)


def kept_tokens(seq: int, compression_ratio: float) -> int:
    """Positions a layer keeps out of `seq` at `compression_ratio` (fraction removed): kvpress's `compute_n_kept`,
    `max(1, int(seq * (1 - compression_ratio)))` (0 at a ratio of 1)."""
    if compression_ratio >= 1.0:
        return 0
    return max(1, int(seq * (1 - compression_ratio)))
