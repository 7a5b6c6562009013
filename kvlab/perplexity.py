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
    ids = input_ids.reshape(1, -1) if input_ids.ndim == 1 else input_ids
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must be one sequence of at least 2 tokens; got shape {tuple(input_ids.shape)}")
    cache = make_cache()
    if cache is None:
        raise ValueError("make_cache must return a transformers Cache, got None")
    device = next(model.parameters()).device
    ids = ids.to(device)
    nll: list[float] = []
    with torch.inference_mode():
        for position in range(1, ids.shape[1]):
            if stop_event is not None and stop_event.is_set():
                break
            logits = model(input_ids=ids[:, position - 1:position], cache=cache, use_cache=True).logits
            log_probs = torch.log_softmax(logits[0, -1].float(), dim=-1)
            value = -float(log_probs[ids[0, position]])
            nll.append(value)
            if on_token is not None:
                on_token(position, value, cache_bytes(cache))
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
