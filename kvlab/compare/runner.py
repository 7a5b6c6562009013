"""The side-by-side runner: one prompt, N cache strategies, streamed as typed events.

Each column drives the engine's decode loop (`kvlab.engine.Decoder`: prefill,
then one forward per token through its strategy) from a worker thread against
the one shared model. Modes:

- `fair` (default): every column's steps (forward, token choice, cache bytes)
  run on kvlab's one compute thread (`kvlab.compute`), one at a time, the turn
  going to the column that has used the least compute so far
  (`kvlab.compare.turns.ComputeTurns`), so each column's measured step time is
  what it would be alone while all columns stream together, and a costly column
  (no_cache) never holds the cheap ones to its pace.
- `parallel`: free threads, for throughput; per-token times then include
  contention. While parallel runs go, each column thread and kvlab's compute
  thread (so every other tab's work too) use an even share of torch's intra-op
  threads (`shared_threads`), restored when the last one ends. On 2 cores this
  mode is slower than `sequential` (measured by `python -m kvlab bench --only
  parallel`): one forward on the compute thread already keeps both cores busy.
- `sequential`: one column after another, on the compute thread too.

A run streams the run protocol's events (`kvlab.protocol`: `RunStarted` with the columns' names, a
`ColumnFailed` per column that cannot run or fails, one `RunDone` with the record) around Compare's own.
A stop event ends every loop within a token. An exception ends its own column
only (a `ColumnFailed`); the consumer never waits on a dead thread. A column with
a `kvlab.budget.Budget` steps through `kvlab.budget.ResilientSteps`, which moves
it to a smaller cache before it would outgrow its budget (or after running out
of memory); each switch is a `FallbackSwitched` event.

Timing (`kvlab.measure`, one `Measurement` chosen by `settings.timing_policy`): before
any column starts, each column's strategy pays its one-time set-up once per process
(a `RunPhase("warm_up")` event when any is due; its seconds are
`ColumnResult.timing.warm_up_s`, never in TTFT). After the columns finish, the
policy may replace the live figures (the `quiet` policy re-times the columns in
fair mode, with nothing relayed meanwhile). Then `SummaryReady` carries every result (text agreement against
the baseline filled), so the summary shows before the teacher-forced fidelity pass (see
`kvlab.compare.fidelity`), whose `FidelityScored` events fill top-1 agreement and KL in column by column. A
stop during that pass keeps the summary and what was scored. The record's `timing` says how the figures were
taken and whether the machine was too busy; its `fidelity` how far the fidelity pass got. `run_preset` is
Compare's `request -> events -> record`: a preset (and, when the front built them, its columns) in, the run's
events out, the record in its `RunDone`. This module runs; it does not render.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator

import torch

from ..accounting import cache_bytes_by_device, predicted_cache_bytes_by_layer_type
from ..budget import ResilientSteps, usable_chain
from ..columns import MAX_COLUMNS, Column, parse_columns
from ..compute import compute, compute_iter
from ..engine import Decoder, RunStopped
from ..generation import GenerationSettings, IncrementalDetokenizer, encode_prompt
from ..measure.environment import OtherWork
from ..measure.noise import sample_load
from ..protocol import ColumnFailed, RunDone, RunStarted
from ..strategies import Strategy, StrategyError
from .columns import MODES
from .engine_steps import decode_engine
from .events import (
    ColumnDone,
    ColumnResult,
    ColumnStarted,
    Event,
    FallbackSwitched,
    MemorySample,
    RunPhase,
    StepMetrics,
    SummaryReady,
    TokenEvent,
)
from .fidelity import mark_unscored, prepare_fidelity, score_fidelity
from .memory import MemoryTracker
from .summary import run_record
from .timing import for_policy
from .turns import ComputeTurns, FreeTurns, parallel_threads, shared_threads  # noqa: F401 (re-exported)

MEMORY_SAMPLE_EVERY_S = 0.25
QUEUE_POLL_S = 0.05
JOIN_TIMEOUT_S = 30.0


def new_result(index: int, column: Column, prompt_tokens: int) -> ColumnResult:
    strategy = column.strategy
    return ColumnResult(
        index=index,
        name=column.describe(),
        strategy=strategy.name,
        knobs=strategy.knobs(),
        lossy=strategy.lossy,
        use_cache=strategy.use_cache,
        caveat=strategy.caveat_for(prompt_tokens),
        prompt_tokens=prompt_tokens,
        budget_bytes=column.budget.budget_bytes if column.budget is not None else None,
    )


def _rejected(index: int, column: Column, prompt_tokens: int, emit) -> ColumnResult:
    result = ColumnResult(index=index, name=column.title, strategy=column.title, knobs={}, status="error",
                          message=column.rejected, prompt_tokens=prompt_tokens)
    emit(ColumnStarted(index, result.name, prompt_tokens))
    emit(ColumnFailed(index, result.name, "error", result.message, result))
    return result


def run_column(
    loaded,
    index: int,
    column: Column,
    prompt_ids: torch.Tensor,
    settings: GenerationSettings,
    emit,
    turns,
    stop: threading.Event,
) -> ColumnResult:
    """Generate for one column, calling `emit(event)` as it goes. Returns its result.

    Raises nothing: failures become a `ColumnFailed` event and status `error`.
    """
    if column.strategy is None:
        return _rejected(index, column, prompt_ids.shape[1], emit)
    strategy = column.strategy
    prompt_tokens = prompt_ids.shape[1]
    result = new_result(index, column, prompt_tokens)
    result.keeps, result.keeps_everything = strategy.keeps_on(loaded), strategy.keeps_everything_on(loaded)
    result.warning = strategy.warning_on(loaded, prompt_tokens)
    reason = strategy.unavailable_reason(loaded)
    usable = usable_chain(loaded, strategy, column.budget) if column.budget is not None and not reason \
        and not strategy.engine_name else None
    emit(ColumnStarted(index, result.name, prompt_tokens, result.keeps, "; ".join(usable[1]) if usable else ""))
    if reason:
        result.status, result.message = "unavailable", reason
        emit(ColumnFailed(index, result.name, "unavailable", reason, result))
        return result
    try:
        run_settings = settings.with_overrides(column.overrides)
        run_settings.check()
        strategy.check_fits(prompt_tokens, run_settings.max_new_tokens)
        _decode(loaded, index, column, prompt_ids, run_settings, emit, turns, stop, result, usable)
    except RunStopped:
        result.stopped = True
    except Exception as err:  # noqa: BLE001 - any failure ends this column only
        result.status, result.message = "error", f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        result.finish_decode_stats()
        emit(ColumnFailed(index, result.name, "error", result.message, result))
        return result
    result.status = "ok"
    if result.stopped:
        result.message = "; ".join(filter(None, [f"stopped after {len(result.token_ids)} tokens", result.message]))
    result.finish_decode_stats()
    emit(ColumnDone(index, result))
    return result


def _decode(loaded, index, column, prompt_ids, settings, emit, turns, stop, result, usable=None) -> None:
    """Build the column's cache, then stream the engine's steps (and any fallback switches) into `result` and
    events. `usable`: the budgeted column's `usable_chain`, read once when it started."""
    strategy = column.strategy
    if strategy.engine_name:
        return decode_engine(loaded, index, column, prompt_ids, settings, emit, turns, stop, result)
    max_total = prompt_ids.shape[1] + settings.max_new_tokens
    cache = turns.run(lambda: strategy.build_cache(loaded, max_total))
    result.message = strategy.runtime_note()
    decoder = Decoder(loaded, strategy, cache, prompt_ids, settings, stop=stop, measure_bytes=True)
    del cache  # the decoder holds it; a fallback switch must be able to free it
    steps = decoder if column.budget is None else ResilientSteps(loaded, decoder, column.budget, max_total,
                                                                        usable)
    switches = getattr(steps, "fallbacks", [])
    detok = IncrementalDetokenizer(loaded.tokenizer)
    for step in turns.iterate(steps):
        if step.index == 0:
            result.ttft_s = step.per_token_s
        current = decoder.strategy
        predicted_by_type = _predicted_by_type(loaded, current, step.seen_tokens, max_total)
        predicted = sum(predicted_by_type.values())
        for switch in switches[len(result.fallbacks):]:
            result.fallbacks.append(switch.to_json())
            result.lossy = result.lossy or current.lossy
            result.message = "; ".join(filter(None, [result.message, switch.sentence()]))
            emit(FallbackSwitched(index, switch.to_json()))
        result.token_ids.append(step.token_id)
        result.per_token_s.append(step.per_token_s)
        result.cache_bytes.append(step.cache_bytes)
        result.predicted_cache_bytes.append(predicted)
        _append_by_type(result.cache_bytes_by_layer_type, step.cache_bytes_by_layer_type or {})
        _append_by_type(result.predicted_cache_bytes_by_layer_type, predicted_by_type)
        text = detok.push(step.token_id)
        result.text = detok.text
        emit(TokenEvent(index, step.index, step.token_id, text))
        emit(StepMetrics(index, step.index, step.per_token_s, step.cache_bytes, predicted, step.seen_tokens,
                         step.cache_bytes_by_layer_type or {}, predicted_by_type))
    result.message = "; ".join(filter(None, [result.message, *getattr(steps, "notes", [])]))
    result.cache_bytes_by_device = cache_bytes_by_device(decoder.cache)
    if decoder.stop_reason == "stopped":
        raise RunStopped


