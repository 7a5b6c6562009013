"""The component updates of a Compare run: `CompareUpdater` turns a `RunPlan` and a `RunView` into
{component: gr.update} dicts.

- `start`: results cleared, each card's status (invalid settings, unused, waiting), strategy choices for the
  run's model.
- `columns`: the changed columns' status line and text from the `RunView`; `throttled`: the runner's events
  folded into the view, yielding column updates at most every TEXT_EVERY_S and plots less often, and the
  summary (`summary_live`) as soon as every column finished, again as each column's fidelity is scored.
- `final`, `summary`: the last column updates, plots, summary table, exports and code.
- `card`, `recorded_cards`: a card set to a strategy and its knobs; every card set to a replayed record's
  columns.

The updater is built once the tab's components exist and is handed exactly the components it updates; it runs
nothing and reads no other state.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import gradio as gr

from kvlab.compare.events import FidelityScored, RunPhase, SummaryReady
from kvlab.strategies import StrategyError

from ..shared.cards import StrategyCard
from ..shared.exports import offered_copies
from .form import RunPlan
from ..shared.live_plots import LivePlots
from .view import RunView
from ..shared.knobs import NO_STRATEGY, card_form, strategy_choices
from .kept_runs import policy_text
from .records import code_text, keep_exports, record_for, share_id
from ..shared.theme import line_html, share_html, status_html

TEXT_EVERY_S = 0.5
"""Least time between two streamed updates of the column texts and statuses (each update is work for the
server and the browser, on the same cores as the model on a small machine)."""
PLOT_EVERY_S = 2.0
"""Least time between two redraws of the live plots."""
PLOT_COST_FACTOR = 5.0
"""A redraw waits at least this many times the last redraw's cost (drawing plus sending), so the plots
never take more than about a fifth of the CPU time the model could use on a slow machine."""


@dataclass
class CompareUpdater:
    """What the page shows at the start, during and at the end of a run (see the module docstring).

    knob_count: how many knob fields each card has (`kvlab.ui.shared.knobs.max_knobs`).
    """

    cards: list[StrategyCard]
    plots: LivePlots
    run_status: gr.HTML
    results: gr.Column
    summary: gr.Dataframe
    summary_notes: gr.Markdown
    exports: gr.File
    share: gr.HTML
    code: gr.Code
    knob_count: int
    form: dict = field(default_factory=dict)
    """`RunRequest` field name -> the form component holding it (what a replay restores)."""

    def card(self, slot: int, name: str, knobs: dict, loaded) -> dict:
        """{component: gr.update} setting card `slot` to strategy `name` with `knobs` (marked for `loaded`)."""
        return self.cards[slot].updates(card_form(name, knobs, loaded, self.knob_count))

    def start(self, plan: RunPlan, view: RunView, loaded) -> dict:
        """Cleared results, every card's status, strategy choices marked for the run's (maybe new) model."""
        choices = strategy_choices(loaded, engines=True)
        updates = {self.run_status: line_html("starting…", "busy"), **self.plots.cleared(),
                   self.results: gr.update(visible=False), self.summary: None, self.exports: None, self.code: "",
                   self.share: "", self.summary_notes: "",
                   **{card.strategy: gr.update(choices=choices) for card in self.cards}}
        for slot, card in enumerate(self.cards):
            if slot in plan.slot_errors:
                updates[card.status] = gr.update(value=status_html("invalid settings", "error", "",
                                                                   plan.slot_errors[slot]), visible=True)
                updates[card.text] = gr.update(value="", visible=True)
            elif slot not in plan.slots:
                updates[card.status] = gr.update(value="", visible=False)
                updates[card.text] = gr.update(value="", visible=False)
        updates.update(self.columns(view, set(range(len(view.columns)))))
        return updates

    def columns(self, view: RunView, indices: set[int]) -> dict:
        """The status line and text of the view's columns `indices` (run order), each in its page slot's card."""
        updates = {}
        for i in sorted(indices):
            column, card = view.columns[i], self.cards[view.slots[i]]
            updates[card.status] = gr.update(
                value=status_html(column.title, column.status, column.readout(), column.message, column.keeps),
                visible=True)
            updates[card.text] = gr.update(value=column.text, visible=True)
        return updates

    def throttled(self, view: RunView, events, stop: threading.Event):
        """Fold every event into `view`; yield column updates at most every TEXT_EVERY_S and plots less often."""
        last_text = time.monotonic()
        plot_due = last_text + PLOT_EVERY_S
        changed: set[int] = set()
        for event in events:
            changed |= view.apply(event)
            view.stop_requested = stop.is_set()
            now = time.monotonic()
            at_once = isinstance(event, (RunPhase, SummaryReady, FidelityScored))
            if view.done is not None or (now - last_text < TEXT_EVERY_S and not at_once):
                continue  # a new phase, the summary and each fidelity score are shown at once
            updates = self.columns(view, changed)
            updates[self.run_status] = line_html(view.progress_text(), "busy")
            if view.ready is not None:
                updates.update(self.summary_live(view))
            plotted = now >= plot_due
            if plotted:
                updates.update(self.plots.updates(view))
            changed = set()
            yield updates
            last_text = time.monotonic()
            if plotted:
                plot_due = last_text + max(PLOT_EVERY_S, PLOT_COST_FACTOR * (last_text - now))

    def final(self, plan: RunPlan, view: RunView, owner: str | None = None) -> dict:
        """Every column, the plots, the summary with its exports (kept for the client at address `owner`) and
        code, and the closing status line."""
        updates = self.columns(view, set(range(len(view.columns))))
        updates.update(self.plots.updates(view))
        if view.done is None:
            updates[self.run_status] = line_html("the run ended without a result", "error")
            return updates
        updates.update(self.summary_updates(view, record_for(plan, view.done, view), owner=owner))
        updates[self.code] = code_text(plan, view)
        errors = [f"column {s + 1}: {m}" for s, m in plan.slot_errors.items()]
        status = view.progress_text() + (" — not run: " + "; ".join(errors) if errors else "")
        updates[self.run_status] = line_html(status, "error" if errors else "ok")
        return updates

    def summary_live(self, view: RunView) -> dict:
        """The summary table shown as soon as every column finished, its teacher-forced figures filling in as the
        fidelity pass scores them (the exports follow with `final`)."""
        headers, table = view.summary_table()
        return {self.summary: gr.update(value=table, headers=headers), self.results: gr.update(visible=True),
                self.summary_notes: view.summary_notes()}

    def summary_updates(self, view: RunView, record: dict, exports: list[str] | None = None,
                        owner: str | None = None) -> dict:
        """The summary table shown, the record and CSV offered for download (`exports`: files already written
        for this result, else written now, kept for the client at address `owner`) and the link that opens this result again (`share_html`)."""
        headers, table = view.summary_table()
        rows, _ = view.summary()
        note = None
        if not exports:
            exports, note = keep_exports(record, rows, owner)
        share = line_html(note, "error") if note else share_html(share_id(exports), policy_text())
        return {self.summary: gr.update(value=table, headers=headers), self.results: gr.update(visible=True),
                self.exports: offered_copies(exports), self.share: share,
                self.summary_notes: view.summary_notes()}

    def recorded_cards(self, view: RunView, record: dict | None = None) -> dict:
        """Each card set to its recorded strategy and knobs; a card the run refused (the record's `refused`) set
        to what was typed in it, with the reason in its status; cards the record does not use emptied."""
        refused = {item.get("slot"): item for item in (record or {}).get("refused") or [] if isinstance(item, dict)}
        updates = {}
        for slot, card in enumerate(self.cards):
            if slot in refused and slot not in view.slots:
                updates.update(self._refused_card(slot, card, refused[slot]))
                continue
            name, knobs = NO_STRATEGY, {}
            if slot in view.slots:
                result = view.columns[view.slots.index(slot)].result
                name, knobs = result.strategy, dict(result.knobs)
            updates[card.strategy] = name
            try:
                updates.update(self.card(slot, name, knobs, None))
            except StrategyError:
                updates.update(self.card(slot, name, {}, None))
        return updates

    def _refused_card(self, slot: int, card: StrategyCard, item: dict) -> dict:
        """Card `slot` as the refused run left it: its strategy, the knob fields as typed, the reason."""
        name = str(item.get("strategy") or NO_STRATEGY)
        updates = {card.strategy: name, **self.card(slot, name, {}, None)}
        for box, value in zip(card.knobs, item.get("values") or []):
            updates[box] = gr.update(value="" if value is None else str(value))
        updates[card.status] = gr.update(value=status_html("invalid settings", "error", "",
                                                           str(item.get("message", ""))), visible=True)
        updates[card.text] = gr.update(value="", visible=True)
        return updates
