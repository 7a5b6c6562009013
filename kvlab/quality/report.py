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

An engine column that gives distributions (`engine:llamacpp`) is scored the same way inside its engine
(`EngineColumn.score_text`: the context in one eval, then one token per eval) against the engine's own
unquantized run (`EngineColumn.report_reference`: llama.cpp's f16 cache with the column's other knobs), as
`llama-perplexity --kl-divergence` scores a quantized cache against its f16 base; each column track points to
its reference, one reference per distinct one, made only when some column that needs it passes its refusal
check, and each round steps every reference first, then the columns. Engine references' cost is in the record
(`engine_references`), each column entry names its reference.

`run_report` yields the run protocol's events (`kvlab.protocol`) around its own: `RunStarted` (its plan the
`Split`), `ReportProgress` every `progress_every` tokens per column, `ColumnFailed` (a column that cannot run
or fails gets its own message; the others finish) and one `RunDone` with the record (`record.build_record`);
with `curve`, a `TokenScored` per column and token too. Without a reference (`reference=None`) each column
is scored by its own NLL only: a one-token context, no reference and the curve is StreamingLLM's perplexity
run (`kvlab.quality.perplexity.run_perplexity`). A `stop` event ends the run after the current round, keeping
every token scored. Each column's step runs on kvlab's compute thread (`kvlab.compute`). This module runs the
model; it does not render or write files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..columns import Column, parse_columns
from ..compute import compute
from ..engine import teacher_force
from ..measure.environment import environment
from ..measure.warmup import warm_up_columns
from ..protocol import ColumnFailed, RunDone, RunStarted
from ..strategies import make_strategy
from ..strategies.engine_column import EngineColumn
from .record import build_record, column_entry, figure_row
from .stats import RunningQuality, score_tokens

REFERENCE = "dynamic"
"""The dense reference every column is scored against."""
DEFAULT_SCORED_TOKENS = 512
DEFAULT_MAX_TOKENS = 4096
"""Tokens of the text a report reads by default (the context is the rest after the scored tokens)."""
PROGRESS_EVERY = 32
MAX_REPORT_COLUMNS = 40
EMPTY = "pick at least one column, e.g. quantized:backend=quanto:nbits=4"
"""The line for a report given no column."""
NO_ENGINES = "{name} runs a serving engine, not a transformers cache: this view streams kvlab's caches only"
"""The line for an engine column where a wing takes none (`report_columns(engines=False)`: Perplexity)."""


@dataclass(frozen=True)
class Split:
    """How a column's text is split: `context_tokens` prefilled at once, then `scored_tokens` fed one per forward
    and scored (the first scored token is predicted by the prefill's last position)."""

    context_tokens: int
    scored_tokens: int


@dataclass(frozen=True)
class TokenScored:
    """Column `column` (its index) scored the text's token at `position` (0-based): its NLL in nats under the
    column's cache, and the exact bytes the cache held when it predicted it (the Perplexity view's curve)."""

    column: int
    position: int
    nll: float
    cache_bytes: int


@dataclass(frozen=True)
class ReportProgress:
    """Column `column` after `scored` tokens: its figure row (`record.figure_row`), the cache's exact bytes now and
    the name of the reference it is scored against (`dynamic`, `engine:llamacpp f16`)."""

    column: str
    scored: int
    figures: dict
    cache_bytes: int
    reference: str = REFERENCE


ReportEvent = RunStarted | ReportProgress | TokenScored | ColumnFailed | RunDone


