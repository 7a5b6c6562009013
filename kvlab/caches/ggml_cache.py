"""`GGMLQuantizedCache`: a transformers cache whose layers store keys and values as llama.cpp's KV cache stores
them (`-ctk <type_k> -ctv <type_v>`): ggml block types along head_dim, Hadamard-rotated where llama.cpp rotates
(`kvlab.caches.ggml_blocks` has the formats, the rotation and their sources).

Each token's keys and values are quantized once, when they arrive, and attention reads every position from the
stored blocks, the arriving token's own included, as llama.cpp writes a batch into its cache before attending
(`llm_graph_context::build_attn`). With the rotation on, a key is stored as quantize(H·k) and read back as
H·dequantize(H·k); since H is symmetric and orthonormal, q·(H·dequantize(H·k)) = (H·q)·dequantize(H·k), which is
llama.cpp's product of its rotated query with its stored key, and for values H·Σ a·dequantize(H·v) is llama.cpp's
output rotated back. The rotation matrices are shared module-wide, like llama.cpp's host-side copies, and are not
cache bytes. `residual_length` (0 by default, as llama.cpp keeps no full-precision part) keeps the newest decoded
tokens in full precision and flushes them together, as transformers' `QuantizedLayer`; the prompt is stored at
once. A model's sliding-window layers (Gemma 3) are stored the same way by default, as llama.cpp gives its
sliding-window cache the same types (`llama_kv_cache_iswa`), keeping their last `window - 1` tokens as
transformers' `DynamicSlidingWindowLayer` does; `sliding="keep"` leaves them to transformers.
Byte layout: `_quantized_keys`/`_quantized_values` hold a `ggml_blocks.Blocks` (packed `qs`, `qh`; float16
`scales`) or, for f32/f16/bf16, a plain tensor of that dtype; `keys`/`values` the full-precision residual. This
module stores states; it does not choose or report them.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import BaseQuantizedLayer, Cache

from ..engines.settings import LLAMA_KV_TYPES
from .ggml_blocks import BLOCK, PLAIN_TYPES, TYPES, Blocks, dequantize, quantize, rotate, rotation_size
from .hybrid import quantize_full_layers

KV_TYPES = LLAMA_KV_TYPES
"""The `type_k`/`type_v` values the layers take: llama.cpp's cache type names."""
SLIDING_CHOICES = ("quantize", "keep")
"""What `GGMLQuantizedCache` does with sliding-window layers: store them in the same types (llama.cpp), or keep
transformers' layer."""
DEFAULT_TYPE = "q4_0"


def check_knobs(type_k, type_v, attn_rot, residual_length) -> None:
    """Raise ValueError naming the allowed values unless both types are in KV_TYPES, `attn_rot` a boolean and
    `residual_length` an integer >= 0."""
    for name, value in (("type_k", type_k), ("type_v", type_v)):
        if value not in KV_TYPES:
            raise ValueError(f"{name} must be one of llama.cpp's cache types {list(KV_TYPES)}, got {value!r}")
    if not isinstance(attn_rot, bool):
        raise ValueError(f"attn_rot must be true or false, got {attn_rot!r}")
    if not isinstance(residual_length, int) or isinstance(residual_length, bool) or residual_length < 0:
        raise ValueError(f"residual_length must be an integer >= 0, got {residual_length!r}")


def _tokens(state) -> int:
    """Positions a stored state holds (axis 2)."""
    return 0 if state is None else (state.qs if isinstance(state, Blocks) else state).shape[2]


def _map(state, function):
    """`function` applied to each tensor of a stored state (a `Blocks` or a plain tensor)."""
    if isinstance(state, Blocks):
        return Blocks(function(state.qs), None if state.qh is None else function(state.qh), function(state.scales),
                      state.kind)
    return function(state)


def _concat(old, new):
    if old is None:
        return new
    if isinstance(old, Blocks):
        return Blocks(*(None if a is None else torch.cat([a, b], dim=2) for a, b in zip(old[:3], new[:3])), old.kind)
    return torch.cat([old, new], dim=2)


