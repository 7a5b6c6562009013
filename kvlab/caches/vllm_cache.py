"""Cache layers that store keys and values in vLLM's `--kv-cache-dtype` formats, and the cache vLLM would hold.

`VllmKVLayer` is transformers' `BaseQuantizedLayer` (as its `Fp8QuantizedLayer`: no full-precision residual).
Under the TurboQuant presets the first update (the prefill) stores every token encoded and returns the exact
keys and values, as vLLM's TurboQuant backend attends a first prefill chunk with flash-attention on the raw
ones; every later update encodes the new tokens, appends them and returns everything decoded, the new token
included, as its decode stores first and then reads the cache (a later chunk longer than
CONTINUATION_DECODE_THRESHOLD tokens, a long chat turn, attends to its own tokens as they are, as its
continuation prefill does). Under `int4_per_token_head` every update returns everything decoded, the prefill
too: vLLM's Triton backend writes the cache, then attends from it for prefill and decode alike.
Each token is encoded on its own (one slot, or codes and scales, per token and KV head), so appending never
re-encodes anything. The encoder is `kvlab.caches.vllm_turboquant.TurboQuantCodec` (the TurboQuant presets) or
`kvlab.caches.vllm_int4.Int4PerTokenHeadCodec`; one codec's tables serve every layer of a cache, one copy per
device, listed by the first layer that uses that copy in `shared_tables` so that the byte accounting counts them
once. `VllmKVSlidingLayer` keeps a sliding window's last `window - 1` tokens encoded (vLLM's int4 kernel takes the
window; its TurboQuant kernels do not, so the TurboQuant presets keep a sliding layer as transformers does).

`build_vllm_cache` makes the cache vLLM would hold: the first and last `boundary_layers` decoder layers
(vLLM's `TurboQuantConfig.get_boundary_skip_layers`, n capped at half the layers; vLLM adds them to
`kv_cache_dtype_skip_layers` for every `turboquant_*` preset) keep the model's dtype, as vLLM's skipped layers
fall back to `auto`. This module builds layers and caches; the formats are the codecs', the knobs the backend's.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import BaseQuantizedLayer, Cache, DynamicCache

from .hybrid import FULL_ATTENTION, layer_types_of

BOUNDARY_LAYERS = 2
"""vLLM's default `n` of `get_boundary_skip_layers` for the TurboQuant presets."""
CONTINUATION_DECODE_THRESHOLD = 128
"""vLLM's `_CONTINUATION_DECODE_THRESHOLD` (turboquant_attn.py): a later prefill chunk of up to this many tokens
reads the whole cache decoded, its own tokens too; a longer one attends to its own tokens as they are."""