def _predicted_by_type(loaded, strategy, seen_tokens: int, max_total: int) -> dict[str, int]:
    """The dense prediction per layer type for the tokens each layer holds (all 0 without a cache)."""
    held = strategy.held_tokens_by_layer(loaded.config, seen_tokens, max_total)
    if not strategy.use_cache:
        held = [0] * len(held)
    return predicted_cache_bytes_by_layer_type(loaded.config, loaded.model.dtype, held)


def _append_by_type(series: dict[str, list[int]], values: dict[str, int]) -> None:
    """Append one step's value per layer type to the per-type series (a type new this step starts at 0)."""
    steps = max((len(v) for v in series.values()), default=0)
    for kind in values.keys() | series.keys():
        series.setdefault(kind, [0] * steps).append(values.get(kind, 0))


def run_compare(loaded, prompt_ids: torch.Tensor, columns: list, settings: GenerationSettings | None = None,
                mode: str = "fair", stop: threading.Event | None = None, baseline: int | None = None,
                preset=None) -> Iterator[Event]:
    """Run every column and yield events as they happen: `RunStarted` first, `RunDone` (with the record,
    `kvlab.compare.summary.run_record`, and every column's `ColumnResult`) last.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        prompt_ids: (1, prompt_tokens) token ids.
        columns: `Column`s, `Strategy`s or spec dicts (1..MAX_COLUMNS).
        settings: shared generation settings (a column may override some).
        mode: one of MODES.
        stop: set it to end every column within a token.
        baseline: index of the fidelity baseline column (default: first `dynamic`, else the first ok column).
        preset: the `kvlab.compare.preset.Preset` the run is made from, whose name, prompt and mode the record says
            (None: the record leaves them null).

    Raises:
        ValueError: bad mode, no columns or too many, or an unknown `settings.timing_policy` (before anything
            runs).
        StrategyError: a column spec names an unknown strategy or knob.
    """
    columns = checked_columns(columns, mode)
    yield RunStarted(tuple(column.describe() for column in columns))
    settings, stop = settings or GenerationSettings(), stop or threading.Event()
    events, results = queue.Queue(), [None] * len(columns)  # results: a ColumnResult per column, in order
    turns = FreeTurns() if mode == "parallel" else ComputeTurns()
    started, loads, others = time.perf_counter(), [sample_load()], OtherWork()
    measurement = for_policy(settings.timing_policy)
    sampler = _Sampler(MemoryTracker(loaded.device), started)

    def work(indices, threads: int | None):  # one worker thread's columns, each result into its slot
        if threads is not None:
            torch.set_num_threads(threads)
        for i in indices:
            results[i] = run_column(loaded, i, columns[i], prompt_ids, settings, events.put, turns, stop)
    workers: list[threading.Thread] = []
    try:
        # 0. Every column's one-time set-up, before any column's clock starts.
        warm_up_s = yield from measurement.warm_up(loaded, columns, prompt_ids.shape[1])
        # 1. The columns, each in its own thread (one thread for all in sequential mode), events relayed live.
        with shared_threads(len(columns)) if mode == "parallel" else contextlib.nullcontext() as share:
            workers = _start_workers(work, len(columns), mode, share)
            yield from _relay(workers, events, sampler)
        # 2. A column whose thread died without a result is reported, never waited for.
        yield from _fill_missing(results, columns, prompt_ids.shape[1], warm_up_s)
        # 3. The timing policy's own pass, if any (nothing is relayed meanwhile), and every column's noise.
        used = yield from measurement.finish(loaded, columns, results, prompt_ids, settings, mode, stop)
        loads.append(sample_load())
        threads = compute(torch.get_num_threads) if mode != "parallel" else torch.get_num_threads()
        timing = measurement.run_record(results, used, loads, threads, others.cores())
        # 4. The summary, then the teacher-forced fidelity pass filling its figures in.
        order, summary_s = yield from _summary_then_fidelity(loaded, prompt_ids, columns, results, settings,
                                                             baseline, stop, (events, sampler, workers), timing)
        yield sampler.sample()
        wall_s, fidelity = time.perf_counter() - started, _fidelity_record(settings, results, order, stop)
        yield RunDone(run_record(loaded, preset, settings, results, wall_s, stop.is_set(), timing, fidelity, summary_s,
                                 sampler.record()), wall_s, stop.is_set(), list(results))
    finally:
        _end_workers(workers, stop)


