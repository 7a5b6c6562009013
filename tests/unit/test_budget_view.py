"""A budgeted Compare column in the page's pure parts: the card's budget fields become a `Budget` (bad ones
stay in their own column), switches reach the column's message and the plot's marks, the record keeps the
budget. No model, no gradio."""

from kvlab.compare.events import ColumnStarted, FallbackSwitched, StepMetrics, TokenEvent
from kvlab.compare.preset import parse_preset
from kvlab.ui.compare.form import RunRequest, plan_run, slot_specs
from kvlab.ui.compare.view import RunView
from kvlab.ui.shared.figures import render_figure
from kvlab.ui.shared.knobs import card_form, column_budget, max_knobs

SWITCH = {"at_token": 3, "from": "dynamic", "to": "quantized hqq int4 r32", "reason": "the dynamic cache would need "
          "3.04 MiB > budget 3.00 MiB", "bytes_before": 3_100_000, "bytes_after": 500_000, "to_spec": {}}


def test_card_budget_fields_become_a_budget_and_bad_ones_stay_in_their_column():
    request = RunRequest(prompt="Hi", slots=[("dynamic", []), ("dynamic", []), ("no_cache", []), ("dynamic", [])],
                         budgets=[("", ""), ("3", "quantized:backend=hqq:residual_length=32 > sink:window_length=48"),
                                  ("2", ""), ("-1", "")])
    plan = plan_run(request)
    assert plan.slots == [0, 1]
    assert plan.budgets[1].budget_bytes == 3 * 1024 * 1024
    assert [s.describe() for s in plan.budgets[1].fallback] == ["quantized hqq int4 r32", "sink 4+44"]
    assert "no_cache keeps no cache" in plan.slot_errors[2] and "budget_mib must be a number" in plan.slot_errors[3]
    columns = plan.run_columns()
    assert [c.describe() for c in columns] == ["dynamic", "dynamic · budget 3.00 MiB"]
    assert column_budget("", "") is None and column_budget("", "sink").budget_bytes is None


def test_a_preset_budget_fills_the_card_fields():
    preset = parse_preset({"name": "p", "prompt": {"text": "hi"}, "columns": [
        {"strategy": "dynamic", "budget_mib": 3, "fallback": [{"strategy": "sink", "window_length": 48}]}]})
    name, knobs = slot_specs(preset.columns)[0]
    form = card_form(name, knobs, None, max_knobs())
    assert form["budget"] == {"value": "3", "visible": True}
    assert form["fallback"]["value"] == "sink:window_length=48"
    assert not card_form("no_cache", {}, None, max_knobs())["budget"]["visible"]


def test_switches_reach_the_message_and_the_plot():
    view = RunView(["dynamic", "dynamic · budget 3.00 MiB"])
    for column in (0, 1):
        view.apply(ColumnStarted(column, view.columns[column].title, 10))
        for step in range(6):
            view.apply(TokenEvent(column, step, 100 + step, " x"))
            if column == 1 and step == 3:
                view.apply(FallbackSwitched(1, SWITCH))
            view.apply(StepMetrics(column, step, 0.1, 1000 * (10 + step), 1000 * (10 + step), 10 + step))
    assert view.columns[1].switches == [SWITCH] and view.columns[0].switches == []
    assert view.columns[1].message == ("switched to quantized hqq int4 r32 at token 3: the dynamic cache would need "
                                       "3.04 MiB > budget 3.00 MiB")
    fig = render_figure(view)
    cache_ax, latency_ax, _ = fig.axes[:3]
    marks = [line for line in cache_ax.get_lines() if list(line.get_xdata()) == [4, 4]]
    assert len(marks) == 1 and len([line for line in latency_ax.get_lines() if list(line.get_xdata()) == [4, 4]]) == 1
    assert [t.get_text() for t in cache_ax.texts] == [" → quantized hqq int4 r32"]
