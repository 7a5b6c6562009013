"""PlanTab's handlers, called as the page calls them, in an in-process `gr.Blocks` beside a Compare tab (no
browser, no model loaded): a plan fills its outputs, bad input changes the status line only, and "measure it
for real" fills Compare's model and columns and switches to Compare."""

import html

import pytest

gr = pytest.importorskip("gradio")

from kvlab.models.loading import ModelPool  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.plan.tab import PlanTab  # noqa: E402

GEMMA = "google/gemma-3-27b-it"


@pytest.fixture(scope="module")
def tabs():
    pool = ModelPool()
    with gr.Blocks():
        with gr.Tabs() as app_tabs:
            with gr.Tab("Compare", id="compare"):
                compare = CompareTab(pool, preload=False).build()
            with gr.Tab("Plan"):
                plan = PlanTab(pool, compare, app_tabs, "compare").build()
    return plan, compare, app_tabs


def final(updates) -> dict:
    """The last update a streamed handler yields (what the page shows when it ends)."""
    *_, last = updates
    return last


def page(plan: PlanTab, **values) -> dict:
    """The event's {component: value} inputs: the page as it opens, with `values` typed in by field name."""
    data = {component: component.value for component in plan.inputs}
    for name, value in values.items():
        data[getattr(plan, name)] = value
    return data


def test_plan_fills_the_status_table_plot_and_explanations(tabs):
    plan, _, _ = tabs
    updates = final(plan.plan(page(plan, model=GEMMA, contexts="1k, 128k")))
    assert set(updates) == {plan.status, plan.model_info, plan.table, plan.plot, plan.explain}
    assert "planned 6 strategies × 2 contexts" in updates[plan.status]
    table = updates[plan.table]["value"]
    assert list(table["strategy"]) == ["dynamic", "static", "quantized quanto int4 r128", "quantized hqq int4 r128",
                                       "sink 4+1020", "sliding_window"]
    assert list(table.columns)[-2] == "max context in 24 GiB"
    assert "Gemma3ForConditionalGeneration" in updates[plan.model_info]


@pytest.mark.parametrize("values,message", [
    ({"contexts": "0"}, "context must be an integer from 1"),
    ({"batch": 0}, "batch must be an integer from 1"),
    ({"model": "gemma"}, "unknown model 'gemma'"),
])
def test_bad_input_changes_the_status_line_only(tabs, values, message):
    plan, _, _ = tabs
    updates = final(plan.plan(page(plan, **values)))
    assert list(updates) == [plan.status]
    assert "✖" in updates[plan.status] and html.escape(message) in updates[plan.status]


def test_measure_it_for_real_fills_compare_and_switches_to_it(tabs):
    plan, compare, app_tabs = tabs
    assert plan.measurable("bundled") and not plan.measurable(GEMMA)
    updates = plan.measure(page(plan, model="bundled"))
    assert set(updates) <= set(plan.measure_outputs)
    assert updates[compare.model_source] == "bundled"
    assert updates[app_tabs].selected == "compare"
    picked = [updates[card.strategy] for card in compare.cards]
    assert picked == ["dynamic", "static", "quantized", "quantized", "sink", "sliding_window", "(none)", "(none)"]
    assert updates[compare.cards[3].knobs[0]]["value"] == "hqq"
    assert updates[compare.cards[4].knobs[0]]["value"] == "1024"


def test_a_closed_plan_stream_stops_before_the_next_strategy(tabs, monkeypatch):
    """Stop and a closed page both close the handler's generator (gradio's cancel and its disconnect)."""
    from kvlab.plan import planner

    plan, _, _ = tabs
    planned = []
    real = planner._plan_strategy
    monkeypatch.setattr(planner, "_plan_strategy", lambda *args: planned.append(args[1].name) or real(*args))
    stream = plan.plan(page(plan, model=GEMMA, contexts="1k"))
    first, second = next(stream), next(stream)
    assert list(first) == list(second) == [plan.status]
    assert "planning google/gemma-3-27b-it: 1 of 6 strategies done" in second[plan.status]
    stream.close()
    assert planned == ["dynamic"]


def test_stop_cancels_both_plan_triggers():
    with gr.Blocks() as demo:
        plan = PlanTab(ModelPool()).build()
    events = {event["id"] for event in plan.plan_events}
    cancelling = [fn for fn in demo.fns.values()
                  if fn.cancels and any(target[0] == plan.stop_button._id for target in fn.targets)]
    assert len(events) == 2 and [set(fn.cancels) for fn in cancelling] == [events]


def test_the_apps_background_plans_answer_the_opening_page_of_a_catalog_model(tabs, monkeypatch):
    from kvlab.plan import measured
    from kvlab.plan.catalog import known_models
    from kvlab.ui.plan import warm
    from kvlab.ui.plan.view import default_requests

    every = default_requests()
    assert [request.model for request in every] == known_models()
    assert all(len(request.strategies) == 6 and len(request.contexts) == 5 for request in every)
    monkeypatch.setattr(warm, "default_requests", lambda: [r for r in every if r.model == GEMMA])
    measured.forget_all()
    try:
        assert warm.fill_catalog(quiet_s=0.0) == 1
        filled = measured.cache_info()
        assert filled["misses"] >= 4 and filled["hits"] == 0
        plan, _, _ = tabs
        updates = final(plan.plan(page(plan, model=GEMMA)))
        assert "planned 6 strategies × 5 contexts" in updates[plan.status]
        after = measured.cache_info()
        assert after["misses"] == filled["misses"] and after["hits"] == filled["misses"]
    finally:
        measured.forget_all()


def test_background_plans_stop_when_asked(monkeypatch):
    import threading

    from kvlab.ui.plan import warm

    stop = threading.Event()
    stop.set()
    assert warm.fill_catalog(stop) == 0
