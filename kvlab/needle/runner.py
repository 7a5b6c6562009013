"""The needle grid runner: every cell of a grid through every column's cache, streamed as small typed events.

Columns are read by `kvlab.columns.parse_columns` (any registered strategy with its knobs, up to MAX_COLUMNS); a
column that cannot become a strategy or cannot run on this model gets a `ColumnFailed` and the others run.
Cells run shortest length first; within a cell the dense columns (caches that keep every token on this model)
run first, so each cell's gate is known before the other columns' results of it are sent. Each cell is one
call on kvlab's compute thread (`kvlab.compute`), so it takes turns with the other tabs' work; strategies pay
their one-time set-up before the first cell (`kvlab.measure.warmup.warm_up_columns`), never inside a prefill_s.

It streams the run protocol's events (`kvlab.protocol`) around its own `NeedleCell`s. A stop event ends the
run between two cells; every finished cell stays in `RunDone.results`. An error in a cell ends its column (the
message in its `ColumnFailed`) while the other columns go on. This module runs and measures; it does not
render.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..columns import MAX_COLUMNS, parse_columns
from ..compute import compute
from ..generation import eos_token_ids
from ..measure.environment import environment
from ..measure.warmup import warm_up_columns
from ..protocol import ColumnFailed, RunDone, RunStarted
from .cell import run_cell
from .grid import Grid
from .prompt import PasskeyPrompt, build_passkey_prompt
from .record import CellRecord, build_record


@dataclass(frozen=True)
class NeedlePlan:
    """What a needle run settled before its first cell (`RunStarted.plan`): the cells ((target_tokens, depth,
    seed) in run order), the dense columns' indices and the grid's problems (values left out, one line each)."""

    cells: list[tuple[int, float, int]]
    dense_columns: list[int]
    problems: list[str]


@dataclass(frozen=True)
class NeedleCell:
    """One finished cell of one column; `record.gated` is final when it is sent."""

    record: CellRecord


NeedleEvent = RunStarted | ColumnFailed | NeedleCell | RunDone


def _record(index: int, name: str, prompt: PasskeyPrompt, target: int) -> CellRecord:
    return CellRecord(index, name, prompt.context_tokens, target, prompt.depth, prompt.seed, prompt.key,
                      prompt.key_position, prompt.text, list(prompt.prompt_ids))


def _fill(record: CellRecord, outcome) -> CellRecord:
    record.answer_ids, record.answer_text, record.hit = list(outcome.answer_ids), outcome.answer_text, outcome.hit
    record.key_logprob, record.key_rank = outcome.key_logprob, outcome.key_rank
    record.cache_bytes, record.prefill_s = outcome.cache_bytes, outcome.prefill_s
    return record


def _gate(records: list[CellRecord], dense: list[int]) -> None:
    """Mark every column's record of a cell that a dense column missed as gated (beyond the model)."""
    for record in records:
        if record.column in dense and record.status == "ok" and not record.hit:
            for other in records:
                if other.cell == record.cell:
                    other.gated = True


def run_needle(loaded, specs, grid: Grid, stop: threading.Event | None = None) -> Iterator[NeedleEvent]:
    """Run `grid` under each column of `specs` (text in compare syntax, strategy dicts, Strategies or Columns)
    and yield the run's events (`kvlab.protocol`): RunStarted (its plan a `NeedlePlan`), then ColumnFailed /
    NeedleCell as they happen, then one RunDone with the record and every finished cell (`results`).

    Raises:
        ValueError: no columns or more than MAX_COLUMNS (nothing runs).
    """
    stop = stop or threading.Event()
    started = time.perf_counter()
    columns = parse_columns(specs, MAX_COLUMNS)
    names = [c.describe() for c in columns]
    messages: dict[int, str] = {}
    statuses: dict[int, str] = {}
    for index, column in enumerate(columns):
        reason = column.rejected or (column.strategy.unavailable_reason(loaded) if column.strategy else "")
        if reason:
            messages[index], statuses[index] = reason, "error" if column.rejected else "unavailable"
    dense = [i for i, c in enumerate(columns) if i not in messages and c.strategy.keeps_everything_on(loaded)]
    order = dense + [i for i in range(len(columns)) if i not in dense]
    yield RunStarted(tuple(names), NeedlePlan(list(grid.cells), dense, list(grid.problems)))
    for index, message in messages.items():
        yield ColumnFailed(index, names[index], statuses[index], message)
    runnable = [columns[i].strategy for i in order if i not in messages]
    compute(warm_up_columns, loaded, runnable, max(grid.lengths))
    eos = eos_token_ids(loaded)
    records: list[CellRecord] = []
    for target, depth, seed in grid.cells:
        if stop.is_set():
            break
        prompt = build_passkey_prompt(loaded.tokenizer, target, depth, seed)
        dense_missed = False
        for index in order:
            if index in messages or stop.is_set():
                continue
            record = _record(index, names[index], prompt, target)
            try:
                _fill(record, compute(run_cell, loaded, columns[index].strategy, prompt, grid.new_tokens, eos))
            except Exception as err:  # noqa: BLE001 - a failing cache ends its own column only
                plain = isinstance(err, ValueError)  # StrategyError and the scorers: messages written for the user
                messages[index], statuses[index] = str(err) if plain else f"{type(err).__name__}: {err}", "error"
                record.status, record.message = "error", messages[index]
                records.append(record)
                yield ColumnFailed(index, names[index], "error", messages[index])
                continue
            if index in dense and not record.hit:
                dense_missed = True
            record.gated = dense_missed
            records.append(record)
            yield NeedleCell(record)
    _gate(records, dense)
    wall_s = time.perf_counter() - started
    info = {**loaded.info(), "hub_id": _hub_id(loaded), "max_position_embeddings": max_positions(loaded)}
    column_info = [{"name": names[i], "spec": {"strategy": c.strategy.name, **c.strategy.knobs()} if c.strategy else {},
                    "status": statuses.get(i, "ok"), "message": messages.get(i, "")} for i, c in enumerate(columns)]
    grid_info = {"lengths": grid.lengths, "depths": grid.depths, "seeds": grid.seeds, "new_tokens": grid.new_tokens}
    record = build_record(info, grid_info, column_info, records, dense, list(grid.problems), wall_s, stop.is_set(),
                          environment(loaded))
    yield RunDone(record, wall_s, stop.is_set(), records)


def _hub_id(loaded) -> str | None:
    from ..models.bundled import bundled_model

    source = loaded.spec.source
    found = bundled_model(source)
    return found.hub_id if found is not None else (source if "/" in source else None)


def max_positions(loaded) -> int | None:
    """The model's max_position_embeddings (None when its config has none): the longest length a grid may ask."""
    return getattr(loaded.config.get_text_config(decoder=True), "max_position_embeddings", None)
