"""The Compare tab's replay and ZeroGPU sizing, mixed into `kvlab.ui.compare_tab.CompareTab`.

- `replay`: an uploaded run record (`kvlab.replay`) shown as it was measured: the cards set to the recorded
  strategies, the columns' text and status, the native plots, the summary, the code, and the status line
  `replayed: measured on <machine> at <time>`; a file that cannot be replayed says why there.
- `api_compare`: the headless `compare` API (a preset run, returning its JSON record).
- `run_gpu_s`, `api_gpu_s`: the GPU seconds a Run or a `compare` API call asks ZeroGPU for
  (`kvlab.ui.zerogpu.estimate_s`, columns × tokens).

The methods use the tab's components (`self.cards`, `self.plots`, `self.run_status`, ...).
"""

from __future__ import annotations

import gradio as gr

from kvlab.models import ModelLoadError
from kvlab.presets import PresetError, load_preset
from kvlab.replay import RecordError, load_record
from kvlab.strategies import StrategyError

from . import zerogpu
from .compare_replay import replay_code, view_from_record
from .compare_updates import CompareUpdates
from .knobs import NO_STRATEGY
from .records import SHARE_PARAM, run_preset, shared_exports
from .theme import line_html


class CompareExtras(CompareUpdates):
    """Replay, the `compare` API and ZeroGPU sizing for the Compare tab (see the module docstring)."""

    def run_gpu_s(self, data: dict) -> int:
        """ZeroGPU seconds a Run asks for: its picked columns × max new tokens (`zerogpu.estimate_s`)."""
        columns = sum(data[card.strategy] not in (None, "", NO_STRATEGY) for card in self.cards)
        try:
            tokens = int(data[self.max_new_tokens] or 1)
        except (TypeError, ValueError):
            tokens = 1
        return zerogpu.estimate_s(columns, tokens)

    def api_gpu_s(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None) -> int:
        """ZeroGPU seconds a `compare` API call asks for: the preset's columns × its (or the given) tokens."""
        try:
            loaded = load_preset(self.presets[preset])
        except (KeyError, PresetError):
            return zerogpu.MIN_DURATION_S
        return zerogpu.estimate_s(len(loaded.columns), int(max_new_tokens or loaded.generation.max_new_tokens))

    def open_shared(self, session: dict, request: gr.Request) -> dict:
        """Page load: the result a share link names (`?run=<id>`, `kvlab.ui.records.SHARE_PARAM`) shown as
        `replay` shows it, with its own exports and link; nothing without the parameter; a link whose result
        is no longer kept says so in the status line."""
        run_id = dict(request.query_params).get(SHARE_PARAM) if request is not None else None
        if not run_id:
            return {self.run_status: gr.skip()}  # an empty dict would read as one value for every output
        exports = shared_exports(run_id)
        if exports is None:
            return {self.run_status: line_html(f"✖ the shared result {run_id!r} is not kept on this server any "
                                               "more (results are kept a day): run it again", "error")}
        return self.replay(exports[0], session, exports)

    def replay(self, path: str | None, session: dict, exports: list[str] | None = None) -> dict:
        """A record uploaded: its columns, plots, summary and code as measured, labelled `replayed: measured on
        <machine> at <time>`; a file that is not a replayable record says why in the status line. `exports`:
        the result's files when they are already kept here (a share link), else they are written."""
        if not path:
            return {self.run_status: gr.skip()}
        try:
            replayed = load_record(path)
        except RecordError as err:
            return {self.run_status: line_html(f"✖ cannot replay this file: {err}", "error")}
        view = view_from_record(replayed)
        session["view"] = view
        updates = {**self.plots.cleared(), **self._column_updates(view, set(range(len(view.columns)))),
                   **self.plots.updates(view), **self._summary_updates(view, replayed.record, exports),
                   self.code: replay_code(replayed.record), self.run_status: line_html(replayed.label, "ok")}
        return {**self._replayed_cards(view), **updates}

    def _replayed_cards(self, view) -> dict:
        """Each card set to its recorded strategy and knobs; cards the record does not use emptied."""
        updates = {}
        for slot, card in enumerate(self.cards):
            name, knobs = NO_STRATEGY, {}
            if slot in view.slots:
                result = view.columns[view.slots.index(slot)].result
                name, knobs = result.strategy, dict(result.knobs)
            updates[card.strategy] = name
            try:
                updates.update(self.card_updates(slot, name, knobs, None))
            except StrategyError:
                updates.update(self.card_updates(slot, name, {}, None))
        return updates

    def api_compare(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None) -> dict:
        """Run a preset headless and return its JSON run record (what `python -m kvlab compare --json` writes).

        Args:
            preset: the name of a file in presets/ (e.g. "quickstart").
            prompt: replaces the preset's prompt text when given.
            max_new_tokens: replaces the preset's max_new_tokens when given.
        """
        if preset not in self.presets:
            raise gr.Error(f"unknown preset {preset!r}; available: {', '.join(self.presets)}")
        try:
            return run_preset(self.loader, self.presets[preset], preset, prompt, max_new_tokens)
        except (PresetError, ModelLoadError, ValueError) as err:
            raise gr.Error(str(err)) from None
