"""Streaming perplexity: StreamingLLM's perplexity view of the quality report, and the curves' summaries.

This is how StreamingLLM (Xiao et al. 2023, arXiv:2309.17453) compares dense, window and attention-sink
caches: every token of a long text is predicted from what the cache still holds at that point. It is the
quality report (`kvlab.quality.report.run_report`) with a one-token context, no reference and its per-token
NLL curve (`run_perplexity`): the same columns (`perplexity_columns`, the report's with two aliases and the
sink defaults), the same teacher-forcing loop (`kvlab.engine.teacher_force`), the same default text (the
shipped one, `kvlab.quality.defaults.shipped_text`). The caches are ordinary strategies from the registry
(`dynamic` keeps everything, `sink` with `num_sink_tokens: 0` is the paper's window-attention baseline,
`sink` is StreamingLLM, `sliding_window` the model's own window). `ppl_by_segment` and `moving_log_ppl`
summarise a curve. Pure backend: no gradio, no plotting, no model loading.
"""

from __future__ import annotations

import math
import threading

import torch

from ..columns import Column
from .report import Split, column_refusal, report_columns, run_report

DEFAULT_STRATEGIES = "dynamic,sink:num_sink_tokens=0,sink"
"""The paper's three curves: dense, window attention, attention sinks."""
DEFAULT_WINDOW = 256
DEFAULT_SINKS = 4
ALIASES = {"dense": {"strategy": "dynamic"}, "window": {"strategy": "sink", "num_sink_tokens": 0}}
"""Older names accepted on input (`dense`, `window`); results always carry the strategy's own name."""


def _resolve(spec: dict, window: int, sinks: int) -> dict:
    """`spec` with the aliases (`dense`, `window`) replaced and a sink column's unset window and sinks filled."""
    alias = ALIASES.get(spec.get("strategy"))
    if alias is not None:
        spec = {**alias, **{key: value for key, value in spec.items() if key != "strategy"}}
    if spec.get("strategy") == "sink":
        spec.setdefault("window_length", window)
        spec.setdefault("num_sink_tokens", sinks)
    return spec


def perplexity_columns(specs, window: int = DEFAULT_WINDOW, sinks: int = DEFAULT_SINKS) -> list[Column]:
    """The columns of a perplexity run, checked without a model: the report's columns (`report_columns`,
    strict: the first one that cannot run is raised), `dense` and `window` read as `dynamic` and
    `sink:num_sink_tokens=0`, and `window`, `sinks` the `window_length` and `num_sink_tokens` of sink columns
    that do not set them.

    Raises:
        StrategyError: an unknown name or knob, a bad knob value or one not written as key=value, a strategy
            that keeps no cache, an engine column (a Compare and report column only), two columns with one label,
            or a cache budget.
        ValueError: nothing picked, or more than the report's MAX_REPORT_COLUMNS.
    """
    return report_columns(specs, strict=True, prepare=lambda spec: _resolve(spec, window, sinks),
                          empty=f"pick at least one cache, e.g. {DEFAULT_STRATEGIES}", engines=False)


def refusals(loaded, columns: list[Column], tokens: int) -> dict[str, str]:
    """Label -> why a column cannot stream a text of `tokens` tokens on `loaded` (the report's own check,
    `column_refusal`, for a one-token context and `tokens - 1` scored tokens: it cannot run on this model or
    machine, or its cache cannot hold that split); the columns not named can run."""
    split = Split(1, tokens - 1)
    return {column.describe(): reason for column in columns if (reason := column_refusal(loaded, column, split)[1])}


def run_perplexity(loaded, input_ids: torch.Tensor, columns: list[Column], stop: threading.Event | None = None):
    """StreamingLLM's perplexity run: the quality report (`kvlab.quality.report.run_report`) with a one-token
    context and every other token of the text scored one per forward through each column's own cache, in turns,
    with no reference (each column's own NLL) and its per-token curve: `TokenScored(column, position, nll,
    cache_bytes)` for position 1..seq-1, around the run protocol's events (`kvlab.protocol`). Token p is
    predicted from what each cache still holds after tokens 0..p-1 went through it one at a time.

    Raises:
        ValueError: not one sequence of at least 2 tokens, or as `run_report`.
    """
    ids = input_ids.reshape(1, -1) if input_ids.ndim == 1 else input_ids
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"input_ids must be one sequence of at least 2 tokens; got shape {tuple(input_ids.shape)}")
    tokens = ids.shape[1]
    return run_report(loaded, ids, columns, scored_tokens=tokens - 1, context_tokens=1, stop=stop,
                      progress_every=tokens, warm_up=False, reference=None, curve=True)


def ppl_by_segment(nll: list[float], segment_len: int) -> list[dict]:
    """Perplexity of consecutive segments of an NLL list.

    Args:
        nll: per-token negative log-likelihoods in nats (one column's curve from `run_perplexity`).
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


def moving_log_ppl(nll: list[float], span: int) -> list[float]:
    """Log-perplexity over the last `span` tokens at each position (the paper's running view), in nats."""
    out, total = [], 0.0
    for i, value in enumerate(nll):
        total += value
        if i >= span:
            total -= nll[i - span]
        out.append(total / min(i + 1, span))
    return out
