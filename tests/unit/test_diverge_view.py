"""Inspect's "compare with" view on the tiny random Llama: the figure and summary of a lockstep session, the
link from Compare's first-divergence cell (built, parsed, rendered as a link in the summary), and the tab opening
such a link at its token with both strategies; a replayed record's links, or why a cell has none."""

import json
from html import unescape
import types
from pathlib import Path
from urllib.parse import parse_qsl

import gradio as gr
import pytest
import torch

from kvlab.generation import GenerationSettings
from kvlab.inspect.diverge import DivergeSession
from kvlab.inspect.loops import FullSequenceLoop
from kvlab.strategies import make_strategy
from kvlab.ui.inspect.diverge import diverge_figure, diverge_markdown
from kvlab.ui.shared.inspect_links import (InspectLink, divergence_links, inspect_query, parse_inspect_query,
                                           strategy_item)

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404, 405, 406, 407, 408]])
SINK = {"strategy": "sink", "window_length": 12, "num_sink_tokens": 2}
FIXTURE = Path(__file__).parents[1] / "fixtures" / "record_v2_quickstart.json"


def lockstep(tiny, strategy, steps=6):
    session = DivergeSession(tiny, strategy, PROMPT, GenerationSettings(max_new_tokens=steps, stop_at_eos=False))
    list(session.steps(steps))
    return session


def test_the_figure_and_summary_of_a_sink_session(tiny):
    assert diverge_figure(None) is None and "compare with" in diverge_markdown(None)
    session = lockstep(tiny, make_strategy(SINK))
    figure = diverge_figure(session)
    layers_ax, kl_ax = figure.axes
    assert {line.get_label() for line in layers_ax.lines} == {"KV error (relative)", "attention lost (mass)",
                                                             "hidden drift (relative L2)"}
    assert [x for x in kl_ax.lines[0].get_xdata()] == [0, 1, 2, 3, 4, 5]  # tokens count from 0, as in Compare
    text = unescape(diverge_markdown(session))
    assert "Lockstep with dynamic" in text and "cache holds 12 slots for 15 tokens seen" in text
    assert "attention lost: 0" in text  # layer 0 is the first to lose attention once the window is full


def test_measures_that_cannot_be_computed_are_named_with_the_reason_not_drawn(tiny):
    session = lockstep(tiny, FullSequenceLoop(), steps=3)
    layers_ax, _ = diverge_figure(session).axes
    assert [line.get_label() for line in layers_ax.lines] == ["hidden drift (relative L2)"]
    text = unescape(diverge_markdown(session))
    assert "largest KV error: not computed" in text and "not computed — kv_error: holds" in text
    assert "loop mistake: feeds the whole sequence" in text
    assert diverge_markdown(None, "the model cannot be probed").startswith("**compare with:** ✖")


def test_a_link_round_trips_through_its_query():
    link = InspectLink(strategy="sink:window_length=64", reference="dynamic", prompt="Why & how? 100%",
                       system="", chat=True, max_new_tokens=40, model="bundled", step=7)
    query = inspect_query(link)
    assert query.startswith("?inspect=1&")
    assert parse_inspect_query(dict(parse_qsl(query[1:]))) == link
    assert parse_inspect_query({"prompt": "x"}) is None
    with pytest.raises(ValueError, match="step must be a whole number"):
        parse_inspect_query({"inspect": "1", "step": "x"})
    from kvlab.strategies.base import parse_strategy_item

    for spec in ({"strategy": "quantized", "backend": "hqq", "nbits": 2}, SINK, {"strategy": "dynamic"}):
        strategy = make_strategy(spec)
        assert make_strategy(parse_strategy_item(strategy_item(strategy))) == strategy
    assert strategy_item(make_strategy(SINK)) == "sink:window_length=12:num_sink_tokens=2"


def test_only_diverged_greedy_columns_get_a_link():
    from kvlab.ui.compare.form import RunRequest, plan_run
    from kvlab.ui.compare.view import RunView

    request = RunRequest(prompt="Hi", max_new_tokens=20, slots=[("dynamic", []), ("sink", ["64"])])
    plan = plan_run(request)
    results = [types.SimpleNamespace(first_divergence=None), types.SimpleNamespace(first_divergence=3)]
    links, reasons = divergence_links(request, plan, results)
    assert list(links) == [1] and reasons == {}
    link = parse_inspect_query(dict(parse_qsl(links[1][1:])))
    assert (link.strategy, link.reference, link.step, link.max_new_tokens) == ("sink:window_length=64", "dynamic",
                                                                                3, 20)
    request.decoding = "sample"
    sampled_links, sampled_reasons = divergence_links(request, plan, results)
    assert sampled_links == {} and "sampled run" in sampled_reasons[1]
    view = RunView(["dynamic", "sink"])
    view.divergence_links = links
    assert view._cell(1, "first_divergence", "3") == f"[3]({links[1]})"
    assert view._cell(0, "first_divergence", "–") == "–" and view._cell(1, "agreement", "50%") == "50%"


def test_a_replayed_record_gets_the_same_links_or_says_why_not():
    from kvlab.compare.replay import load_record
    from kvlab.ui.compare.replay import view_from_record
    from kvlab.ui.shared.inspect_links import record_divergence_links

    record = json.loads(FIXTURE.read_text())
    record["columns"][3]["first_divergence"] = 2  # quanto int4
    record["columns"][0]["first_divergence"] = 1  # no_cache: nothing to inspect
    view = view_from_record(load_record(json.dumps(record).encode()))
    link = parse_inspect_query(dict(parse_qsl(view.divergence_links[3][1:])))
    assert (link.strategy.split(":")[0], link.step, link.prompt) == ("quantized", 2, record["prompt"]["text"])
    assert list(view.divergence_links) == [3] and "no_cache keeps no cache" in view.divergence_reasons[0]
    assert "no link into Inspect: no_cache keeps no cache" in unescape(view.summary_notes())
    record["settings"]["do_sample"] = True
    links, reasons = record_divergence_links(record, view.done.results)
    assert links == {} and "sampled run" in reasons[3]


def test_the_tab_opens_a_link_at_its_step_with_both_strategies(tiny_pool):
    from kvlab.ui.inspect.tab import InspectTab

    with gr.Blocks():
        with gr.Tabs() as tabs:
            with gr.Tab("Inspect", id="inspect"):
                tab = InspectTab(tiny_pool).build()
    tab.tabs, tab.tab_id = tabs, "inspect"
    query = inspect_query(InspectLink(strategy="sink:window_length=12:num_sink_tokens=2", reference="dynamic",
                                      prompt="Hi there", system="", chat=False, max_new_tokens=8, model="bundled",
                                      step=4))
    request = types.SimpleNamespace(query_params=dict(parse_qsl(query[1:])), session_hash="link")
    last = list(tab.open_link(request))[-1]
    assert last[tab.card.strategy] == "sink" and last[tab.compare_with] == "dynamic" and last[tab.prompt] == "Hi there"
    state = last[tab.state]
    assert len(state.session.records) == 5 and len(state.diverge.records) == 5
    assert state.session.strategy.describe() == state.diverge.strategy.describe() == "sink 2+10"
    assert "**Token 4** (step 5 of" in last[tab.step_info] and "Lockstep with dynamic" in last[tab.diverge_info]
    assert state.session.token_ids == state.diverge.token_ids
    plain = types.SimpleNamespace(query_params={}, session_hash="plain")
    (update,) = list(tab.open_link(plain))  # a plain page load changes nothing
    assert list(update) == [tabs] and update[tabs] == gr.update()
