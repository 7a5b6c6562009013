"""The component updates of a Compare run, mixed into `kvlab.ui.compare_tab.CompareTab`.

- `_start_updates`: results cleared, each card's status (invalid settings, unused, waiting), strategy
  choices for the run's model.
- `_column_updates`: the changed columns' status line and text from the `RunView`.
- `_final_updates`, `_summary_updates`: the last column updates, plots, summary table, exports and code.

The methods read the tab's components (`self.cards`, `self.plots`, `self.summary`, ...) and return
{component: gr.update}; they run nothing.
"""

from __future__ import annotations

import gradio as gr

from .compare_form import RunPlan
from .compare_view import RunView
from .knobs import strategy_choices
from .records import code_text, record_for, share_id, write_exports
from .theme import line_html, share_html, status_html


class CompareUpdates:
    """What the page shows at the start, during and at the end of a run (see the module docstring)."""

    def _start_updates(self, plan: RunPlan, view: RunView, loaded) -> dict:
        """Cleared results, every card's status, strategy choices marked for the run's (maybe new) model."""
        choices = strategy_choices(loaded)
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
        updates.update(self._column_updates(view, set(range(len(view.columns)))))
        return updates

    def _column_updates(self, view: RunView, indices: set[int]) -> dict:
        updates = {}
        for i in sorted(indices):
            column, card = view.columns[i], self.cards[view.slots[i]]
            updates[card.status] = gr.update(
                value=status_html(column.title, column.status, column.readout(), column.message, column.keeps),
                visible=True)
            updates[card.text] = gr.update(value=column.text, visible=True)
        return updates

    def _final_updates(self, plan: RunPlan, view: RunView, loaded) -> dict:
        updates = self._column_updates(view, set(range(len(view.columns))))
        updates.update(self.plots.updates(view))
        if view.done is None:
            updates[self.run_status] = line_html("the run ended without a result", "error")
            return updates
        updates.update(self._summary_updates(view, record_for(plan, loaded, view.done, view)))
        updates[self.code] = code_text(plan, view)
        errors = [f"column {s + 1}: {m}" for s, m in plan.slot_errors.items()]
        status = view.progress_text() + (" — not run: " + "; ".join(errors) if errors else "")
        updates[self.run_status] = line_html(status, "error" if errors else "ok")
        return updates

    def _summary_updates(self, view: RunView, record: dict, exports: list[str] | None = None) -> dict:
        """The summary table shown, the record and CSV offered for download (`exports`: files already written
        for this result, else written now) and the link that opens this result again (`share_html`)."""
        headers, table = view.summary_table()
        rows, _ = view.summary()
        exports = exports or write_exports(record, rows)
        return {self.summary: gr.update(value=table, headers=headers), self.results: gr.update(visible=True),
                self.exports: exports, self.share: share_html(share_id(exports)),
                self.summary_notes: view.summary_notes()}