def _summary_then_fidelity(loaded, prompt_ids, columns, results, settings, baseline, stop, relay, timing):
    """Generator: `SummaryReady` (text agreement needs no model work, so it is in the summary), then the
    teacher-forced fidelity pass, one compute step per scored column (so other tabs' work can run between),
    its `FidelityScored` events relayed from a worker thread added to `relay`'s workers. Returns (the columns
    to score, seconds from the run's start to the summary)."""
    events, sampler, workers = relay
    _, order = prepare_fidelity(columns, results, baseline) if settings.fidelity else (None, [])
    scoring = order if not stop.is_set() else []
    summary_s = time.perf_counter() - sampler.started
    yield SummaryReady(list(results), summary_s, timing, len(scoring))
    if scoring:
        yield RunPhase("fidelity", f"0 of {len(scoring)} columns scored")
        fidelity = compute_iter(score_fidelity(loaded, prompt_ids, columns, results, scoring, stop))
        workers.append(_start_thread(_drain_into, "kvlab-fidelity", fidelity, events))
        yield from _relay(workers[-1:], events, sampler)
    return order, summary_s


def _fidelity_record(settings, results: list, order: list[int], stop: threading.Event) -> dict:
    """The record's `fidelity`: the pass's state and column counts; columns left unscored are marked why."""
    if not settings.fidelity:
        mark_unscored(results, [i for i, r in enumerate(results) if r.status == "ok" and r.token_ids],
                      "fidelity off")
        return {"state": "off", "scored": 0, "to_score": 0}
    scored = sum(results[i].fidelity_status == "scored" for i in order)
    if stop.is_set():
        mark_unscored(results, order, "stopped")
    state = "none" if not order else "stopped" if stop.is_set() and scored < len(order) else "scored"
    return {"state": state, "scored": scored, "to_score": len(order)}