def report_columns(specs, strict: bool = False, prepare=None, empty: str = EMPTY, engines: bool = True
                   ) -> list[Column]:
    """Columns from a comma list in compare syntax (`quantized:backend=quanto:nbits=4,snapkv:compression_ratio=0.5`)
    or a list of items / spec dicts / Strategies (`kvlab.columns.parse_columns`). A bad item becomes a rejected
    column (its reason in `Column.rejected`); so does a second column of the same name, a column with a cache
    budget, a strategy that keeps no cache and an engine column that gives no distributions (or any engine
    column when `engines` is false: the Perplexity view). `strict` raises the first of those instead; `prepare`
    rewrites each spec first and `empty` is the line for no column (the Perplexity view's aliases, defaults and
    words).

    Raises:
        ValueError: no columns, or more than MAX_REPORT_COLUMNS.
        StrategyError: with `strict`, the first column that cannot run.
    """
    return parse_columns(specs, MAX_REPORT_COLUMNS, empty=empty, prepare=prepare, unique=True,
                         budget_refusal="a report column takes a strategy and its knobs; budget_mib is Compare's",
                         check=lambda strategy: _keeps_a_cache(strategy, engines), strict=strict)


def _keeps_a_cache(strategy, engines: bool = True) -> str:
    """Why a text cannot be fed through `strategy` token by token ('' when it can)."""
    if strategy.usable_in_perplexity:
        return ""
    if isinstance(strategy, EngineColumn):
        if not engines:
            return NO_ENGINES.format(name=strategy.name)
        try:
            strategy.report_reference()
        except ValueError as err:
            return str(err)
        return ""
    return f"{strategy.name} keeps no cache, so a text cannot be fed through it token by token"


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
    """One scored cache (column `index`, -1 for the reference): its strategy, teacher-forcing decoder, running
    figures, bytes and forward times."""

    index: int
    name: str
    strategy: object
    reference: "_Track | None" = None
    decoder: object = None
    quality: RunningQuality = field(default_factory=RunningQuality)
    bytes_total: int = 0
    bytes_now: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0
    scored: int = 0

    def start(self, loaded, ids: torch.Tensor, split: Split, stop) -> None:
        end = split.context_tokens + split.scored_tokens
        if isinstance(self.strategy, EngineColumn):
            self.decoder = self.strategy.score_text(loaded, ids[0, :end].tolist(), split.context_tokens, stop,
                                                    torch.get_num_threads())
            return
        cache = self.strategy.build_cache(loaded, end)
        targets = ids[0, split.context_tokens:end].tolist()
        self.decoder = teacher_force(loaded, self.strategy, cache, ids[:, :split.context_tokens], targets,
                                     stop=stop, measure_bytes=True)

    def close(self) -> None:
        """Free what the step loop holds (an engine's context); harmless when nothing is held."""
        close = getattr(self.decoder, "close", None)
        self.decoder = None
        if close is not None:
            close()

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

    def score(self, step, base: torch.Tensor | None, target: int) -> float:
        """The NLL (nats) of `target` under `step`'s logits; against the reference's logits `base` (1, vocab)
        the token's figures (`score_tokens`: both NLLs, KL, top-1) join the running figures too."""
        if base is None:
            nll = -float(torch.log_softmax(step.logits.float(), dim=-1)[target])
        else:
            scores = score_tokens(base, step.logits[None], torch.tensor([target], device=base.device))
            nll = float(scores.nll[0])
            self.quality.add(float(scores.nll_base[0]), nll, float(scores.kl[0]), bool(scores.same_top[0]))
        self.scored += 1
        return nll

    def cost(self) -> dict:
        """Cache bytes (mean over the scored steps, at the end), decode tok/s and prefill seconds."""
        n = self.steps
        return {"scored_tokens": n, "cache_bytes_mean": self.bytes_total / n if n else None,
                "cache_bytes_end": self.bytes_now if n else None,
                "decode_tok_s": (n - 1) / self.decode_s if n > 1 and self.decode_s > 0 else None,
                "prefill_s": self.prefill_s if n else None}

    def figures(self) -> dict | None:
        """The figure row against its reference (None without one, or before the first scored token)."""
        if self.reference is None or not self.quality.n_tokens:
            return None
        return figure_row(self.quality.figures(), self.cost(), self.reference.cost()["cache_bytes_mean"])


