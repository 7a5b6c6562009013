"""StreamingLLM's attention-sink KV cache for transformers 5 (`SinkCache` was removed there).

Xiao, Tian, Chen, Han, Lewis, "Efficient Streaming Language Models with Attention
Sinks", 2023, arXiv:2309.17453. Each decoder layer keeps at most `window_length`
tokens: the first `num_sink_tokens` tokens ever seen (the attention sinks) plus the
most recent `window_length - num_sink_tokens`. `num_sink_tokens=0` is the paper's
window-attention baseline.

What it does:

- Positions follow the paper: a token sits at its index inside the cache, so
  `get_seq_length()` is the number of tokens held (at most `window_length`) and a
  model called without `position_ids` keeps its positions inside the window.
- Eviction happens before attention, so a single-token step attends to exactly
  `window_length` keys (itself included), as in the paper.
- Cached keys carry rotary position embedding (RoPE). When the window slides,
  the kept recent keys are re-rotated to their new, smaller positions (a pure
  rotation by the position delta, computed from the model's `inv_freq`).
- If the model is called with explicit `position_ids` that run past the cache
  (as `generate()` does: it counts every token seen), the keys returned for
  attention are rotated into the query's frame, so relative distances stay the
  paper's. Stored keys always stay at their cache positions.

What it does not do:

- Serve models whose layers are not all full attention (sliding, chunked,
  linear, shared), RoPE types whose frequencies change with length (`dynamic`,
  `longrope`), partial rotary, or model families outside `kvlab.caches.rotary.SUPPORTED_MODEL_TYPES`
  (re-rotation assumes the rotate-half layout over the whole head). These raise
  `ValueError` with the reason; `kvlab.caches.rotary.unsupported_reason(config)` says it up front.
- Padded batches: rows must share positions (left padding raises `ValueError`
  when positions are visible to the cache, and is otherwise not supported).
- Rollback (`crop`): evicted tokens are gone.
- A prompt fed in one forward pass attends densely within itself, then only the
  window is kept. `prefill_in_chunks` feeds it in window-sized chunks instead.
- Each slide re-rotates the kept keys in their storage dtype; in fp32 the drift
  is at rounding level, in bf16/fp16 it accumulates over long runs.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..models.loading import head_dim
from .rotary import SUPPORTED_ROPE_TYPES, KeyRerotator, inv_freq_from_config, unsupported_reason

DEFAULT_NUM_SINK_TOKENS = 4
"""The paper's choice: four initial tokens suffice as attention sinks."""


def validate_knobs(window_length, num_sink_tokens) -> None:
    """Check the two knobs of a sink cache.

    Args:
        window_length: tokens kept per layer, an int >= 1.
        num_sink_tokens: initial tokens kept forever, an int with
            0 <= num_sink_tokens < window_length.

    Raises:
        ValueError: a knob is not an int or is out of range; the message gives the
            allowed range and the value given.
    """
    if isinstance(window_length, bool) or not isinstance(window_length, int) or window_length < 1:
        raise ValueError(f"window_length must be an integer >= 1 (tokens kept per layer); got {window_length!r}")
    if (
        isinstance(num_sink_tokens, bool)
        or not isinstance(num_sink_tokens, int)
        or not 0 <= num_sink_tokens < window_length
    ):
        raise ValueError(
            f"num_sink_tokens must be an integer with 0 <= num_sink_tokens < window_length "
            f"(0..{window_length - 1} for window_length={window_length}); got {num_sink_tokens!r}"
        )


