"""The strategy card, shared by the Compare columns, the Chat tab and the Inspect tab: a strategy dropdown, one
text field per knob and the strategy's help text (Compare's cards also hold a status badge and the streamed
text, and with the Chat card the column's cache budget and fallback chain).

What a card shows comes from `kvlab.ui.shared.knobs.card_form` (generated from the strategy dataclasses); this module
only lays the components out and turns that form into gradio updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .knobs import BUDGET_HELP, BUDGET_PLACEHOLDER, FALLBACK_HELP, FALLBACK_PLACEHOLDER

KNOB_MIN_WIDTH = 76


@dataclass
class StrategyCard:
    """The components of one card. `status` and `text` exist on Compare's cards only; `budget` and `fallback` on
    cards built with `budget=True`."""

    strategy: gr.Dropdown
    knobs: list[gr.Textbox]
    about: gr.Markdown
    status: gr.HTML | None = None
    text: gr.Textbox | None = None
    budget: gr.Textbox | None = None
    fallback: gr.Textbox | None = None

    @property
    def form_outputs(self) -> list:
        """The components a change of strategy updates: about, knob fields, and the optional ones present."""
        return [c for c in (self.about, *self.knobs, self.status, self.text, self.budget, self.fallback)
                if c is not None]

    def updates(self, form: dict) -> dict:
        """{component: gr.update} from a `knobs.card_form` dict."""
        updates = {self.about: gr.update(**form["about"])}
        for box, props in zip(self.knobs, form["knobs"]):
            updates[box] = gr.update(**props)
        for name in ("status", "text", "budget", "fallback"):
            if getattr(self, name) is not None:
                updates[getattr(self, name)] = gr.update(**form[name])
        return updates


def build_card(form: dict, choices: list, value: str, label: str, elem_prefix: str, *, outputs: bool,
               classes: tuple[str, ...] = (), elem_id: str | None = None, budget: bool = False) -> StrategyCard:
    """Lay out one card in the current gradio context.

    Args:
        form: `knobs.card_form(value, ...)`, the initial about text, knob fields, status and text.
        choices: the dropdown's (label, value) pairs; value: the strategy picked at first; label: its label.
        elem_prefix: element ids are `{prefix}-strategy`, `{prefix}-knob-{j}`, `{prefix}-status`, `{prefix}-text`.
        outputs: add the status badge and the streamed-text box (Compare's columns).
        classes, elem_id: of the card's column.
        budget: add the cache-budget and fallback-chain fields (`{prefix}-budget`, `{prefix}-fallback`).
    """
    with gr.Column(min_width=240, elem_classes=["kv-card", *classes], elem_id=elem_id):
        strategy = gr.Dropdown(choices, value=value, label=label, elem_id=f"{elem_prefix}-strategy")
        status = text = None
        if outputs:
            status = gr.HTML(**form["status"], elem_id=f"{elem_prefix}-status")
            text = gr.Textbox(**form["text"], lines=9, max_lines=9, show_label=False, interactive=False,
                              autoscroll=True, elem_id=f"{elem_prefix}-text", elem_classes=["kv-text"])
        with gr.Row(equal_height=False, elem_classes=["kv-knobs"]):
            knobs = [gr.Textbox(**props, min_width=KNOB_MIN_WIDTH, max_lines=1, elem_id=f"{elem_prefix}-knob-{j}")
                     for j, props in enumerate(form["knobs"])]
        budget_box = fallback_box = None
        if budget:
            with gr.Row(equal_height=False, elem_classes=["kv-knobs"]):
                budget_box = gr.Textbox(**form["budget"], label=BUDGET_HELP, placeholder=BUDGET_PLACEHOLDER,
                                        min_width=KNOB_MIN_WIDTH, max_lines=1, scale=1,
                                        elem_id=f"{elem_prefix}-budget")
                fallback_box = gr.Textbox(**form["fallback"], label=FALLBACK_HELP, placeholder=FALLBACK_PLACEHOLDER,
                                          min_width=KNOB_MIN_WIDTH, max_lines=1, scale=3,
                                          elem_id=f"{elem_prefix}-fallback")
        about = gr.Markdown(**form["about"], elem_classes=["kv-about"])
    return StrategyCard(strategy, knobs, about, status, text, budget_box, fallback_box)