def column_refusal(loaded, column: Column, split: Split) -> tuple[str, str]:
    """(status, why) `column` cannot run this split here: `unavailable` on this model or machine, `error` for a
    rejected column or a split it cannot hold; ('', '') when it can."""
    if column.rejected:
        return "error", column.rejected
    strategy = column.strategy
    reason = strategy.unavailable_reason(loaded)
    if reason:
        return "unavailable", reason
    try:
        strategy.check_fits(split.context_tokens, split.scored_tokens)
    except ValueError as err:
        return "error", str(err)
    return "", ""


def _message(err: Exception) -> str:
    return str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"


def _fail(track: _Track, message: str, errors: dict[int, str]) -> ColumnFailed:
    """End `track`'s column with `message` (its engine context freed)."""
    errors[track.index] = message
    track.close()
    return ColumnFailed(track.index, track.name, "error", message)


def _round(references: list[_Track], tracks: list[_Track], target: int, position: int, errors: dict[int, str],
           curve: bool) -> list:
    """One token for every reference first, then for each column in turn (on the compute thread), each column
    scored against its own reference's logits (its own NLL only when it has none); returns the round's
    `ColumnFailed` and (with `curve`) `TokenScored` events. A reference that fails ends the columns scored
    against it."""
    events, bases = [], {}
    for reference in list(references):
        try:
            step = compute(reference.step)
        except Exception as err:  # noqa: BLE001 - a failing reference ends its own columns only
            message = f"its reference {reference.name} failed: {_message(err)}"
            events += [_fail(t, message, errors) for t in tracks if t.reference is reference and t.index not in errors]
            reference.close()
            references.remove(reference)
            continue
        if step is not None:
            bases[id(reference)] = step.logits[None]
    for track in tracks:
        if track.index in errors or (track.reference is not None and id(track.reference) not in bases):
            continue
        try:
            step = compute(track.step)
            if step is None:
                continue
            nll = track.score(step, bases.get(id(track.reference)), target)
        except Exception as err:  # noqa: BLE001 - a failing cache ends its own column only
            events.append(_fail(track, _message(err), errors))
            continue
        if curve:
            events.append(TokenScored(track.index, position, nll, step.cache_bytes))
    return events


def _engine_references(tracks: list[_Track]) -> list[_Track]:
    """One reference track per distinct reference of the engine columns among `tracks` (each track pointed to
    its own); kvlab's columns keep the dense reference they were given."""
    made: dict[str, _Track] = {}
    for track in tracks:
        if isinstance(track.strategy, EngineColumn):
            strategy = track.strategy.report_reference()
            name = strategy.describe()
            track.reference = made.setdefault(name, _Track(-1, name, strategy))
    return list(made.values())


def _start(loaded, ids, split: Split, columns: list[Column], names: list[str], dense: _Track | None, stop,
           errors: dict[int, str], warm_up: bool):
    """Generator: each column that cannot run is a `ColumnFailed`; returns (references, tracks): the references
    the columns that can run need (dense first) and those columns' tracks, warmed up when asked, started (caches
    built, engine contexts open) and ready to prefill."""
    for index, column in enumerate(columns):
        status, reason = column_refusal(loaded, column, split)
        if reason:
            errors[index] = reason
            yield ColumnFailed(index, names[index], status, reason)
    tracks = [_Track(i, names[i], column.strategy, dense) for i, column in enumerate(columns) if i not in errors]
    references = ([dense] if dense is not None else []) + (_engine_references(tracks) if dense is not None else [])
    if warm_up:
        compute(warm_up_columns, loaded, [t.strategy for t in references + tracks], split.context_tokens)
    for track in references + tracks:
        if track.index in errors:
            continue
        try:
            track.start(loaded, ids, split, stop)
        except Exception as err:  # noqa: BLE001 - a cache that cannot be built ends its own column(s) only
            if track.index >= 0:
                yield _fail(track, _message(err), errors)
                continue
            if track is dense:
                raise
            message = f"its reference {track.name} cannot start: {_message(err)}"
            references.remove(track)
            for column in tracks:
                if column.reference is track:
                    yield _fail(column, message, errors)
    return references, tracks


