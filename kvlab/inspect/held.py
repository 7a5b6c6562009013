"""Which sequence positions a cache layer holds, and its keys/values at those positions as the reference has them.

Read by capability from the layer's own fields, never from a strategy's name:

- a layer that exposes `held_positions()` (an eviction method's layer may) says it itself: a LongTensor of
  absolute positions in storage order, shape (held,) or (kv_heads, held) when heads keep different positions;
- a quantized layer (`_quantized_keys`) holds every token: its de-quantized part, then its full-precision
  residual (`QuantizedLayer._dequantize`, transformers' `cache_utils.py`);
- a layer holding as many slots as tokens seen holds them all (a static layer: its written slots);
- a layer with `num_sink_tokens` (kvlab's `SinkLayer`) holds its sinks and its most recent tokens, and stores
  keys rotated at their index in the cache (`rerotator`): `reference_frame_keys` rotates them back to the
  positions the reference rotated them at, so only what the cache changed counts as error;
- a sliding layer (`is_sliding`) holds its most recent tokens.

Anything else (a layer holding fewer tokens than it saw without saying which, or more slots than tokens,
as a loop that feeds the same tokens again makes) gives None with the reason: no measure is invented.

This module reads caches; it runs no model and does not compare runs (`kvlab.inspect.diverge`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .inspector import held_tokens, is_quantized


@dataclass(frozen=True)
class HeldKV:
    """What one layer holds: `positions` (kv_heads, held) absolute positions in storage order; `keys`, `values`
    (kv_heads, held, head_dim) float32, keys rotated at those positions (as the reference rotates them)."""

    positions: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


def _four_dim(value) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) and value.dim() == 4 else None


def stored_kv(layer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(keys, values) of batch row 0 as the layer's attention reads them, (kv_heads, held, head_dim) float32:
    de-quantized for a quantized layer, a static layer's written slots only; None for an empty layer."""
    count = held_tokens(layer)
    if count == 0:
        return None
    if is_quantized(layer):
        parts_k = [layer._dequantize(layer._quantized_keys)]
        parts_v = [layer._dequantize(layer._quantized_values)]
        residual_k, residual_v = _four_dim(getattr(layer, "keys", None)), _four_dim(getattr(layer, "values", None))
        if residual_k is not None and parts_k[0].shape[-2] < count:
            parts_k.append(residual_k)
            parts_v.append(residual_v)
        keys, values = torch.cat(parts_k, dim=-2), torch.cat(parts_v, dim=-2)
    else:
        keys, values = _four_dim(getattr(layer, "keys", None)), _four_dim(getattr(layer, "values", None))
        if keys is None or values is None:
            return None
    return keys[0, :, :count].float(), values[0, :, :count].float()


def held_positions(layer, seen_tokens: int, heads: int = 1) -> tuple[torch.Tensor | None, str]:
    """(positions, reason): the absolute positions `layer` (with `heads` KV heads) holds after `seen_tokens` ids,
    as a (heads, held) LongTensor in storage order, or (None, why they cannot be known)."""
    count = held_tokens(layer)
    own = getattr(layer, "held_positions", None)
    if callable(own):
        positions = torch.as_tensor(own()).long().cpu()
        return (positions.expand(heads, -1) if positions.dim() == 1 else positions.reshape(heads, -1)), ""
    if count > seen_tokens:
        return None, (f"holds {count} slots for {seen_tokens} tokens seen: its slots are not one per token "
                      "(the same tokens were fed again)")
    if count == seen_tokens or is_quantized(layer):
        return torch.arange(count).expand(heads, -1), ""
    sinks = getattr(layer, "num_sink_tokens", None)
    if sinks is not None:
        sinks = min(int(sinks), count)
        recent = torch.arange(seen_tokens - (count - sinks), seen_tokens)
        return torch.cat([torch.arange(sinks), recent]).expand(heads, -1), ""
    if getattr(layer, "is_sliding", False) and not hasattr(layer, "max_cache_len"):
        return torch.arange(seen_tokens - count, seen_tokens).expand(heads, -1), ""
    return None, (f"holds {count} of {seen_tokens} tokens and does not say which (a layer that evicts exposes "
                  "`held_positions()`)")


def reference_frame_keys(layer, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`keys` (kv_heads, held, head_dim) rotated to their absolute `positions` when the layer stores them at
    their index in the cache (a layer with a `rerotator`); else `keys` as they are."""
    rerotator = getattr(layer, "rerotator", None)
    if rerotator is None:
        return keys
    shifts = positions[0] - torch.arange(positions.shape[1])
    out = keys.clone()
    for shift in shifts.unique().tolist():
        where = (shifts == shift).nonzero().flatten()
        out[:, where] = rerotator.rotate(keys[None, :, where], int(shift))[0].float()
    return out


def held_kv(layer, seen_tokens: int) -> tuple[HeldKV | None, str]:
    """(HeldKV, '') for `layer` after `seen_tokens` ids, or (None, why not)."""
    stored = stored_kv(layer)
    if stored is None:
        return None, "the layer holds nothing"
    keys, values = stored
    positions, reason = held_positions(layer, seen_tokens, keys.shape[0])
    if positions is None:
        return None, reason
    return HeldKV(positions, reference_frame_keys(layer, keys, positions), values), ""
