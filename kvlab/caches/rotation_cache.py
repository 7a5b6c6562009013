"""`RotationQuantizedCache`: a transformers cache whose layers store keys and values rotation-quantized
(TurboQuant-MSE, Zandieh et al., arXiv 2504.19874; the quantizer is `kvlab.caches.rotation_quant`).

Each layer is a transformers `QuantizedLayer` (the KIVI-style residual of Liu et al. 2024, "KIVI: A Tuning-Free
Asymmetric 2bit Quantization for KV Cache"): the prompt is quantized at prefill, the newest tokens then wait in
full precision until `residual_length` of them have gathered and are quantized together; `update` is
transformers' own. Keys and values have their own bits (1-4 each). Two departures from transformers' quanto and
hqq layers, both inside `_quantize`:
- transformers flushes the residual by quantizing the de-quantized old states together with the residual. Rotation
  quantization is not idempotent (the reconstruction is shorter than the vector, so each round trip would shrink
  the old vectors' norms), so the old positions keep their packed form, checked to be exactly what the flush saw.
- the per-tensor `axis` slot of transformers' `_quantize(tensor, axis)` carries the role, KEY or VALUE: the
  quantizer always works along head_dim, one vector at a time.

One rotation (Haar-random, from `seed`) and one codebook per role serve every layer of a cache, one copy per
device. The first layer to use a device's copy lists its tensors in `shared_tables`, so the byte accounting that
walks each layer's tensor attributes (`kvlab.accounting`) counts them once, under `other`; the packed indices
count as `packed`, the float16 norms as `scales`, the full-precision residual as `residual`. `stored_nbytes()`
gives the same total from the documented layout. On a model with sliding-window layers (Gemma 2/3) only the
full-attention layers are rotation-quantized; the others are what `DynamicCache(config=...)` makes them (a sliding
layer keeps its last `window - 1` tokens in full precision; `kvlab.caches.hybrid`), or, with `sliding="quantize"`,
`RotationSlidingLayer`s that keep the same window rotation-quantized. This module builds caches; it does not
choose or report them.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, QuantizedLayer

from .hybrid import quantize_full_layers
from .lloyd_max import BITS, MIN_HEAD_DIM
from .rotation_quant import (
    Codec,
    PackedVectors,
    codec_nbytes,
    concat_packed,
    dequantize,
    drop_front,
    haar_rotation,
    make_codec,
    packed_nbytes,
    quantize,
    select_batch,
)

KEY, VALUE = "key", "value"
"""The roles `RotationQuantizedLayer` passes through transformers' `axis_key` / `axis_value`."""
DEFAULT_BITS = 4
DEFAULT_RESIDUAL_LENGTH = 128
"""transformers' `QuantizedLayer` default."""
DEFAULT_SEED = 0