def run_report(loaded, ids: torch.Tensor, specs, *, scored_tokens: int = DEFAULT_SCORED_TOKENS,
               context_tokens: int | None = None, stop: threading.Event | None = None,
               progress_every: int = PROGRESS_EVERY, text_info: dict | None = None, warm_up: bool = True,
               reference: str | None = REFERENCE, curve: bool = False) -> Iterator[ReportEvent]:
    """Score every column of `specs` against its reference on `ids` (see the module docstring), streaming the
    run's events (`kvlab.protocol`): RunStarted (its plan the `Split`), ColumnFailed and ReportProgress as they
    happen, then one RunDone with the record. Every engine context is closed when the run ends, stops or fails,
    and when the consumer abandons the generator.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        ids: (1, seq) or (seq,) token ids of the text.
        specs: columns, as `report_columns` takes them.
        scored_tokens, context_tokens: the split (`check_split`; the context defaults to the rest of the text).
        progress_every: a `ReportProgress` per column every this many tokens (and after the last).
        text_info: what the record says about the text (name, licence, ...).
        warm_up: pay each strategy's one-time set-up before the first timed forward.
        reference: the strategy every kvlab column is scored against (an engine column: its engine's own
            reference, `EngineColumn.report_reference`); None scores each column's own NLL only (no figures, no
            progress events, the record's figures and reference null: the Perplexity view).
        curve: also stream every scored token of every column (`TokenScored`: its NLL and the cache's bytes).

    Raises:
        ValueError: no columns, too many, or a split the text cannot give (before any compute).
    """
    started = time.perf_counter()
    stop = stop or threading.Event()
    ids = ids.reshape(1, -1).to(loaded.device)
    split = check_split(ids.shape[1], scored_tokens, context_tokens)
    columns = report_columns(specs)
    names = [column.describe() for column in columns]
    yield RunStarted(tuple(names), split)
    errors: dict[int, str] = {}
    dense = _Track(-1, reference, make_strategy({"strategy": reference})) if reference is not None else None
    references, tracks, made = [], [], []
    try:
        references, tracks = yield from _start(loaded, ids, split, columns, names, dense, stop, errors, warm_up)
        made = list(references)
        targets = ids[0, split.context_tokens:split.context_tokens + split.scored_tokens].tolist()
        for t, target in enumerate(targets):
            if stop.is_set():
                break
            yield from _round(references, tracks, target, split.context_tokens + t, errors, curve)
            if dense is not None and ((t + 1) % progress_every == 0 or t + 1 == len(targets)):
                for track in tracks:
                    if track.index not in errors and track.quality.n_tokens:
                        yield ReportProgress(track.name, track.quality.n_tokens, track.figures(), track.bytes_now,
                                             track.reference.name)
    finally:
        for track in references + tracks:
            track.close()
    wall_s = time.perf_counter() - started
    record = _record(loaded, split, text_info, zip(names, columns), tracks, made, errors, wall_s, stop.is_set())
    yield RunDone(record, wall_s, stop.is_set())


def _record(loaded, split, text_info, named_columns, tracks, references, errors, wall_s, stopped) -> dict:
    entries = []
    for index, (name, column) in enumerate(named_columns):
        track = next((t for t in tracks if t.index == index), None)
        entries.append(column_entry(name, column, split, errors.get(index, ""),
                                    track.figures() if track is not None else None,
                                    track.scored if track is not None else 0,
                                    track.strategy.runtime_note() if track is not None else "",
                                    _reference_name(track, column, references)))
    rows = [{"name": reference.name, **reference.cost()} for reference in references]
    return build_record(loaded.info(), split, text_info or {}, entries, rows[0] if rows else None, wall_s, stopped,
                        environment=environment(loaded), engine_references=rows[1:])


def _reference_name(track: _Track | None, column: Column, references: list[_Track]) -> str | None:
    """The name of the reference a column is (or would have been) scored against; None without references."""
    if not references or column.strategy is None:
        return None
    if track is not None and track.reference is not None:
        return track.reference.name
    if isinstance(column.strategy, EngineColumn):
        try:
            return column.strategy.report_reference().describe()
        except ValueError:
            return None
    return references[0].name
