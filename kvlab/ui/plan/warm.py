"""The Plan tab's one-time set-up, paid while the app's model loads, and its kept measurements, filled in the
background.

- `PlannerWarmUp`: a load step (`kvlab.ui.shared.loader.BackgroundLoader`'s `warm`): the planner's warm-up
  (`kvlab.plan.planner.warm_up`: imports, quanto's and hqq's first use, meta-device model code) once per
  process on the compute thread, before the model counts as ready, so neither a visitor's first plan nor
  their first Run waits for it.
- `fill_catalog`: the opening form's plan of every catalog model (`kvlab.ui.plan.view.default_requests`,
  kept by `kvlab.plan.measured`), each planned only once the compute thread has been idle a while
  (`kvlab.compute.when_idle`), so a Run started meanwhile waits for one model's plan at most.

No gradio.
"""

from __future__ import annotations

import logging
import threading
import time

from kvlab.compute import IDLE_S, compute, when_idle
from kvlab.plan.planner import PlanError, plan, warm_up

from .view import default_requests

logger = logging.getLogger(__name__)

PLANNER_FRACTION = 0.99
"""Where the load's progress stands while the planner warms up (the columns' warm-up fills the bar before)."""
_once = threading.Lock()
_warmed = threading.Event()


def warm_planner_once() -> None:
    """`kvlab.plan.planner.warm_up` on the compute thread, the first time this is called in the process (later
    calls, and calls while it runs, return once it is done). A failure is logged; the next call tries again."""
    with _once:
        if _warmed.is_set():
            return
        try:
            compute(warm_up)
            _warmed.set()
        except Exception:  # noqa: BLE001 - a failed warm-up only makes the first plan slower
            logger.exception("planner warm-up failed")


class PlannerWarmUp:
    """`warm(loaded, progress)`: the load step that warms the planner once per process (see the module
    docstring); returns the seconds spent, raises nothing."""

    def __call__(self, loaded, progress) -> float:
        started = time.perf_counter()
        if not _warmed.is_set():
            progress(PLANNER_FRACTION, "warming up the planner once (the Plan tab)")
            warm_planner_once()
        return time.perf_counter() - started


def fill_catalog(stop: threading.Event | None = None, quiet_s: float = IDLE_S) -> int:
    """Plan the opening form of every catalog model, each once the compute thread has been idle `quiet_s`
    seconds (see the module docstring); returns how many were planned. Stops between two plans when `stop` is
    set; a model that cannot be planned is logged and skipped."""
    planned = 0
    for request in default_requests():
        try:
            if when_idle(plan, request, quiet_s=quiet_s, stop=stop) is None:
                return planned
        except PlanError as err:
            logger.info("planning %s at start failed: %s", request.model, err)
            continue
        planned += 1
    return planned
