"""The quality report: every cache column scored against a dense reference over one text, token by token.

Protocol (kvpress's for the eviction methods, llama.cpp's `llama-perplexity --kl-divergence` for the figures):
the text's first `context_tokens` tokens are the context, prefilled through each column's cache with the
strategy's own prefill (`Strategy.forward` on an empty cache: an eviction method compresses there exactly as
Compare's prefill does, a sink cache streams in window-sized chunks, a quantized cache quantizes it); the
next `scored_tokens` tokens are then fed one token per forward (`compress_every` acts as while decoding).
A dense reference (`dynamic`) does the same, and the columns take turns beside it, one token each per round.
Per token: the NLL of the true next token under both, KL(dense || column) over the whole vocabulary and
whether the two top-1 tokens agree (`kvlab.quality.stats.score_tokens`), accumulated by `RunningQuality`.
Every column's distribution at a token comes from the engine's one teacher-forcing loop
(`kvlab.engine.teacher_force`), so a token is predicted from what the cache holds as it would while decoding.

`run_report` yields small typed events: `ReportStarted`, `ReportProgress` every `progress_every` tokens per
column, `ReportColumnError` (a column that cannot run or fails gets its own message; the others finish) and
one `ReportDone` with the record (`record.build_record`). A `stop` event ends the run after the current round,
keeping every token scored. Each column's step runs on kvlab's compute thread (`kvlab.compute`). This module
runs the model; it does not render or write files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..compare.columns import Column
from ..compute import compute
from ..engine import teacher_force
from ..measure.warmup import warm_up_columns
from ..strategies import make_strategy
from ..strategies.base import split_strategy_list
from .record import build_record, column_entry, figure_row
from .stats import RunningQuality, score_tokens

REFERENCE = "dynamic"
"""The dense reference every column is scored against."""
DEFAULT_SCORED_TOKENS = 512
DEFAULT_MAX_TOKENS = 4096
"""Tokens of the text a report reads by default (the context is the rest after the scored tokens)."""
PROGRESS_EVERY = 32
MAX_REPORT_COLUMNS = 40


@dataclass(frozen=True)
class Split:
    """How a column's text is split: `context_tokens` prefilled at once, then `scored_tokens` fed one per forward
    and scored (the first scored token is predicted by the prefill's last position)."""

    context_tokens: int
    scored_tokens: int


@dataclass(frozen=True)
class ReportStarted:
    """The run's column names (in order) and the split they share."""

    columns: tuple[str, ...]
    split: Split


@dataclass(frozen=True)
class ReportProgress:
    """Column `column` after `scored` tokens: its figure row (`record.figure_row`) and the cache's exact bytes now."""

    column: str
    scored: int
    figures: dict
    cache_bytes: int


@dataclass(frozen=True)
class ReportColumnError:
    """Column `column` cannot run or failed; `message` is one line. The other columns go on."""

    column: str
    message: str


@dataclass(frozen=True)
class ReportDone:
    """The run ended: the JSON record, its wall time (s) and whether it was stopped."""

    record: dict
    wall_s: float
    stopped: bool = False


ReportEvent = ReportStarted | ReportProgress | ReportColumnError | ReportDone


def parse_columns(specs) -> list[Column]:
    """Columns from a comma list in compare syntax (`quantized:backend=quanto:nbits=4,snapkv:compression_ratio=0.5`)
    or a list of items / spec dicts / Strategies. A bad item becomes a rejected column (its reason in
    `Column.rejected`); so does a second column of the same name and a column with a cache budget.

    Raises:
        ValueError: no columns, or more than MAX_REPORT_COLUMNS.
    """
    items = split_strategy_list(specs) if isinstance(specs, str) else list(specs)
    if not items:
        raise ValueError("pick at least one column, e.g. quantized:backend=quanto:nbits=4")
    if len(items) > MAX_REPORT_COLUMNS:
        raise ValueError(f"at most {MAX_REPORT_COLUMNS} columns, got {len(items)}")
    columns, seen = [], set()
    for item in items:
        column = Column.from_text(item) if isinstance(item, str) else Column.or_rejected(item) \
            if isinstance(item, dict) else Column.from_spec(item)
        name = column.describe()
        if column.budget is not None:
            column = Column(None, rejected="a report column takes a strategy and its knobs; budget_mib is Compare's",
                            title=name)
        elif name in seen:
            column = Column(None, rejected=f"{name!r} is picked twice: give each column different knobs", title=name)
        seen.add(name)
        columns.append(column)
    return columns


def check_split(total_tokens: int, scored_tokens: int, context_tokens: int | None = None) -> Split:
    """The split of a text of `total_tokens`: `context_tokens` (default: the rest) then `scored_tokens`.

    Raises:
        ValueError: fewer than 1 scored or context token, or more than the text holds.
    """
    if not isinstance(scored_tokens, int) or scored_tokens < 1:
        raise ValueError(f"scored tokens must be a whole number >= 1, got {scored_tokens!r}")
    context = total_tokens - scored_tokens if context_tokens is None else context_tokens
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"the context must hold at least 1 token: the text has {total_tokens} tokens and "
                         f"{scored_tokens} are scored (give fewer scored tokens or a longer text)")
    if context + scored_tokens > total_tokens:
        raise ValueError(f"{context} context + {scored_tokens} scored tokens is more than the text's "
                         f"{total_tokens} tokens")
    return Split(context, scored_tokens)


