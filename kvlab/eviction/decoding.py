"""Compressing a pruned cache again while decoding (kvpress's `DecodingPress`, kvpress `presses/decoding_press.py`).

`kvlab.eviction.prefill.prune_at_prefill(..., compress_every=N)` calls `buffer_and_compress` from its forward hook for
every forward after the prefill: it buffers the layer's input hidden states and rotary tables for every token
fed; once a layer has been fed `every` tokens since its last compression, its whole cache
(the positions it kept and the tokens fed since) is scored with the buffered tokens as the queries (they are the
layer's last cached keys) and pruned back to `target(layer_idx)` positions per KV head. The buffer lives on the
cache (`DecodeBuffer`), so the count carries over from one forward (one decode step) to the next; it is emptied
after each compression, as kvpress does.

Differs from kvpress: kvpress keeps at most `hidden_states_buffer_size` (256) buffered tokens and compresses to a
fixed `target_size`; kvlab keeps all `every` of them and compresses back to a target the caller gives (kvlab's
strategies: the prefill's budget, or `target_tokens` as asked), so after `d` tokens fed one per forward a layer
holds `target + d % every` positions once it has reached its target (`held_after`; a forward feeding several
tokens that bring the count to `every` or more is compressed at its end, which kvlab's strategies avoid by
feeding one token per forward). kvpress counts decoding steps only; kvlab counts every token fed after the
prefill (a question fed after the prompt when `query_aware` is false, a chat's next turn). Sliding-window layers
are left as they are (they keep their window).

A method that ranks the positions of all layers together (TriAttention's union and per-head keep sets,
`kvlab.eviction.triattention`) compresses the whole cache at once instead (`buffer_and_compress_all`): every
layer buffers as above, and the hook of the last pruned layer, once it holds `every` tokens, calls the method's
`CacheCompressor` on every pruned layer and empties all buffers. That is the end of the forward's last layer,
after every layer has attended, as TensorRT-LLM evicts at the end of a generation step. This module does not
prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .kept import EvictionRecord, Scorer, prune_layer
from .scoring import LayerInputs


CacheCompressor = Callable[[object, list[int], EvictionRecord], bool]
"""(cache, pruned layer indices, record) -> whether it evicted: compresses every pruned layer of the cache at once
and notes what each kept in the record."""


@dataclass
class DecodeBuffer:
    """Per layer index, the (hidden_states (batch, n, hidden), cos, sin (batch, n, head_dim)) of the tokens fed
    since that layer's last compression."""

    fed: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def count(self, layer_idx: int) -> int:
        """Tokens buffered for layer `layer_idx`."""
        return sum(hidden.shape[1] for hidden, _, _ in self.fed.get(layer_idx, ()))


def buffer_of(cache) -> DecodeBuffer:
    """The cache's `DecodeBuffer` (created on first use, kept as `cache.decode_buffer`)."""
    buffer = getattr(cache, "decode_buffer", None)
    if buffer is None:
        buffer = DecodeBuffer()
        cache.decode_buffer = buffer
    return buffer


def compress_layer(module, layer, buffered, score: Scorer, kept: int, rotary=None):
    """Score `layer`'s whole cache with the `buffered` (hidden, cos, sin) tokens as queries and keep the `kept`
    best positions per KV head. Returns (scores (batch, kv_heads, held) before pruning, kept slot indices
    (batch, kv_heads, kept), or None when the layer already holds no more than `kept`)."""
    hidden = torch.cat([item[0] for item in buffered], dim=1)
    cos = torch.cat([item[1] for item in buffered], dim=1)
    sin = torch.cat([item[2] for item in buffered], dim=1)
    inputs = LayerInputs(module, hidden, layer.keys, layer.values, cos, sin, rotary, getattr(layer, "seen", None))
    scores = score(inputs)
    if layer.keys.shape[2] <= kept:
        return scores, None
    return scores, prune_layer(layer, scores, kept)


def held_after(kept: int, fed: int, every: int, target: int) -> int:
    """Positions a layer holds after a prefill that kept `kept` and `fed` tokens fed one per forward, compressed
    back to `target` every `every` of them (a compression keeps min(held, target))."""
    full, rest = divmod(fed, every)
    held = kept
    for _ in range(full):
        after = min(held + every, target)
        if after == held:  # steady: every later compression lands here again
            break
        held = after
    return held + rest


def buffer_and_compress(module, layer, buffer: DecodeBuffer, fed: tuple, score: Scorer, kept: int, every: int,
                rotary=None, record: EvictionRecord | None = None) -> bool:
    """Buffer one forward's `fed` (hidden_states, cos, sin) for `layer` (the cache layer of attention `module`) and,
    once `every` tokens are buffered, compress the layer to `kept` positions per KV head and empty its buffer;
    `record` notes what was kept. Returns whether it compressed.

    Raises:
        ValueError: from the scorer, when it refuses the buffered tokens (e.g. fewer than SnapKV's window).
    """
    index = module.layer_idx
    buffer.fed.setdefault(index, []).append(fed)
    if buffer.count(index) < every:
        return False
    before = getattr(layer, "positions", None)
    scores, indices = compress_layer(module, layer, buffer.fed.pop(index), score, kept, rotary)
    if record is not None and before is not None:
        record.note_compression(index, before, scores[0], layer.positions, layer.seen, pruned=indices is not None)
    return True


def compress_while_decoding(module, cache, fed: tuple, score: Scorer, kept: int, every: int, rotary,
                            record: EvictionRecord, compress_all: CacheCompressor | None = None) -> bool:
    """The decoding step of `kvlab.eviction.prefill.prune_at_prefill`'s hook for attention `module`: with
    `compress_all`, `buffer_and_compress_all` over the layers the prefill pruned (`record.layers`), else
    `buffer_and_compress` of the module's layer back to `kept` positions. Returns whether it compressed."""
    buffer = buffer_of(cache)
    if compress_all is not None:
        return buffer_and_compress_all(module, cache, buffer, fed, every, sorted(record.layers), compress_all, record)
    return buffer_and_compress(module, cache.layers[module.layer_idx], buffer, fed, score, kept, every, rotary,
                               record)


def buffer_and_compress_all(module, cache, buffer: DecodeBuffer, fed: tuple, every: int, layers: list[int],
                            compress: CacheCompressor, record: EvictionRecord) -> bool:
    """Buffer one forward's `fed` (hidden_states, cos, sin) for attention `module`'s layer and, when `module` is the
    last of the pruned `layers` and `every` tokens are buffered for it, call `compress(cache, layers, record)` and
    empty every layer's buffer. Returns whether `compress` ran."""
    index = module.layer_idx
    buffer.fed.setdefault(index, []).append(fed)
    if index != layers[-1] or buffer.count(index) < every:
        return False
    compress(cache, layers, record)
    buffer.fed.clear()
    return True
