"""The Plan tab: what a KV cache costs for any model at any context length, before loading the model.

This module lays out the components and wires their events; nothing else. The
form, the table, the plot and the texts are `kvlab.ui.plan.view`'s, the strategy
cards are Compare's (`kvlab.ui.shared.knobs`, `kvlab.ui.shared.cards`), and planning is
`kvlab.plan.planner`'s, run one strategy per step on kvlab's compute thread
(`kvlab.compute.compute_iter`) so that its CPU measurements (hqq) never compete
with a Compare run's torch threads. Plan streams a status line per step; Stop
(gradio's `cancels`) or a closed page ends the plan between two steps. When
the app preloads the bundled model, the planner's warm-up is part of that load
(`kvlab.ui.plan.warm`) and the opening form's plan of every catalog model follows
in the background, when the compute thread is idle (kept by `kvlab.plan.measured`),
so the first plan a user asks for pays no one-time set-up and a catalog model's
figures are read back. "Measure it for real", shown for the bundled model and any model the
app holds loaded, fills Compare's model and columns from this tab's cards and
switches to Compare.
"""

from __future__ import annotations

import logging
import threading

import gradio as gr
import pandas as pd

from kvlab.compute import compute_iter
from kvlab.models.bundled import bundled_model
from kvlab.models.loading import ModelLoadError, ModelSpec
from kvlab.models.sources import allow_local_folders, safe_line
from kvlab.plan.planner import DTYPES

from ..shared.cards import StrategyCard, build_card
from ..shared.knobs import card_form, max_knobs, strategy_choices
from .warm import fill_catalog, warm_planner_once
from .view import (
    BUDGET_HELP,
    CONTEXT_HELP,
    DEFAULT_BUDGET,
    DEFAULT_CONTEXTS,
    DEFAULT_DTYPE,
    DEFAULT_MODEL,
    INTRO,
    MEASURE_HELP,
    PLAN_SLOTS,
    PlanForm,
    PlanRejected,
    budget_choices,
    compare_columns,
    model_choices,
    plan_progress,
    slot_forms,
)
from ..shared.theme import line_html

logger = logging.getLogger(__name__)

PRIVATE = {"concurrency_limit": None, "api_visibility": "private"}
"""Planning is light (no weights) and queues on the compute thread itself; it stays out of the API."""
CARDS_PER_ROW = 4
MODEL_INFO = "the catalog or 'bundled'; or type a hub id or a folder with config.json"
PUBLIC_MODEL_INFO = "the catalog or 'bundled'; or type a hub id (owner/name)"
"""The model box's hint where local folders are off (`kvlab.models.sources.allow_local_folders`)."""
TABLE_MAX_HEIGHT_PX = 1200
"""Tall enough for eight strategies whose notes wrap, so the table does not scroll."""