@dataclass
class _Track:
    """One scored cache: its strategy, teacher-forcing decoder, running figures, bytes and forward times."""

    name: str
    strategy: object
    decoder: object = None
    quality: RunningQuality = field(default_factory=RunningQuality)
    bytes_total: int = 0
    bytes_now: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0

    def start(self, loaded, ids: torch.Tensor, split: Split, stop) -> None:
        cache = self.strategy.build_cache(loaded, split.context_tokens + split.scored_tokens)
        targets = ids[0, split.context_tokens:split.context_tokens + split.scored_tokens].tolist()
        self.decoder = teacher_force(loaded, self.strategy, cache, ids[:, :split.context_tokens], targets,
                                     stop=stop, measure_bytes=True)

    def step(self):
        """One teacher-forced step; returns its `Step` (None once stopped)."""
        step = next(self.decoder, None)
        if step is None:
            return None
        if step.index == 0:
            self.prefill_s = step.per_token_s
        else:
            self.decode_s += step.per_token_s
        self.bytes_now = step.cache_bytes
        self.bytes_total += step.cache_bytes
        self.steps += 1
        return step

    def cost(self) -> dict:
        """Cache bytes (mean over the scored steps, at the end), decode tok/s and prefill seconds."""
        n = self.steps
        return {"scored_tokens": n, "cache_bytes_mean": self.bytes_total / n if n else None,
                "cache_bytes_end": self.bytes_now if n else None,
                "decode_tok_s": (n - 1) / self.decode_s if n > 1 and self.decode_s > 0 else None,
                "prefill_s": self.prefill_s if n else None}

    def figures(self, reference: "_Track") -> dict:
        return figure_row(self.quality.figures(), self.cost(), reference.cost()["cache_bytes_mean"])


def _refusal(loaded, column: Column, split: Split) -> str:
    """Why `column` cannot run this split here ('' when it can)."""
    if column.rejected:
        return column.rejected
    strategy = column.strategy
    if not strategy.usable_in_perplexity:
        return f"{strategy.name} keeps no cache, so a text cannot be fed through it token by token"
    reason = strategy.unavailable_reason(loaded)
    if reason:
        return reason
    try:
        strategy.check_fits(split.context_tokens, split.scored_tokens)
    except ValueError as err:
        return str(err)
    return ""


def _message(err: Exception) -> str:
    return str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"