class GGMLQuantizedLayer(BaseQuantizedLayer):
    """One cache layer stored as llama.cpp stores it: keys in `type_k`, values in `type_v` (llama.cpp's names,
    KV_TYPES), rotated as llama.cpp rotates them unless `attn_rot` is False (its `LLAMA_ATTN_ROT_DISABLE=1`),
    the newest `residual_length` decoded tokens in full precision (0: none). States are (batch, kv_heads, tokens,
    head_dim); a block type needs head_dim divisible by 32.

    Raises:
        ValueError: knobs outside `check_knobs`' values, or (at the first update) a head_dim the type cannot
            split into blocks.
    """

    def __init__(self, type_k: str = DEFAULT_TYPE, type_v: str = DEFAULT_TYPE, attn_rot: bool = True,
                 residual_length: int = 0):
        check_knobs(type_k, type_v, attn_rot, residual_length)
        super().__init__()
        self.type_k, self.type_v, self.attn_rot, self.residual_length = type_k, type_v, attn_rot, residual_length
        self.rotation_k = self.rotation_v = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.dtype = key_states.dtype
        for role, kind, width in (("key", self.type_k, key_states.shape[-1]),
                                  ("value", self.type_v, value_states.shape[-1])):
            if kind in TYPES and width % BLOCK:
                raise ValueError(f"llama.cpp's {kind} stores blocks of {BLOCK} values; this model's head_dim "
                                 f"({width}) is not a multiple of {BLOCK}")
        if self.attn_rot:
            self.rotation_k = rotation_size(key_states.shape[-1], self.type_k, "key")
            self.rotation_v = rotation_size(value_states.shape[-1], self.type_v, "value")

    def _store(self, states: torch.Tensor, kind: str, rotation: int | None):
        if kind in PLAIN_TYPES:
            return states.to(PLAIN_TYPES[kind])
        return quantize(rotate(states.to(torch.float32), rotation), kind)

    def _load(self, state, rotation: int | None) -> torch.Tensor:
        if not isinstance(state, Blocks):
            return state.to(self.dtype)
        return rotate(dequantize(state), rotation).to(self.dtype)

    def _quantize(self, tensor, axis):
        """transformers' hook (`axis` carries the role, "key" or "value"): the stored form of `tensor`."""
        key = axis == "key"
        return self._store(tensor, self.type_k if key else self.type_v, self.rotation_k if key else self.rotation_v)

    def _dequantize(self, q_tensor):
        """transformers' hook: one of this layer's stored states read back in the model's dtype, rotated back."""
        return self._load(q_tensor, self.rotation_k if q_tensor is self._quantized_keys else self.rotation_v)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store the new states (quantized at once, or in the residual until `residual_length` have gathered)
        and return every held position's keys and values, (batch, kv_heads, held, head_dim), as attention
        reads them: stored ones de-quantized and rotated back, residual ones as they are."""
        prefill = not self.is_initialized
        if prefill:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        keys = torch.cat([self.keys, key_states], dim=-2) if self.keys.dim() == 4 else key_states
        values = torch.cat([self.values, value_states], dim=-2) if self.values.dim() == 4 else value_states
        if prefill or keys.shape[-2] >= self.residual_length:
            self._quantized_keys = _concat(self._quantized_keys, self._store(keys, self.type_k, self.rotation_k))
            self._quantized_values = _concat(self._quantized_values,
                                             self._store(values, self.type_v, self.rotation_v))
            self.keys = torch.tensor([], dtype=self.dtype, device=self.device)
            self.values = torch.tensor([], dtype=self.dtype, device=self.device)
        else:
            self.keys, self.values = keys, values
        return self._read()

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._load(self._quantized_keys, self.rotation_k), self._load(self._quantized_values,
                                                                                     self.rotation_v)
        if self.keys.dim() == 4:
            keys, values = torch.cat([keys, self.keys], dim=-2), torch.cat([values, self.values], dim=-2)
        return keys, values

    def held_tokens(self) -> int:
        """Positions held: stored and residual."""
        return _tokens(self._quantized_keys) + (self.keys.shape[-2] if self.keys is not None and self.keys.dim() == 4
                                                else 0)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search): stored states and residual alike."""
        if not self.is_initialized:
            return
        pick = lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device))  # noqa: E731
        self._quantized_keys = _map(self._quantized_keys, pick)
        self._quantized_values = _map(self._quantized_values, pick)
        if self.keys.dim() == 4:
            self.keys, self.values = pick(self.keys), pick(self.values)