def boundary_indices(num_layers: int, boundary_layers: int) -> list[int]:
    """The decoder layers vLLM keeps unquantized: the first and last n, n = min(boundary_layers, num_layers // 2)."""
    if boundary_layers <= 0 or num_layers <= 0:
        return []
    n = min(boundary_layers, num_layers // 2)
    return sorted(set(range(n)) | set(range(num_layers - n, num_layers)))


class SharedCodec:
    """One cache's codec, made on the CPU and copied once per device its layers live on."""

    def __init__(self, codec):
        self.codec = codec
        self._by_device: dict[str, object] = {}

    def on(self, device: torch.device) -> tuple[object, bool]:
        """(the codec on `device`, True when this call made that device's copy)."""
        key = str(device)
        if key in self._by_device:
            return self._by_device[key], False
        self._by_device[key] = self.codec.to(device)
        return self._by_device[key], True

    def nbytes(self) -> int:
        """Bytes of one device's copy of the tables."""
        return sum(t.nelement() * t.element_size() for t in self.codec.tensors())


def _tokens(state: dict[str, torch.Tensor] | None) -> int:
    return 0 if not state else next(iter(state.values())).shape[-2]


class VllmKVLayer(BaseQuantizedLayer):
    """One full-attention layer stored in `kv_cache_dtype` (see the module docstring). The encoded tokens, keys
    and values together (vLLM's TurboQuant slot holds both), are one dict name -> tensor (batch, kv_heads, tokens,
    bytes or 1), concatenated along tokens, kept in `_quantized_keys` (transformers' `BaseQuantizedLayer` leaves
    its layout to the backend; `state` reads it); `_quantized_values` stays None."""

    def __init__(self, shared: SharedCodec, kv_cache_dtype: str):
        super().__init__()
        self.kv_cache_dtype = kv_cache_dtype
        self._shared = shared
        self._codec = None

    @property
    def state(self) -> dict[str, torch.Tensor] | None:
        """The encoded tokens (None before the first update)."""
        return self._quantized_keys

    @property
    def codec(self):
        """The codec on this layer's device (None before the first update)."""
        return self._codec

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._codec, made_here = self._shared.on(self.device)
        if made_here:
            self.shared_tables = self._codec.tensors()

    def _quantize(self, tensor):
        raise NotImplementedError("keys and values are encoded together: see update")

    def _dequantize(self, q_tensor):
        raise NotImplementedError("keys and values are decoded together: see update")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Encode and append (batch, kv_heads, tokens, head_dim) keys and values and return what attention reads:
        with a codec that `attends_raw_chunks` (TurboQuant) them as they are on the first call, and on a later one
        every held token decoded in the states' dtype, except that a chunk of more than
        CONTINUATION_DECODE_THRESHOLD tokens attends to its own tokens as they are (vLLM's continuation prefill);
        otherwise (int4) every held token decoded, always."""
        self.cumulative_length += key_states.shape[-2]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        previous = self.state
        new = self._codec.encode(key_states, value_states)
        self._quantized_keys = new if previous is None else {
            name: torch.cat([previous[name], tensor], dim=-2) for name, tensor in new.items()}
        if not self._codec.attends_raw_chunks:
            keys, values = self._codec.decode(self.state)
            return keys.to(key_states.dtype), values.to(value_states.dtype)
        if previous is None:
            return key_states, value_states
        if key_states.shape[-2] > CONTINUATION_DECODE_THRESHOLD:
            keys, values = self._codec.decode(previous)
            return (torch.cat([keys.to(key_states.dtype), key_states], dim=-2),
                    torch.cat([values.to(value_states.dtype), value_states], dim=-2))
        keys, values = self._codec.decode(self.state)
        return keys.to(key_states.dtype), values.to(value_states.dtype)

    def held_tokens(self) -> int:
        """Tokens whose encoded keys and values the layer holds."""
        return _tokens(self.state)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search); each row's codes are its own, so this is exact."""
        if self.state is not None:
            self._quantized_keys = {name: t.index_select(0, beam_idx.to(t.device)) for name, t in self.state.items()}

    def drop_front(self, tokens: int) -> None:
        """Forget the oldest `tokens` positions (copied, so they free their memory)."""
        if tokens > 0 and self.state is not None:
            self._quantized_keys = {name: t[..., tokens:, :].clone() for name, t in self.state.items()}


class VllmKVSlidingLayer(VllmKVLayer):
    """A sliding-window layer stored encoded: after each update it keeps the last `sliding_window - 1` tokens, as
    transformers' `DynamicSlidingWindowLayer` does; masks as that layer."""

    is_sliding = True

    def __init__(self, shared: SharedCodec, kv_cache_dtype: str, sliding_window: int):
        super().__init__(shared, kv_cache_dtype)
        self.sliding_window = sliding_window

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self.drop_front(self.held_tokens() - (self.sliding_window - 1))
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the attention mask, as `DynamicSlidingWindowLayer`'s."""
        is_full = self.cumulative_length >= self.sliding_window
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        kv_length = self.sliding_window - 1 + query_length if is_full else self.cumulative_length + query_length
        return kv_length, kv_offset

    def get_max_length(self) -> int:
        return self.sliding_window


def build_vllm_cache(config, shared: SharedCodec, kv_cache_dtype: str, boundary_layers: int,
                     encode_sliding: bool) -> Cache:
    """The cache vLLM holds for `config`'s model under `kv_cache_dtype`: full-attention layers `VllmKVLayer`s,
    sliding ones `VllmKVSlidingLayer`s when `encode_sliding` (else as `DynamicCache(config=config)` makes them),
    the `boundary_indices` layers as `DynamicCache(config=config)` makes them (the model's dtype).

    Raises:
        ValueError: no layer is left to encode (the message names the boundary layers).
    """
    types = layer_types_of(config)
    plain = DynamicCache(config=config).layers
    skipped = set(boundary_indices(len(plain), boundary_layers))
    layers = []
    for index, (kind, layer) in enumerate(zip(types, plain)):
        if index in skipped:
            layers.append(layer)
        elif kind == FULL_ATTENTION:
            layers.append(VllmKVLayer(shared, kv_cache_dtype))
        elif encode_sliding and kind == "sliding_attention":
            layers.append(VllmKVSlidingLayer(shared, kv_cache_dtype, layer.sliding_window))
        else:
            layers.append(layer)
    if not any(isinstance(layer, VllmKVLayer) for layer in layers):
        raise ValueError(f"nothing left to store as {kv_cache_dtype}: boundary_layers={boundary_layers} keeps layers "
                         f"{sorted(skipped)} of this model's {len(plain)} in its dtype; set boundary_layers=0")
    return Cache(layers=layers)