def _round(reference: _Track, tracks: list[_Track], target: int, errors: dict[str, str]) -> list[ReportColumnError]:
    """One token for the reference, then for each column in turn (on the compute thread), scored against it."""
    dense = compute(reference.step)
    if dense is None:
        return []
    base = dense.logits[None]
    index = torch.tensor([target], device=base.device)
    failed = []
    for track in tracks:
        if track.name in errors:
            continue
        try:
            step = compute(track.step)
            if step is None:
                continue
            scores = score_tokens(base, step.logits[None], index)
            track.quality.add(float(scores.nll_base[0]), float(scores.nll[0]), float(scores.kl[0]),
                              bool(scores.same_top[0]))
        except Exception as err:  # noqa: BLE001 - a failing cache ends its own column only
            errors[track.name] = _message(err)
            failed.append(ReportColumnError(track.name, errors[track.name]))
    return failed


def run_report(loaded, ids: torch.Tensor, specs, *, scored_tokens: int = DEFAULT_SCORED_TOKENS,
               context_tokens: int | None = None, stop: threading.Event | None = None,
               progress_every: int = PROGRESS_EVERY, text_info: dict | None = None,
               warm_up: bool = True) -> Iterator[ReportEvent]:
    """Score every column of `specs` against the dense reference on `ids` (see the module docstring).

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        ids: (1, seq) or (seq,) token ids of the text.
        specs: columns, as `parse_columns` takes them.
        scored_tokens, context_tokens: the split (`check_split`; the context defaults to the rest of the text).
        progress_every: a `ReportProgress` per column every this many tokens (and after the last).
        text_info: what the record says about the text (name, licence, ...).
        warm_up: pay each strategy's one-time set-up before the first timed forward.

    Raises:
        ValueError: no columns, too many, or a split the text cannot give (before any compute).
    """
    started = time.perf_counter()
    stop = stop or threading.Event()
    ids = ids.reshape(1, -1).to(loaded.device)
    split = check_split(ids.shape[1], scored_tokens, context_tokens)
    columns = parse_columns(specs)
    names = [column.describe() for column in columns]
    yield ReportStarted(tuple(names), split)
    errors: dict[str, str] = {}
    for name, column in zip(names, columns):
        reason = _refusal(loaded, column, split)
        if reason:
            errors[name] = reason
            yield ReportColumnError(name, reason)
    reference = _Track(REFERENCE, make_strategy({"strategy": REFERENCE}))
    tracks = [_Track(name, column.strategy) for name, column in zip(names, columns) if name not in errors]
    if warm_up:
        compute(warm_up_columns, loaded, [reference.strategy, *(t.strategy for t in tracks)], split.context_tokens)
    reference.start(loaded, ids, split, stop)
    for track in tracks:
        try:
            track.start(loaded, ids, split, stop)
        except Exception as err:  # noqa: BLE001 - a cache that cannot be built ends its own column only
            errors[track.name] = _message(err)
            yield ReportColumnError(track.name, errors[track.name])
    targets = ids[0, split.context_tokens:split.context_tokens + split.scored_tokens].tolist()
    for t, target in enumerate(targets):
        if stop.is_set():
            break
        yield from _round(reference, tracks, target, errors)
        if (t + 1) % progress_every == 0 or t + 1 == len(targets):
            for track in tracks:
                if track.name not in errors and track.quality.n_tokens:
                    yield ReportProgress(track.name, track.quality.n_tokens, track.figures(reference),
                                         track.bytes_now)
    wall_s = time.perf_counter() - started
    record = _record(loaded, split, text_info, zip(names, columns), tracks, reference, errors, wall_s, stop.is_set())
    yield ReportDone(record, wall_s, stop.is_set())


def _record(loaded, split, text_info, named_columns, tracks, reference, errors, wall_s, stopped) -> dict:
    entries = []
    for name, column in named_columns:
        track = next((t for t in tracks if t.name == name), None)
        figures = track.figures(reference) if track is not None and track.quality.n_tokens else None
        entries.append(column_entry(name, column, split, errors.get(name, ""), figures,
                                    track.quality.n_tokens if track is not None else 0,
                                    track.strategy.runtime_note() if track is not None else ""))
    reference_row = {"name": REFERENCE, **reference.cost()}
    return build_record(loaded.info(), split, text_info or {}, entries, reference_row, wall_s, stopped)
