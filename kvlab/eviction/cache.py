"""The cache the scored-eviction strategies prune: a `DynamicCache` whose full-attention layers know which
absolute positions they hold (`PrunedLayer`), with a slot for the `EvictionRecord` (`PrunedCache`).

Eviction composed with quantization (as kvpress composes a press with transformers' `QuantizedCache`): a
`PrunedCache` given `quantized_layer` (a function returning a fresh quantized cache layer, e.g. transformers'
`QuantoQuantizedLayer(nbits=4)`) has each full-attention layer pruned at prefill while it is still dense, then
`quantize_layer` moves what was kept into a quantized layer, which decodes as transformers' quantized layers do
(the newest `residual_length` tokens in full precision). kvpress instead quantizes the prompt first and
de-quantizes it to score and prune, then quantizes the kept positions again; here the scores see the
full-precision keys and each kept position is quantized once.

The positions are bookkeeping, not cache data: they sit in a `HeldPositions` object, which the byte counts of
`kvlab.accounting` (every tensor attribute of a layer) do not see. This module does not score or prune
(`kvlab.eviction.prefill`, `kvlab.eviction.decoding`).
"""

from __future__ import annotations

import torch
from functools import lru_cache

from transformers import DynamicCache, DynamicLayer


class HeldPositions:
    """A pruned layer's bookkeeping: `positions` ((kv_heads, held) int64 absolute positions, or None before the
    first token) and `seen` (tokens fed)."""

    def __init__(self):
        self.positions = None
        self.seen = 0


class TracksPositions:
    """Mixin for a cache layer class that knows which absolute positions it holds (batch row 0): `positions`,
    (kv_heads, held) int64 on the CPU in storage order, kept in step with the stored states by `update` and
    `keep_slots`; `seen`, the tokens fed to it. `held_positions()` is what `kvlab.inspect.held` reads for
    divergence forensics. The bookkeeping sits in a `HeldPositions` object, which the byte counts of
    `kvlab.accounting` (every tensor attribute of a layer) do not see: it is not cache data."""

    is_croppable = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = HeldPositions()

    @property
    def positions(self):
        return self.held.positions

    @property
    def seen(self) -> int:
        return self.held.seen

    def update(self, key_states, value_states, *args, **kwargs):
        fed, heads = key_states.shape[-2], key_states.shape[1]
        device = "meta" if key_states.is_meta else "cpu"  # Plan feeds shapes only (meta): allocate nothing
        new = torch.arange(self.held.seen, self.held.seen + fed, device=device).expand(heads, -1)
        old = self.held.positions
        self.held.positions = new.clone() if old is None else torch.cat([old, new], dim=1)
        self.held.seen += fed
        return super().update(key_states, value_states, *args, **kwargs)

    def keep_slots(self, indices) -> None:
        """Follow a prune: `indices` (batch, kv_heads, kept) are the slots kept, in their new order."""
        self.held.positions = self.held.positions.gather(1, indices[0].cpu())

    def held_positions(self):
        """(kv_heads, held) absolute positions of the held keys/values, in storage order."""
        return self.held.positions

    def reset(self) -> None:
        super().reset()
        self.held = HeldPositions()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a pruned cache cannot be cropped: the positions it evicted are gone")


class PrunedLayer(TracksPositions, DynamicLayer):
    """A `DynamicLayer` that knows which absolute positions it holds (`TracksPositions`)."""


@lru_cache(maxsize=None)
def tracking(layer_class: type) -> type:
    """`layer_class` (a quantized cache layer class) with `TracksPositions` mixed in, named `Pruned<name>`."""
    return type(f"Pruned{layer_class.__name__}", (TracksPositions, layer_class), {})


class PrunedCache(DynamicCache):
    """A `DynamicCache` whose prompt was pruned at prefill (and, with `compress_every`, again while
    decoding); full-attention layers are `PrunedLayer`s. `eviction` holds the `EvictionRecord` (what each
    layer kept, with the scores), for the Inspect view."""

    eviction = None

    def __init__(self, config, quantized_layer=None):
        super().__init__(config=config)
        self.quantized_layer = quantized_layer
        for index, layer in enumerate(self.layers):
            if type(layer) is DynamicLayer:
                self.layers[index] = PrunedLayer()

    def quantize_layer(self, index: int) -> None:
        """Replace pruned layer `index` by a fresh `quantized_layer()` holding its keys and values (quantized at
        once, as a quantized layer quantizes a prompt) and the positions it held; a no-op without
        `quantized_layer` or for a layer that is not a dense `PrunedLayer`. The new layer is of the made layer's
        class with `TracksPositions` mixed in (`tracking`), holding the made layer's state, so decoded positions
        stay known."""
        old = self.layers[index]
        if self.quantized_layer is None or not isinstance(old, PrunedLayer) or old.keys is None:
            return
        made = self.quantized_layer()
        made.update(old.keys, old.values)  # untracked: the positions are the pruned layer's
        tracked = tracking(type(made))
        new = tracked.__new__(tracked)
        new.__dict__.update(vars(made))
        new.held = old.held
        self.layers[index] = new

    def reset(self) -> None:
        """Empty every layer and forget the eviction record and the decoding buffer."""
        super().reset()
        self.eviction = None
        self.decode_buffer = None