def _query_start(kwargs: dict, default: int) -> int:
    """Position of the first incoming token as the model rotated it, from the `position_ids`
    the attention layer forwards to `Cache.update` (Llama-style models pass them under `kwargs`)."""
    inner = kwargs.get("kwargs")
    source = inner if isinstance(inner, dict) else kwargs
    position_ids = source.get("position_ids")
    if not isinstance(position_ids, torch.Tensor) or position_ids.numel() == 0:
        return default
    if position_ids.numel() == position_ids.shape[-1]:
        return int(position_ids.reshape(-1)[0])
    starts = position_ids.reshape(-1, position_ids.shape[-1])[:, 0]
    if not bool((starts == starts[0]).all()):
        raise ValueError(
            "SinkCache needs every row of the batch at the same positions (no padding); got start positions "
            f"{starts.tolist()}"
        )
    return int(starts[0])


class SinkLayer(CacheLayerMixin):
    """One decoder layer's attention-sink cache (StreamingLLM, arXiv:2309.17453).

    Holds `keys` and `values` of shape (batch, kv_heads, held, head_dim) with
    held <= `window_length`: the first `num_sink_tokens` tokens ever seen, then the
    most recent ones. Token i of the cache has its key rotated at position i.

    Args:
        window_length: tokens kept, >= 1.
        num_sink_tokens: initial tokens kept forever, 0 <= num_sink_tokens < window_length.
        rerotator: moves keys between positions; None for keys without rotary
            position embedding (nothing is re-rotated).

    Raises:
        ValueError: invalid knobs (see `validate_knobs`).
    """

    is_sliding = False
    is_croppable = False

    def __init__(self, window_length: int, num_sink_tokens: int = DEFAULT_NUM_SINK_TOKENS,
                 rerotator: KeyRerotator | None = None):
        validate_knobs(window_length, num_sink_tokens)
        super().__init__()
        self.window_length = window_length
        self.num_sink_tokens = num_sink_tokens
        self.rerotator = rerotator
        self.seen_tokens = 0
        self.evicted_tokens = 0

    def __repr__(self):
        return f"SinkLayer(window_length={self.window_length}, num_sink_tokens={self.num_sink_tokens})"

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Create empty (batch, kv_heads, 0, head_dim) tensors like the incoming states."""
        self.device = key_states.device
        self.keys = key_states.new_zeros((*key_states.shape[:-2], 0, key_states.shape[-1]))
        self.values = value_states.new_zeros((*value_states.shape[:-2], 0, value_states.shape[-1]))
        self.is_initialized = True

    def _evict_before(self, held: int, query_length: int) -> int:
        """Recent tokens dropped before attention so that held + query_length fits the window."""
        overflow = held + query_length - self.window_length
        evictable = held - min(held, self.num_sink_tokens)
        return max(0, min(overflow, evictable))

    def _rotate(self, keys: torch.Tensor, shift: int) -> torch.Tensor:
        return keys if self.rerotator is None else self.rerotator.rotate(keys, shift)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new tokens, evict, and return the keys/values the new queries attend to.

        Args:
            key_states: (batch, kv_heads, q, head_dim), rotated by the model at
                positions p0..p0+q-1 (p0 read from the `position_ids` forwarded by
                the attention layer; the cache's length when absent).
            value_states: (batch, kv_heads, q, head_dim).

        Returns:
            (keys, values) of shape (batch, kv_heads, held - evicted + q, head_dim):
            sinks, kept recent tokens and the new ones, keys rotated in the
            queries' frame. `get_mask_sizes` announces the same length.

        Raises:
            ValueError: batch rows at different positions, or a head_dim the
                rotary embedding does not cover.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.get_seq_length()
        q = key_states.shape[-2]
        evicted = self._evict_before(held, q)
        sinks = min(held, self.num_sink_tokens)
        kept = held - evicted
        query_shift = _query_start(kwargs, default=held) - kept

        # Frames: stored keys sit at their cache index; the queries sit `query_shift` further on.
        sink_keys, recent_keys = self.keys[..., :sinks, :], self.keys[..., sinks + evicted:, :]
        sink_values, recent_values = self.values[..., :sinks, :], self.values[..., sinks + evicted:, :]
        recent_shift = query_shift - evicted
        if recent_shift == 0:
            # The model's default positions: kept recent keys are already where the queries expect
            # them, and recent + new keys move back by the same amount to be stored.
            attend_keys = torch.cat([self._rotate(sink_keys, query_shift), recent_keys, key_states], dim=-2)
            tail_keys = self._rotate(attend_keys[..., sinks:, :], -query_shift)
        else:
            attend_keys = torch.cat(
                [self._rotate(sink_keys, query_shift), self._rotate(recent_keys, recent_shift), key_states], dim=-2)
            tail_keys = torch.cat([self._rotate(recent_keys, -evicted), self._rotate(key_states, -query_shift)],
                                  dim=-2)
        attend_values = torch.cat([sink_values, recent_values, value_states], dim=-2)
        stored_keys = torch.cat([sink_keys, tail_keys], dim=-2)
        stored_values = attend_values
        total = kept + q
        if total > self.window_length:
            recent = self.window_length - self.num_sink_tokens
            shift = total - self.window_length
            stored_keys = torch.cat(
                [stored_keys[..., :self.num_sink_tokens, :],
                 self._rotate(stored_keys[..., total - recent:, :], -shift)], dim=-2)
            stored_values = torch.cat(
                [stored_values[..., :self.num_sink_tokens, :], stored_values[..., total - recent:, :]], dim=-2)
        self.keys, self.values = stored_keys, stored_values
        self.seen_tokens += q
        self.evicted_tokens += held + q - self.keys.shape[-2]
        return attend_keys, attend_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for the mask: kv_length is the length `update` will return;
        kv_offset is the number of tokens evicted before attention, so that the new keys
        line up with the queries at `get_seq_length() + i`."""
        held = self.get_seq_length()
        evicted = self._evict_before(held, query_length)
        return held - evicted + query_length, evicted

    def get_seq_length(self) -> int:
        """Tokens held, at most `window_length` (also the next default position)."""
        if not self.is_initialized or self.keys is None:
            return 0
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        """`window_length`, tokens."""
        return self.window_length

    def reset(self) -> None:
        """Drop the held tokens and the counters."""
        self.keys = self.values = None
        self.is_initialized = False
        self.seen_tokens = 0
        self.evicted_tokens = 0

    def crop(self, tokens_to_remove: int) -> None:
        """Not supported: evicted tokens cannot be restored.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("SinkCache cannot be cropped: tokens it evicted are gone (no assisted decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat the held tokens `repeats` times along the batch dimension."""
        if self.get_seq_length() > 0:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only batch rows `indices`."""
        if self.get_seq_length() > 0:
            self.keys = self.keys[indices, ...]
            self.values = self.values[indices, ...]


class SinkCache(Cache):
    """StreamingLLM attention-sink cache (Xiao et al. 2023, arXiv:2309.17453), one `SinkLayer` per decoder layer.

    Works with `model.generate(..., cache=SinkCache(...))` on a fresh cache and
    with a manual loop `model(input_ids=..., cache=cache, use_cache=True)`. Each
    layer holds at most `window_length` tokens, so cache bytes stop growing at
    2 * layers * kv_heads * window_length * head_dim * element_size.

    Args:
        config: the model's `PreTrainedConfig`.
        window_length: tokens kept per layer (sinks included), >= 1.
        num_sink_tokens: initial tokens kept forever, 0 <= num_sink_tokens <
            window_length; 0 is plain window attention.
        rotary: the model's rotary embedding module (anything with an `inv_freq`
            tensor of shape (head_dim // 2,), e.g. `model.model.rotary_emb`), or
            that tensor; None computes it from `config` (`inv_freq_from_config`).

    Raises:
        ValueError: invalid knobs, a model the cache cannot serve (see
            `unsupported_reason`), or an `inv_freq` that does not match head_dim.
    """

    def __init__(self, config, window_length: int, num_sink_tokens: int = DEFAULT_NUM_SINK_TOKENS,
                 rotary: torch.nn.Module | torch.Tensor | None = None):
        validate_knobs(window_length, num_sink_tokens)
        reason = unsupported_reason(config)
        if reason is not None:
            raise ValueError(f"SinkCache cannot serve this model: {reason}")
        cfg = config.get_text_config(decoder=True)
        if rotary is None:
            inv_freq = inv_freq_from_config(cfg)
        elif isinstance(rotary, torch.Tensor):
            inv_freq = rotary
        else:
            module_type = getattr(rotary, "rope_type", "default")
            if module_type not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"SinkCache cannot serve this model: rotary embedding type {module_type!r} is not one of "
                    f"{SUPPORTED_ROPE_TYPES}"
                )
            inv_freq = getattr(rotary, "inv_freq", None)
            if not isinstance(inv_freq, torch.Tensor):
                raise ValueError("rotary must have an `inv_freq` tensor of shape (head_dim // 2,)")
        if 2 * inv_freq.numel() != head_dim(cfg):
            raise ValueError(
                f"rotary inv_freq has {inv_freq.numel()} frequencies, expected head_dim // 2 = {head_dim(cfg) // 2}"
            )
        self.window_length = window_length
        self.num_sink_tokens = num_sink_tokens
        self.rerotator = KeyRerotator(inv_freq)
        layers = [SinkLayer(window_length, num_sink_tokens, self.rerotator) for _ in range(cfg.num_hidden_layers)]
        super().__init__(layers=layers)

    @classmethod
    def from_model(cls, model, window_length: int, num_sink_tokens: int = DEFAULT_NUM_SINK_TOKENS) -> "SinkCache":
        """A SinkCache using `model.config` and the model's own rotary embedding `inv_freq`.

        Raises:
            ValueError: as the constructor.
        """
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
        rotary = getattr(decoder, "rotary_emb", None)
        return cls(model.config, window_length, num_sink_tokens, rotary=rotary)

    def __repr__(self):
        return (f"SinkCache(window_length={self.window_length}, num_sink_tokens={self.num_sink_tokens}, "
                f"layers={len(self.layers)})")

    @property
    def seen_tokens(self) -> int:
        """Tokens fed through the cache since creation or `reset()`."""
        return self.layers[0].seen_tokens if self.layers else 0

    @property
    def evicted_tokens(self) -> int:
        """Tokens dropped from the cache since creation or `reset()`."""
        return self.layers[0].evicted_tokens if self.layers else 0


def prefill_in_chunks(model, input_ids: torch.Tensor, cache: SinkCache, chunk_size: int | None = None,
                      logits_to_keep: int = 0):
    """Feed a long prompt through `model` chunk by chunk so that it streams through the window.

    One forward over a prompt longer than the window would attend densely within
    the prompt; with `chunk_size <= window_length - num_sink_tokens` (the default)
    every query attends to at most `window_length` keys.

    Args:
        model: a causal LM accepting `cache=` and `use_cache=`.
        input_ids: (batch, seq) token ids, seq >= 1.
        cache: the SinkCache to fill (may already hold tokens).
        chunk_size: tokens per forward, >= 1; defaults to
            `window_length - num_sink_tokens`.
        logits_to_keep: passed to the model; 1 computes only the last position's
            logits, 0 (default) every position's.

    Returns:
        The model output of the last chunk (its `.logits` is (batch, last_chunk, vocab),
        or (batch, logits_to_keep, vocab) when logits_to_keep > 0).

    Raises:
        ValueError: empty `input_ids` or `chunk_size` < 1.
    """
    if chunk_size is None:
        chunk_size = cache.window_length - cache.num_sink_tokens
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1 (tokens per forward); got {chunk_size!r}")
    if input_ids.ndim != 2 or input_ids.shape[-1] == 0:
        raise ValueError(f"input_ids must be (batch, seq) with seq >= 1; got shape {tuple(input_ids.shape)}")
    output = None
    for chunk in input_ids.split(chunk_size, dim=-1):
        output = model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return output
