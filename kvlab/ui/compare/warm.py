"""The one-time warm-up of the columns the Compare page opens with, paid while their model loads.

Every strategy pays a one-time set-up in a process (backend imports, kernel loading, first-call dispatch,
the model's first forwards at the run's shapes: `kvlab.measure.warmup`). A run pays what is still due
before any column's clock starts, with a "warming up" phase on its status line. `OpeningWarmUp` pays it
for the opening preset's columns (`kvlab.ui.compare.form.start_preset`) at that preset's prompt length as
the last step of a model's load (`kvlab.ui.shared.loader.BackgroundLoader`'s `warm`), so the page's load
progress shows it and a first Run after the model is ready finds every column warm: the first Run times
like the second.

The warm-up runs on kvlab's compute thread, one strategy per call, so another tab's work waits for one
strategy at most. A strategy that cannot run on the model, or whose warm-up fails, is skipped (its column
says why when it runs); an opening preset that does not load skips the whole step (logged). No gradio.
"""

from __future__ import annotations

import logging
import time

from kvlab.compute import compute
from kvlab.generation import encode_prompt
from kvlab.measure.warmup import needs_warm_up, warm_up_columns
from kvlab.compare.preset import list_presets

from ..shared.loader import WARM_START
from .form import start_preset

logger = logging.getLogger(__name__)


class OpeningWarmUp:
    """`warm(loaded, progress)`: the load step that warms the opening preset's columns on `loaded`.

    presets: name -> preset file, as the Compare tab has them (default: `kvlab.compare.preset.list_presets()` when
    first called).
    """

    def __init__(self, presets: dict | None = None):
        self.presets = presets

    def strategies(self) -> tuple[list, object]:
        """(the opening preset's column strategies, the preset).

        Raises:
            PresetError, StrategyError: the opening preset does not load or build (the warm-up is skipped).
        """
        preset = start_preset(list_presets() if self.presets is None else self.presets)
        return [column.strategy for column in preset.build_columns()], preset

    def __call__(self, loaded, progress) -> float:
        """Warm every cold strategy of the opening preset on `loaded` at the preset's prompt length, calling
        `progress(fraction, message)` before each; returns the seconds spent. Raises nothing: a failure is
        logged and leaves the run to pay (and report) it."""
        started = time.perf_counter()
        if getattr(loaded, "is_recurrent", False):
            return 0.0  # its columns run through the recurrent runner, which has no one-time set-up to pay
        try:
            strategies, preset = self.strategies()
            prompt = preset.prompt
            ids = encode_prompt(loaded.tokenizer, prompt.text, prompt.system or "", bool(prompt.chat))
            cold = [s for s in strategies if needs_warm_up(loaded, [s])]
            for done, strategy in enumerate(cold):
                progress(WARM_START + (1 - WARM_START) * done / len(cold),
                         f"warming up the opening columns once ({done + 1} of {len(cold)}: {strategy.describe()})")
                compute(warm_up_columns, loaded, [strategy], ids.shape[1])
        except Exception:  # noqa: BLE001 - the model is loaded; a run pays what was not warmed
            logger.exception("warming up the opening columns failed")
        return time.perf_counter() - started
