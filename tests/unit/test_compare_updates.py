"""kvlab.ui.compare.updates with fake runner events: the summary table is sent as soon as every column finished
(`SummaryReady`), before any fidelity figure, and again as each column's fidelity is scored. No model."""

import threading

import gradio as gr
import pytest

from kvlab.compare.events import ColumnDone, ColumnResult, ColumnStarted, FidelityScored, SummaryReady
from kvlab.protocol import RunDone
from kvlab.ui.compare.updates import CompareUpdater
from kvlab.ui.shared.cards import StrategyCard
from kvlab.ui.compare.view import HEADERS, PENDING, RunView

pytestmark = pytest.mark.unit


class NoPlots:
    def updates(self, view):
        return {}


def updater() -> CompareUpdater:
    cards = [StrategyCard(gr.Dropdown(), [], gr.Markdown(), gr.HTML(), gr.Textbox()) for _ in range(2)]
    return CompareUpdater(cards=cards, plots=NoPlots(), run_status=gr.HTML(), results=gr.Column(),
                          summary=gr.Dataframe(), summary_notes=gr.Markdown(), exports=gr.File(), share=gr.HTML(),
                          code=gr.Code(), knob_count=0)


def test_the_summary_is_sent_before_the_fidelity_figures_and_filled_in_after():
    results = [ColumnResult(i, name, name, {}, status="ok", token_ids=[1, 2], agreement=1.0)
               for i, name in enumerate(["dynamic", "quantized"])]
    results[0].is_baseline = True
    up, view = updater(), RunView(["dynamic", "quantized"])

    def scored(i):
        results[i].top1_agreement, results[i].mean_kl, results[i].fidelity_status = 0.5, 0.25, "scored"
        return FidelityScored(i, results[i], i + 1, 2)

    events = [ColumnStarted(0, "dynamic", 3), ColumnStarted(1, "quantized", 3), ColumnDone(0, results[0]),
              ColumnDone(1, results[1]), SummaryReady(results, 1.5, {}, 2)]
    sent = list(up.throttled(view, iter(events), threading.Event()))
    top1 = HEADERS["top1_agreement"]
    table = sent[-1][up.summary]
    assert table["headers"][table["headers"].index(top1)] == top1
    assert {row[table["headers"].index(top1)] for row in table["value"]} == {PENDING}
    assert "fidelity: 0 of 2 columns scored" in sent[-1][up.run_status]
    sent = list(up.throttled(view, iter([scored(0)]), threading.Event()))
    row = sent[-1][up.summary]["value"][0]
    assert row[table["headers"].index(top1)].startswith("50.0%")
    assert "fidelity: 1 of 2 columns scored" in sent[-1][up.run_status]
    assert list(up.throttled(view, iter([scored(1), RunDone({"summary_s": 1.5}, 3.0, False, results)]),
                             threading.Event()))[-1][up.summary]["value"][1][table["headers"].index(top1)] != PENDING
