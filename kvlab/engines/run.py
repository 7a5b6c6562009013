"""What an engine column's run hands Compare: `EngineRun`, an iterator of `EngineStep`, and `EngineError`.

The engines (`kvlab.engines.llamacpp`, `kvlab.engines.openai`) subclass `EngineRun`; Compare
(`kvlab.compare.engine_steps`) streams its steps into the column as it streams kvlab's own decoder's `Step`s
(an `EngineStep` has the same fields; this package stays below kvlab's engine, which the caches it serves
import). Nothing here talks to an engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..compute import closed


@dataclass(frozen=True)
class EngineStep:
    """One token (or streamed chunk) of an engine, with the fields of `kvlab.engine.Step` Compare reads.

    index: 0 for the first. token_id: its id, -1 where the engine streams text only. per_token_s: the step's time
    (the first: the TTFT). fed_ids: the ids this step fed the engine (() for a server). seen_tokens: ids the
    engine's cache had been fed before this token (0 where unknown). cache_bytes: the engine's own figure for its
    cache now, None where it gives none.
    """

    index: int
    token_id: int
    per_token_s: float
    fed_ids: tuple[int, ...]
    seen_tokens: int
    cache_bytes: int | None = None


def stopping(stop: threading.Event | None) -> bool:
    """Whether a run given `stop` should end now: `stop` is set, or kvlab is shutting down (`kvlab.compute`)."""
    return closed() or (stop is not None and stop.is_set())


class EngineError(ValueError):
    """An engine could not start or failed mid-run; the message is one line for the column (a ValueError, so
    Compare shows it as it is, as it shows a bad knob)."""


class EngineRun:
    """One engine column's run: iterate it for its steps.

    Each step is an `EngineStep`: index 0 is the first token (its `per_token_s` the TTFT), every later one a
    token (or, from a server, a streamed chunk) with the time since the one before (the ITL). `token_id` is -1
    where the engine streams text only; `cache_bytes` is the engine's own figure or None where it gives none.

    Attributes:
        stop_reason: `eos`, `length` or `stopped` once the run ended (None before).
        texts: the text of each step, in order (what the column shows).
        token_ids: the run's token ids at the end (the server's stream re-tokenized where it gives no ids).
        notes: one-line remarks for the column's message, filled as the run goes and at its end.
        figures: JSON-ready figures of the engine for the record (`ColumnResult.engine`).
        is_local: the engine computes in this process (its steps take turns on kvlab's compute thread).
    """

    is_local = True

    def __init__(self):
        self.stop_reason: str | None = None
        self.texts: list[str] = []
        self.token_ids: list[int] = []
        self.notes: list[str] = []
        self.figures: dict = {}

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> EngineStep:
        raise NotImplementedError

    def close(self) -> None:
        """Release the engine's resources (a context, a connection); called once the column ends, whatever
        happened."""