class GGMLSlidingLayer(GGMLQuantizedLayer):
    """A sliding-window layer stored as `GGMLQuantizedLayer` stores: after each update it keeps the last
    `sliding_window - 1` positions, as transformers' `DynamicSlidingWindowLayer` does (the token being fed makes
    the window); each position is its own blocks, so the oldest are dropped exactly. Masks as
    `DynamicSlidingWindowLayer.get_mask_sizes`."""

    is_sliding = True

    def __init__(self, sliding_window: int, type_k: str = DEFAULT_TYPE, type_v: str = DEFAULT_TYPE,
                 attn_rot: bool = True, residual_length: int = 0):
        super().__init__(type_k, type_v, attn_rot, residual_length)
        self.sliding_window = sliding_window

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        drop = self.held_tokens() - (self.sliding_window - 1)
        stored = _tokens(self._quantized_keys)
        if drop > 0:
            from_stored = min(drop, stored)
            keep = lambda tensor: tensor[:, :, from_stored:].clone()  # noqa: E731
            self._quantized_keys = _map(self._quantized_keys, keep)
            self._quantized_values = _map(self._quantized_values, keep)
            if drop > from_stored:
                self.keys = self.keys[..., drop - from_stored:, :].clone()
                self.values = self.values[..., drop - from_stored:, :].clone()
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the attention mask, as `DynamicSlidingWindowLayer`'s."""
        is_full = self.cumulative_length >= self.sliding_window
        kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
        kv_length = self.sliding_window - 1 + query_length if is_full else self.cumulative_length + query_length
        return kv_length, kv_offset

    def get_max_length(self) -> int:
        return self.sliding_window


class GGMLQuantizedCache(Cache):
    """A cache of `GGMLQuantizedLayer`s for `config`'s model, as llama.cpp's `-ctk type_k -ctv type_v` cache
    stores it; pass it as `model.generate(..., cache=cache)` or to forward calls.

    Args:
        config: the model's config (its layer types are read).
        type_k, type_v: llama.cpp's cache types (KV_TYPES: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1).
        attn_rot: rotate as llama.cpp does (False: as `LLAMA_ATTN_ROT_DISABLE=1`).
        residual_length: newest decoded tokens kept in full precision (0, llama.cpp's: none).
        sliding: `quantize` (sliding-window layers stored the same way, as llama.cpp does) or `keep`
            (transformers' `DynamicSlidingWindowLayer`).

    Raises:
        ValueError: knobs outside their values (the message lists them), or a model with nothing to store.
    """

    def __init__(self, config, type_k: str = DEFAULT_TYPE, type_v: str = DEFAULT_TYPE, attn_rot: bool = True,
                 residual_length: int = 0, sliding: str = "quantize"):
        check_knobs(type_k, type_v, attn_rot, residual_length)
        if sliding not in SLIDING_CHOICES:
            raise ValueError(f"sliding must be one of {list(SLIDING_CHOICES)}, got {sliding!r}")
        knobs = {"type_k": type_k, "type_v": type_v, "attn_rot": attn_rot, "residual_length": residual_length}
        window = (lambda size: GGMLSlidingLayer(size, **knobs)) if sliding == "quantize" else None
        super().__init__(layers=quantize_full_layers(config, lambda: GGMLQuantizedLayer(**knobs), window))
