"""The one-time warm-up before any column's clock starts: each column's strategy runs its one-time set-up
(`Strategy.warm_up`: backend imports, kernel loading, first-call dispatch, the model's first forwards) once per
process and model; the seconds it took are reported apart from TTFT (`ColumnTiming.warm_up_s`).

This module warms and remembers what it warmed; it does not time columns or stream events.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

logger = logging.getLogger(__name__)

WARM_UP_MAX_INPUT_TOKENS = 512
"""The warm-up prefills the run's prompt length up to this many tokens."""

_warmed: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()
_warm_lock = threading.Lock()


def _already_warm(loaded, strategy) -> bool:
    with _warm_lock:
        return strategy.warm_up_key() in _warmed.get(loaded.model, set())


def needs_warm_up(loaded, strategies: list) -> list[str]:
    """Names of the strategies (None entries and unavailable ones skipped) whose one-time set-up has not run in
    this process for `loaded`'s model yet."""
    return [s.describe() for s in strategies
            if s is not None and not s.unavailable_reason(loaded) and not _already_warm(loaded, s)]


def warm_up_columns(loaded, strategies: list, input_tokens: int | None = None) -> list[float | None]:
    """Run each strategy's one-time set-up (`Strategy.warm_up`) unless this process already did for this model
    and `warm_up_key`; call it on kvlab's compute thread before any column's clock starts. `input_tokens`: the
    run's prompt length (at most WARM_UP_MAX_INPUT_TOKENS are fed), so the warm-up prefills the same shapes.

    Returns, per strategy, the seconds spent warming it now (0.0 when it was warm already, None for a None
    entry or a strategy that cannot run here). A failing warm-up is logged and left for the column to report
    when it runs; it raises nothing.
    """
    spent: list[float | None] = []
    for strategy in strategies:
        if strategy is None or strategy.unavailable_reason(loaded):
            spent.append(None)
            continue
        key = strategy.warm_up_key()
        with _warm_lock:
            done = _warmed.setdefault(loaded.model, set())
            if key in done:
                spent.append(0.0)
                continue
            started = time.perf_counter()
            try:
                if input_tokens:
                    strategy.warm_up(loaded, input_tokens=min(input_tokens, WARM_UP_MAX_INPUT_TOKENS))
                else:
                    strategy.warm_up(loaded)
                done.add(key)
            except Exception as err:  # noqa: BLE001 - the column reports its own failure when it runs
                logger.info("warm-up of %s failed: %s: %s", strategy.describe(), type(err).__name__, err)
            spent.append(time.perf_counter() - started)
    return spent