def _fill_missing(results: list, columns: list, input_tokens: int, warm_up_s: list[float]):
    """Generator: a column whose worker ended without a result gets an error result (and a `ColumnFailed`
    event); every result gets its column's warm-up seconds."""
    for i, result in enumerate(results):
        if result is None:
            results[i] = new_result(i, columns[i], input_tokens)
            results[i].status, results[i].message = "error", "the column's worker ended without a result"
            yield ColumnFailed(i, results[i].name, "error", results[i].message, results[i])
        results[i].timing.warm_up_s = warm_up_s[i]


def _end_workers(workers: list[threading.Thread], stop: threading.Event) -> None:
    """Stop the columns when a worker still runs (the run's consumer left early), then join each started
    worker for at most JOIN_TIMEOUT_S."""
    if any(w.is_alive() for w in workers):
        stop.set()
    for worker in workers:
        if worker.ident is not None:
            worker.join(JOIN_TIMEOUT_S)


def _start_thread(target, name: str, *args) -> threading.Thread:
    """A started daemon thread running `target(*args)`."""
    thread = threading.Thread(target=target, daemon=True, name=name, args=args)
    thread.start()
    return thread


def _start_workers(work, count: int, mode: str, share: int | None) -> list[threading.Thread]:
    """Start `work(indices, share)` threads: one per column, or one for all columns in sequential mode."""
    if mode == "sequential":
        groups = {"kvlab-seq": range(count)}
    else:
        groups = {f"kvlab-col{i}": [i] for i in range(count)}
    workers = [threading.Thread(target=work, args=(indices, share), daemon=True, name=name)
               for name, indices in groups.items()]
    for worker in workers:
        worker.start()
    return workers