class PlanTab:
    """The Plan tab's components and handlers (build it with `build_plan_tab`).

    Args:
        pool: the app's shared ModelPool (which models are loaded, for "measure it for real").
        compare: the Compare tab (`kvlab.ui.compare.tab.CompareTab`) the link fills, or None for no link.
        tabs, compare_tab: the app's `gr.Tabs` and the Compare tab's id, to switch to it.
        warm: run the planner's warm-up in the background once the bundled model has loaded.
    """

    def __init__(self, pool, compare=None, tabs=None, compare_tab: str | None = None, warm: bool = False):
        self.pool, self.compare, self.tabs, self.compare_tab = pool, compare, tabs, compare_tab
        self.knob_count = max_knobs()
        if warm:
            threading.Thread(target=self._warm, daemon=True, name="kvlab-plan-warm").start()

    def _warm(self) -> None:
        """After the bundled model's load (never during it: both would share 2 cores), warm the planner (done
        already when the load's own steps did, `kvlab.ui.plan.warm`), then plan the opening form of every
        catalog model in the background, each when the compute thread is idle (`fill_catalog`)."""
        if self.compare is not None:
            try:
                self.compare.loader.get(ModelSpec())
            except ModelLoadError:
                pass  # Compare shows the load error; the planner needs no model
        try:
            warm_planner_once()
            fill_catalog()
        except Exception:  # noqa: BLE001 - a failed warm-up only makes a first plan slower
            logger.exception("planner warm-up failed")

    # ----- building -----

    def build(self) -> "PlanTab":
        gr.Markdown(INTRO, elem_classes=["kv-intro"])
        with gr.Row(equal_height=False):
            self.model = gr.Dropdown(model_choices(), value=DEFAULT_MODEL, allow_custom_value=True, label="Model",
                                     scale=3, elem_id="plan-model",
                                     info=MODEL_INFO if allow_local_folders() else PUBLIC_MODEL_INFO)
            self.dtype = gr.Dropdown(list(DTYPES), value=DEFAULT_DTYPE, label="dtype", scale=1, elem_id="plan-dtype",
                                     info="weights and cache")
            self.batch = gr.Number(1, precision=0, label="batch", scale=1, elem_id="plan-batch", info="sequences")
        with gr.Row(equal_height=False):
            self.contexts = gr.Textbox(DEFAULT_CONTEXTS, label="Context lengths", info=CONTEXT_HELP, scale=3,
                                       elem_id="plan-contexts")
            self.budget = gr.Dropdown(budget_choices(), value=DEFAULT_BUDGET, allow_custom_value=True,
                                      label="GPU budget (GiB)", info=BUDGET_HELP, scale=2, elem_id="plan-budget")
        self._build_cards()
        with gr.Row(equal_height=True, elem_classes=["kv-runbar"]):
            self.plan_button = gr.Button("Plan", variant="primary", scale=0, min_width=120, elem_id="plan-run")
            self.stop_button = gr.Button("Stop", variant="stop", scale=0, min_width=120, elem_id="plan-stop")
            self.status = gr.HTML(line_html("ready: pick a model, contexts, a budget and strategies, then Plan"),
                                  elem_id="plan-status")
        with gr.Row(equal_height=True, visible=self.measurable(DEFAULT_MODEL), elem_id="plan-measure-box") as box:
            self.measure_box = box
            self.measure_button = gr.Button("Measure it for real", scale=0, min_width=180, elem_id="plan-measure")
            gr.Markdown(MEASURE_HELP, elem_classes=["kv-small"])
        self.model_info = gr.Markdown("", elem_id="plan-model-info")
        self.table = gr.Dataframe(value=None, interactive=False, wrap=True, max_height=TABLE_MAX_HEIGHT_PX,
                                  label="Plan: GiB = 2^30 bytes; ✔/✖: weights + cache fit the budget",
                                  elem_id="plan-table")
        self.plot = gr.Plot(show_label=False, elem_id="plan-plot", format="png")
        with gr.Accordion("How each strategy's bytes grow", open=True):
            self.explain = gr.Markdown("", elem_id="plan-explain")
        self._wire()
        return self

    def _build_cards(self) -> None:
        self.cards: list[StrategyCard] = []
        choices = strategy_choices(None)
        forms = slot_forms()
        for row_start in range(0, PLAN_SLOTS, CARDS_PER_ROW):
            with gr.Row(equal_height=False, elem_classes=["kv-cards"]):
                for slot, (name, knobs) in enumerate(forms[row_start:row_start + CARDS_PER_ROW], row_start):
                    form = card_form(name, knobs, None, self.knob_count)
                    self.cards.append(build_card(form, choices, name, f"Strategy {slot + 1}", f"plan-col-{slot}",
                                                 outputs=False, classes=(f"kv-slot-{slot}",),
                                                 elem_id=f"plan-card-{slot}"))

    # ----- wiring -----

    def _wire(self) -> None:
        for card in self.cards:
            card.strategy.input(lambda name, card=card: card.updates(card_form(name, {}, None, self.knob_count)),
                                card.strategy, card.form_outputs, show_progress="hidden", **PRIVATE)
        self.inputs = {self.model, self.contexts, self.batch, self.dtype, self.budget,
                       *[card.strategy for card in self.cards], *[box for card in self.cards for box in card.knobs]}
        outputs = [self.status, self.model_info, self.table, self.plot, self.explain]
        self.plan_events = [trigger(self.plan, self.inputs, outputs, show_progress="minimal",
                                    show_progress_on=[self.status], **PRIVATE)
                            for trigger in (self.plan_button.click, self.contexts.submit)]
        self.stop_button.click(lambda: line_html("stopped: press Plan to plan again"), None, self.status,
                               cancels=self.plan_events, show_progress="hidden", **PRIVATE)
        self.model.change(lambda source: gr.update(visible=self.measurable(source)), self.model, self.measure_box,
                          show_progress="hidden", **PRIVATE)
        if self.compare is not None:
            compare = self.compare
            self.measure_outputs = [compare.model_source, compare.run_status, *[c.strategy for c in compare.cards],
                                    *[c for card in compare.cards for c in card.form_outputs]]
            if self.tabs is not None:
                self.measure_outputs.append(self.tabs)
            self.measure_button.click(self.measure, self.inputs, self.measure_outputs, show_progress="hidden",
                                      **PRIVATE)

    # ----- handlers -----

    def form_from(self, data: dict) -> PlanForm:
        """A PlanForm from an event's {component: value} inputs."""
        return PlanForm(model=data[self.model], contexts=data[self.contexts], batch=data[self.batch],
                        dtype=data[self.dtype], budget=data[self.budget],
                        slots=[(data[card.strategy], [data[box] for box in card.knobs]) for card in self.cards])

    def plan(self, data: dict):
        """Plan, streamed: the status line after each step, then the table, plot, model line and explanations;
        bad input changes the status line only. Closing the generator (Stop, a closed page) stops the plan
        between two steps."""
        try:
            for item in plan_progress(self.form_from(data), compute_iter):
                yield {self.status: line_html(item, "busy")} if isinstance(item, str) else self.shown(item)
        except PlanRejected as err:
            yield {self.status: line_html(f"✖ {err}", "error")}
        except Exception as err:  # noqa: BLE001 - the page shows what went wrong; the app keeps serving
            logger.exception("plan failed")
            yield {self.status: line_html(f"✖ the plan failed: {type(err).__name__}: {safe_line(str(err))}",
                                          "error")}

    def shown(self, view) -> dict:
        """The outputs of a finished plan's `PlanView`."""
        text, kind = view.status()
        return {self.status: line_html(text, kind), self.model_info: view.model_text(),
                self.table: gr.update(value=pd.DataFrame(view.rows(), columns=view.headers()),
                                      column_widths=view.column_widths()),
                self.plot: view.figure(),
                self.explain: view.explanations()}

    def measurable(self, source) -> bool:
        """Whether "measure it for real" applies: a bundled model (Compare loads it on Run), or one the app holds
        loaded."""
        source = (source or "").strip()
        try:
            return bundled_model(source) is not None or bool(source) and self.pool.loaded(ModelSpec(source)) is not None
        except (ModelLoadError, ValueError):
            return False

    def measure(self, data: dict) -> dict:
        """Fill Compare's model and columns from this tab and switch to Compare."""
        compare, source = self.compare, (data[self.model] or "").strip()
        loaded = self.pool.loaded(ModelSpec(source)) if self.measurable(source) else None
        updates = {compare.model_source: source,
                   compare.run_status: line_html(f"columns from the Plan tab on {source}: press Run to measure")}
        for slot, (name, knobs) in enumerate(compare_columns(self.form_from(data).slots)):
            updates[compare.cards[slot].strategy] = name
            updates.update(compare.card_updates(slot, name, knobs, loaded))
        if self.tabs is not None:
            updates[self.tabs] = gr.Tabs(selected=self.compare_tab)
        return updates


def build_plan_tab(pool, compare=None, tabs=None, compare_tab: str | None = None, warm: bool = False) -> PlanTab:
    """Build the Plan tab inside the current `gr.Tab`; see `PlanTab` for the arguments."""
    return PlanTab(pool, compare, tabs, compare_tab, warm).build()
