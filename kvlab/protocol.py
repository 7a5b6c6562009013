"""The run protocol: every wing that runs columns is one function `request -> events -> record`, and these are
the events every such run streams around the wing's own step events.

A run yields `RunStarted` first (its columns' names, in order, and what the wing settled before the first step),
then its own step events (Compare's tokens and step metrics, Needle's cells, the report's progress and scored
tokens) with a `ColumnFailed` wherever a column cannot run or fails (the others go on), and ends with one
`RunDone` holding its record (`kvlab.record`): a stop ends the run early and its `RunDone` says `stopped`,
keeping what was measured. A front (the page, the command line, the MCP tools, the bench) handles these three
the same way for every wing and hands the step events to the wing's own view.

The wings that run this way: Compare (`kvlab.compare.runner.run_compare`; a preset in, `run_preset`), Needle
(`kvlab.needle.runner.run_needle`) and the quality report (`kvlab.quality.report.run_report`). Data only: no
model, no gradio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunStarted:
    """A run began. columns: its columns' names (`Column.describe()`), in order; every column index of the
    run's other events points into it. plan: what the wing settled before the first step (Needle's
    `kvlab.needle.runner.NeedlePlan`, the report's `kvlab.quality.report.Split`; None for Compare)."""

    columns: tuple[str, ...]
    plan: object = None


@dataclass(frozen=True)
class ColumnFailed:
    """Column `column` (its index, named `name`) cannot run here (`status` `unavailable`), was refused or failed
    (`error`); `message` is one line. The other columns go on. result: the wing's result of the column so far
    (Compare's `ColumnResult`), None where the wing keeps none."""

    column: int
    name: str
    status: str
    message: str
    result: object = None


@dataclass(frozen=True)
class RunDone:
    """The run ended: its record (the envelope of `kvlab.record.new_record`), its wall time in seconds, whether a
    stop ended it early (what was measured is kept), and the wing's own result objects (Compare's
    `ColumnResult`s, one per column; Needle's `CellRecord`s, one per cell and column; none for the report)."""

    record: dict
    wall_s: float
    stopped: bool = False
    results: list = field(default_factory=list)


RunEvent = RunStarted | ColumnFailed | RunDone
"""The events every wing's run shares."""


def collect(events: Iterable, on_event: Callable[[object], None] | None = None) -> RunDone:
    """Drain a run, passing each event to `on_event` (when given), and return its `RunDone`.

    Raises:
        RuntimeError: the run ended without a `RunDone`.
    """
    done = None
    for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, RunDone):
            done = event
    if done is None:
        raise RuntimeError("the run ended without a RunDone event")
    return done
