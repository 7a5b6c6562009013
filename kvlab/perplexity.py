"""Streaming perplexity: feed a long text token by token through a KV cache and record each NLL.

This is how StreamingLLM (Xiao et al. 2023, arXiv:2309.17453) compares dense,
window and attention-sink caches: every token is predicted from what the cache
still holds at that point. `stream_nll` measures (with an optional per-token
callback for a live view and a stop event); `ppl_by_segment` summarises. Pure
backend: no gradio, no plotting, no model loading.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch

from .accounting import cache_bytes
from .compute import compute_iter


def stream_nll(
    model,
    input_ids: torch.Tensor,
    make_cache: Callable[[], object],
    *,
    stop_event: threading.Event | None = None,
    on_token: Callable[[int, float, int], None] | None = None,
) -> list[float]:
    """Negative log-likelihood of each token of `input_ids` given the tokens before it, one forward per token.

    Args:
        model: a causal LM taking `input_ids`, `cache`, `use_cache` and returning `.logits`.
        input_ids: (1, seq) or (seq,) token ids, seq >= 2.
        make_cache: returns the fresh transformers `Cache` to stream through
            (e.g. `lambda: DynamicCache(config=model.config)` or a `SinkCache`).
        stop_event: when set, streaming stops after the current token and the
            NLLs so far are returned.
        on_token: called after each token as `on_token(position, nll, cache_bytes)`:
            `position` is the index in `input_ids` of the token just scored (1..seq-1),
            `nll` its NLL in nats, `cache_bytes` the bytes the cache holds then
            (see `kvlab.accounting.cache_bytes`).

    Returns:
        `nll` with `nll[i]` the NLL, in nats, of token i + 1 (length seq - 1, or
        fewer if stopped).

    Raises:
        ValueError: `input_ids` is not one sequence of at least 2 tokens, or
            `make_cache` returned None.
    """
    nll: list[float] = []
    for _, position, value, size in stream_many(model, input_ids, {"cache": make_cache}, stop_event):
        nll.append(value)
        if on_token is not None:
            on_token(position, value, size)
    return nll


def ppl_by_segment(nll: list[float], segment_len: int) -> list[dict]:
    """Perplexity of consecutive segments of an NLL list.

    Args:
        nll: per-token negative log-likelihoods in nats (as from `stream_nll`).
        segment_len: tokens per segment, >= 1; the last segment may be shorter.

    Returns:
        One dict per segment: `start`, `end` (half-open indices into `nll`) and
        `ppl` = exp(mean NLL over the segment).

    Raises:
        ValueError: `segment_len` < 1.
    """
    if isinstance(segment_len, bool) or not isinstance(segment_len, int) or segment_len < 1:
        raise ValueError(f"segment_len must be an integer >= 1 (tokens); got {segment_len!r}")
    segments = []
    for start in range(0, len(nll), segment_len):
        part = nll[start:start + segment_len]
        segments.append({"start": start, "end": start + len(part), "ppl": math.exp(sum(part) / len(part))})
    return segments


STRATEGY_NAMES = ("dense", "window", "sink", "sliding_window")
"""Caches the perplexity view compares: dense (DynamicCache, keeps all), window (the
paper's window-attention baseline: a sink cache with 0 sinks), sink (StreamingLLM)
and the model's own sliding_window layers where it has them."""
DEFAULT_MAX_TOKENS = 4096


def default_text() -> str:
    """A long real text present on every machine: Python's own help topics (`pydoc_data.topics`)."""
    from pydoc_data.topics import topics

    return "\n".join(topics.values())


def cache_makers(loaded, names, window: int, sinks: int) -> dict[str, Callable[[], object]]:
    """name -> fresh-cache factory for the perplexity view.

    Raises:
        ValueError: an unknown name (listing STRATEGY_NAMES), invalid window/sinks,
            or a cache the model cannot use (e.g. sliding_window on a model
            without sliding layers, sink on an unsupported model), with the reason.
    """
    from transformers import DynamicCache

    from .sink_cache import SinkCache, unsupported_reason, validate_knobs
    from .strategies.base import sliding_layer_types

    makers = {}
    for name in names:
        if name in ("dense", "dynamic"):
            makers["dense"] = DynamicCache
        elif name in ("window", "sink"):
            count = 0 if name == "window" else sinks
            validate_knobs(window, count)
            reason = unsupported_reason(loaded.config)
            if reason:
                raise ValueError(f"{name}: {reason}")
            makers[name] = lambda count=count: SinkCache.from_model(loaded.model, window, count)
        elif name == "sliding_window":
            if not sliding_layer_types(loaded):
                raise ValueError("sliding_window: this model has no sliding-window layers; it is model-native only")
            makers[name] = lambda: DynamicCache(config=loaded.config)
        else:
            raise ValueError(f"unknown perplexity strategy {name!r}; allowed: {', '.join(STRATEGY_NAMES)}")
    return makers


def stream_many(model, input_ids: torch.Tensor, makers: dict[str, Callable[[], object]],
                stop_event: threading.Event | None = None):
    """Stream one text through several caches in turns, one token each per round.

    Yields `(name, position, nll, cache_bytes)` as `stream_nll`'s callback would
    get them, so a live view can draw every curve as it grows.

    Raises:
        ValueError: as `stream_nll`.
    """
    if not makers:
        raise ValueError("pick at least one cache")
    ids = input_ids.reshape(1, -1) if input_ids.ndim == 1 else input_ids
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must be one sequence of at least 2 tokens; got shape {tuple(input_ids.shape)}")
    caches = {name: make() for name, make in makers.items()}
    if any(cache is None for cache in caches.values()):
        raise ValueError("make_cache must return a transformers Cache, got None")
    device = next(model.parameters()).device
    return compute_iter(_stream(model, ids.to(device), caches, stop_event))


def _stream(model, ids: torch.Tensor, caches: dict, stop_event: threading.Event | None):
    # Each forward has its own inference_mode block: the steps run on the shared compute thread, where other
    # work runs between them, so no thread-local torch state may stay open across a yield.
    for position in range(1, ids.shape[1]):
        for name, cache in caches.items():
            if stop_event is not None and stop_event.is_set():
                return
            with torch.inference_mode():
                logits = model(input_ids=ids[:, position - 1:position], cache=cache, use_cache=True).logits
                value = -float(torch.log_softmax(logits[0, -1].float(), dim=-1)[ids[0, position]])
            yield name, position, value, cache_bytes(cache)


def moving_log_ppl(nll: list[float], span: int) -> list[float]:
    """Log-perplexity over the last `span` tokens at each position (the paper's running view), in nats."""
    out, total = [], 0.0
    for i, value in enumerate(nll):
        total += value
        if i >= span:
            total -= nll[i - span]
        out.append(total / min(i + 1, span))
    return out