def checked_columns(columns: list, mode: str) -> list[Column]:
    """`Column`s from specs, after checking the mode and the column count.

    Raises:
        ValueError: bad mode, no columns or more than MAX_COLUMNS.
        StrategyError: a column spec names an unknown strategy or knob.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return parse_columns(columns, MAX_COLUMNS, empty="no strategy picked: add at least one column", strict=True)


class _Sampler:
    """Process memory samples at most every MEMORY_SAMPLE_EVERY_S seconds of a run."""

    def __init__(self, tracker: MemoryTracker, started: float):
        self.tracker, self.started, self.next_at = tracker, started, 0.0
        self.taken: list[MemorySample] = []

    def sample(self) -> MemorySample:
        now = time.perf_counter() - self.started
        self.next_at = now + MEMORY_SAMPLE_EVERY_S
        self.taken.append(MemorySample(now, *self.tracker.sample()))
        return self.taken[-1]

    def record(self) -> dict:
        """The samples taken, as the record's `memory` (`kvlab.compare.summary.run_record`)."""
        return {"elapsed_s": [s.elapsed_s for s in self.taken], "rss_bytes": [s.rss_bytes for s in self.taken],
                "cuda_allocated_bytes": [s.cuda_allocated_bytes for s in self.taken]}

    def due(self) -> bool:
        return time.perf_counter() - self.started >= self.next_at


def _relay(threads: list[threading.Thread], events: queue.Queue, sampler: _Sampler) -> Iterator[Event]:
    """Yield queued events (and due memory samples) until the threads end and the queue is empty."""
    while any(t.is_alive() for t in threads) or not events.empty():
        try:
            yield events.get(timeout=QUEUE_POLL_S)
        except queue.Empty:
            pass
        if sampler.due():
            yield sampler.sample()


def _drain_into(stream, events: queue.Queue) -> None:
    """Run a stream to its end in this (worker) thread, queueing what it yields, so the consumer's thread
    never waits on model work."""
    for event in stream:
        events.put(event)


def run_preset(loaded, preset, stop: threading.Event | None = None, columns: list | None = None
               ) -> Iterator[Event]:
    """Compare's `request -> events -> record`: run `preset` (a `kvlab.compare.preset.Preset`: prompt, settings, mode,
    baseline) on `loaded`, its prompt encoded now, over `columns` (default: the preset's own); the events of
    `run_compare`, the record in the last one.

    Raises:
        ValueError: the prompt cannot be encoded (at once); as `run_compare` once the events are read.
    """
    settings = preset.settings()
    prompt_ids = encode_prompt(loaded.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    return run_compare(loaded, prompt_ids, preset.build_columns() if columns is None else columns, settings,
                       preset.mode, stop, preset.baseline, preset)