def check_knobs(key_bits: int, value_bits: int, residual_length: int, seed: int) -> None:
    """Raise ValueError naming the allowed values unless key_bits and value_bits are in BITS (1-4),
    residual_length >= 0 and seed >= 0 (all integers)."""
    for name, value in (("key_bits", key_bits), ("value_bits", value_bits)):
        if value not in BITS or isinstance(value, bool):
            raise ValueError(f"{name} must be one of {list(BITS)}, got {value!r}")
    for name, value in (("residual_length", residual_length), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


class SharedTables:
    """The rotation and the key and value codecs of one cache (`rotation_quant.Codec`), made on the CPU and
    copied once per device the cache's layers live on."""

    def __init__(self, head_dim: int, key_bits: int, value_bits: int, seed: int):
        rotation = haar_rotation(head_dim, seed)
        self.head_dim, self.seed = head_dim, seed
        self.bits = {KEY: key_bits, VALUE: value_bits}
        self._cpu = {role: make_codec(head_dim, bits, rotation=rotation) for role, bits in self.bits.items()}
        self._by_device: dict[str, dict[str, Codec]] = {}

    def on(self, device: torch.device) -> tuple[dict[str, Codec], bool]:
        """(role -> codec on `device`, True when this call made that device's copy)."""
        key = str(device)
        if key in self._by_device:
            return self._by_device[key], False
        rotation = self._cpu[KEY].rotation.to(device, copy=True)
        codecs = {role: Codec(codec.bits, rotation, codec.centroids.to(device, copy=True),
                              codec.boundaries.to(device, copy=True)) for role, codec in self._cpu.items()}
        self._by_device[key] = codecs
        return codecs, True

    def nbytes(self) -> int:
        """Bytes of one device's copy: the rotation once, each role's centroids and boundaries."""
        return (codec_nbytes(self.head_dim, self.bits[KEY])
                + codec_nbytes(self.head_dim, self.bits[VALUE], with_rotation=False))


def _table_tensors(codecs: dict[str, Codec]) -> list[torch.Tensor]:
    key, value = codecs[KEY], codecs[VALUE]
    return [key.rotation, key.centroids, key.boundaries, value.centroids, value.boundaries]


class RotationQuantizedLayer(QuantizedLayer):
    """One layer of a `RotationQuantizedCache`: transformers' `QuantizedLayer` (residual of `residual_length`
    full-precision tokens) whose quantized states are `rotation_quant.PackedVectors`, keys at `key_bits` and
    values at `value_bits` per coordinate. `nbits` is the larger of the two, `q_group_size` the head_dim (one
    norm per vector).

    Raises:
        ValueError: knobs outside `check_knobs`' ranges, or bits other than the tables'.
    """

    def __init__(self, tables: SharedTables, key_bits: int = DEFAULT_BITS, value_bits: int = DEFAULT_BITS,
                 residual_length: int = DEFAULT_RESIDUAL_LENGTH):
        check_knobs(key_bits, value_bits, residual_length, tables.seed)
        if (key_bits, value_bits) != (tables.bits[KEY], tables.bits[VALUE]):
            raise ValueError(f"the shared tables are for k{tables.bits[KEY]}/v{tables.bits[VALUE]}, "
                             f"the layer asks k{key_bits}/v{value_bits}")
        super().__init__(nbits=max(key_bits, value_bits), axis_key=KEY, axis_value=VALUE,
                         q_group_size=tables.head_dim, residual_length=residual_length)
        self.key_bits, self.value_bits = key_bits, value_bits
        self._tables = tables
        self._codecs: dict[str, Codec] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._codecs, made_here = self._tables.on(self.device)
        if made_here:
            self.shared_tables = _table_tensors(self._codecs)

    def _quantize(self, tensor: torch.Tensor, axis: str) -> PackedVectors:
        """Quantize (batch, kv_heads, tokens, head_dim) states for role `axis` (KEY or VALUE); positions that
        are exactly the de-quantized current state keep their packed form (see the module docstring)."""
        codec = self._codecs[axis]
        previous = self._quantized_keys if axis == KEY else self._quantized_values
        kept = self._reusable(previous, tensor, codec)
        if kept is None:
            return quantize(tensor, codec)
        return concat_packed(kept, quantize(tensor[..., kept.tokens:, :], codec))

    def _reusable(self, previous: PackedVectors | None, tensor: torch.Tensor, codec: Codec) -> PackedVectors | None:
        """`previous` (in the batch order a pending beam reorder gives it) when `tensor` starts with exactly
        its de-quantized positions, else None."""
        if previous is None or previous.tokens > tensor.shape[-2] or previous.bits != codec.bits or tensor.is_meta:
            return None  # on the meta device (Plan) only shapes exist: quantizing everything again gives them
        if self._pending_beam_idx is not None:
            previous = select_batch(previous, self._pending_beam_idx)
        if not torch.equal(tensor[..., :previous.tokens, :], dequantize(previous, codec)):
            return None
        return previous

    def _dequantize(self, q_tensor: PackedVectors) -> torch.Tensor:
        """(batch, kv_heads, tokens, head_dim) states in the model's dtype from a packed state of this layer."""
        role = KEY if q_tensor.bits == self.key_bits else VALUE
        return dequantize(q_tensor, self._codecs[role])

    def stored_nbytes(self) -> int:
        """Exact bytes this layer holds, from the documented layout: the packed keys and values
        (`rotation_quant.packed_nbytes`), the full-precision residual, the shared tables when this layer
        lists them (`SharedTables.nbytes`), and a beam reorder transformers holds until the next update. Equal to
        what `kvlab.accounting.layer_bytes_by_device` counts."""
        total = 0
        for packed in (self._quantized_keys, self._quantized_values):
            if packed is not None:
                batch, heads = packed.norms.shape[:2]
                total += packed_nbytes(batch, heads, packed.tokens, packed.head_dim, packed.bits)
        for dense in (self.keys, self.values, self._pending_beam_idx):
            if dense is not None:
                total += dense.nelement() * dense.element_size()
        if getattr(self, "shared_tables", None) is not None:
            total += self._tables.nbytes()
        return total


class RotationSlidingLayer(RotationQuantizedLayer):
    """A sliding-window layer stored rotation-quantized: after each update it keeps the last `sliding_window - 1`
    tokens, as transformers' `DynamicSlidingWindowLayer` does (the token being fed makes the window), the older of
    them packed and the newest in the full-precision residual. Per-vector codes let the oldest positions be
    dropped exactly, without quantizing anything again. Masks as `DynamicSlidingWindowLayer.get_mask_sizes`."""

    is_sliding = True

    def __init__(self, tables: SharedTables, sliding_window: int, key_bits: int = DEFAULT_BITS,
                 value_bits: int = DEFAULT_BITS, residual_length: int = DEFAULT_RESIDUAL_LENGTH):
        super().__init__(tables, key_bits, value_bits, residual_length)
        self.sliding_window = sliding_window

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self._keep_window()
        return keys, values

    def _keep_window(self) -> None:
        """Drop the oldest positions beyond `sliding_window - 1`: packed ones first, then residual ones."""
        residual = self.keys.shape[-2] if self.keys is not None and self.keys.dim() == 4 else 0
        packed = self._quantized_keys.tokens
        drop = packed + residual - (self.sliding_window - 1)
        if drop <= 0:
            return
        from_packed = min(drop, packed)
        if from_packed:
            self._quantized_keys = drop_front(self._quantized_keys, from_packed)
            self._quantized_values = drop_front(self._quantized_values, from_packed)
        if drop > from_packed:
            self.keys = self.keys[..., drop - from_packed:, :].clone()
            self.values = self.values[..., drop - from_packed:, :].clone()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the attention mask, as `DynamicSlidingWindowLayer`'s."""
        is_full = self.cumulative_length >= self.sliding_window
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        kv_length = self.sliding_window - 1 + query_length if is_full else self.cumulative_length + query_length
        return kv_length, kv_offset

    def get_max_length(self) -> int:
        return self.sliding_window


SLIDING_CHOICES = ("keep", "quantize")
"""What `RotationQuantizedCache` does with sliding-window layers: keep transformers' layer, or quantize it."""


class RotationQuantizedCache(Cache):
    """A cache of `RotationQuantizedLayer`s, one per decoder layer of `config`, built like transformers'
    `QuantizedCache`; pass it as `model.generate(..., cache=cache)` or to forward calls. On a model with
    sliding-window layers only the full-attention layers are `RotationQuantizedLayer`s; the others are what
    `DynamicCache(config=config)` makes them.

    Args:
        config: the model's config (its text config's head_dim, layers and layer types are read).
        key_bits, value_bits: bits per coordinate, 1-4 each.
        residual_length: newest tokens kept in full precision (0: every flush at once).
        seed: draws the rotation (`rotation_quant.haar_rotation`), shared by every layer, keys and values.
        sliding: `keep` (a sliding layer is transformers' `DynamicSlidingWindowLayer`) or `quantize`
            (`RotationSlidingLayer`: its window rotation-quantized too).

    Raises:
        ValueError: knobs out of range (the message lists the allowed values), a head_dim below
            MIN_HEAD_DIM, or a model with nothing to quantize.
    """

    def __init__(self, config, key_bits: int = DEFAULT_BITS, value_bits: int = DEFAULT_BITS,
                 residual_length: int = DEFAULT_RESIDUAL_LENGTH, seed: int = DEFAULT_SEED, sliding: str = "keep"):
        check_knobs(key_bits, value_bits, residual_length, seed)
        if sliding not in SLIDING_CHOICES:
            raise ValueError(f"sliding must be one of {list(SLIDING_CHOICES)}, got {sliding!r}")
        cfg = config.get_text_config(decoder=True)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if head_dim < MIN_HEAD_DIM:
            raise ValueError(f"head_dim must be >= {MIN_HEAD_DIM}, this model's is {head_dim}")
        self.tables = SharedTables(head_dim, key_bits, value_bits, seed)
        window = (lambda size: RotationSlidingLayer(self.tables, size, key_bits, value_bits, residual_length)
                  ) if sliding == "quantize" else None
        super().__init__(layers=quantize_full_layers(
            config, lambda: RotationQuantizedLayer(self.tables, key_bits, value_bits, residual_length), window))

    def stored_nbytes(self) -> int:
        """Exact bytes the cache holds: the sum of its quantized layers' `stored_nbytes()` and the other layers'
        tensors, keys and values (a sliding layer's 8-byte window tensor included)."""
        return sum(layer.stored_nbytes() if isinstance(layer, RotationQuantizedLayer)
                   else sum(value.nelement() * value.element_size() for value in vars(layer).values()
                            if isinstance(value, torch.Tensor)) for layer in self.layers)
