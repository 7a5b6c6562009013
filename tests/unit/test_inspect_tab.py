"""The Inspect tab's pure view (`kvlab.ui.inspect.view`) and its handlers in an in-process Blocks on the tiny
random model: form checks, the token strip, tables and step text, the shown loop code run as written gives
the engine's tokens, stepping, a changed form restarting, Reset, and the session state's release."""

import pytest
import torch

from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.inspect.inspector import MAX_INSPECT_STEPS, InspectSession
from kvlab.strategies import make_strategy
from kvlab.ui.shared.code import LOOP_VALUES, loop_snippet
from kvlab.ui.inspect.view import (
    InspectRejected,
    InspectRequest,
    InspectTabState,
    layer_table,
    loop_values,
    plan_inspect,
    release_state,
    step_markdown,
    strip_html,
    top_table,
)

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404, 405, 406, 407, 408]])


def records(tiny, spec, steps=6):
    session = InspectSession(tiny, make_strategy(spec), PROMPT, GenerationSettings(max_new_tokens=steps,
                                                                                     stop_at_eos=False))
    return session, list(session.steps(steps))


@pytest.mark.parametrize("change,message", [
    ({"prompt": "  "}, "the prompt is empty"),
    ({"max_new_tokens": 0}, f"from 1 to {MAX_INSPECT_STEPS}"),
    ({"max_new_tokens": MAX_INSPECT_STEPS + 1}, f"from 1 to {MAX_INSPECT_STEPS}"),
    ({"max_new_tokens": None}, "got None"),
    ({"strategy_name": "static", "knobs": ["", "true"]}, "turn compile off"),
    ({"strategy_name": "sink", "knobs": ["0"]}, "window_length must be an integer >= 1"),
    ({"strategy_name": "mystery"}, "unknown strategy 'mystery'"),
])
def test_bad_forms_say_what_to_fix(change, message):
    with pytest.raises(InspectRejected, match=message):
        plan_inspect(InspectRequest(**{"prompt": "Hi", **change}))


def test_a_good_form_plans_greedy_settings():
    plan = plan_inspect(InspectRequest(prompt="Hi", knobs=["32"], max_new_tokens=40.0))
    assert plan.strategy.describe() == "sink 4+28" and plan.settings.max_new_tokens == 40
    assert not plan.settings.do_sample and not plan.settings.stop_at_eos
    assert plan.key() == plan_inspect(InspectRequest(prompt="Hi", knobs=["32"], max_new_tokens=40)).key()
    assert plan.key() != plan_inspect(InspectRequest(prompt="Hi", knobs=["16"], max_new_tokens=40)).key()


def test_the_strip_shows_sinks_eviction_and_the_window(tiny):
    session, steps = records(tiny, {"strategy": "sink", "window_length": 8, "num_sink_tokens": 2})
    page = strip_html(steps[-1], ["t"] * 20)
    seen = steps[-1].seen_tokens
    assert page.count('class="kv-strip-row"') == 2  # two layers, no collapsing below MAX_LAYERS_SHOWN
    assert page.count("kv-tok kv-st-sink") == 2 * 2 + 1  # two sinks per layer, one in the legend
    assert page.count("kv-tok kv-st-evicted") == 2 * (seen - 8) + 1
    assert page.count("kv-tok kv-st-held") == 2 * 6 + 1
    assert "sink 2, evicted 7, held 6" in page and "positions 0–14" in page


def test_the_strip_groups_positions_on_long_runs_and_says_so(tiny):
    _, steps = records(tiny, {"strategy": "dynamic"}, steps=2)
    import kvlab.ui.inspect.view as view

    page = view.strip_html(steps[-1])
    assert page.count("kv-tok kv-st-held") == 2 * 11 + 1
    original = view.STRIP_MAX_CELLS
    view.STRIP_MAX_CELLS = 4
    try:
        grouped = view.strip_html(steps[-1])
    finally:
        view.STRIP_MAX_CELLS = original
    assert "one cell = 3 positions" in grouped and grouped.count("kv-tok kv-st-held") == 2 * 4 + 1
    assert strip_html(None) == '<div class="kv-strip-empty">no step yet</div>'


def test_tables_and_step_text(tiny):
    session, steps = records(tiny, {"strategy": "quantized", "backend": "hqq", "residual_length": 4})
    headers, rows = layer_table(steps[-1])
    row = dict(zip(headers, rows[0]))
    assert row["class"] == "HQQQuantizedLayer" and row["held / capacity"] == "15 / grows"
    assert row["device"] == "cpu" and row["packed"] != "–" and row["residual"] != "–"
    top_headers, top_rows = top_table(steps[-1])
    assert top_headers[-1] == "dynamic: p" and len(top_rows) == 5
    text = step_markdown(steps[-1], session)
    assert text.startswith("**Token 5** (step 6 of at most 6, decode;") and "`position_ids` [[14]]" in text
    assert "KL(dynamic ‖ quantized hqq int4 r4)" in text and "causal mask (1, 1, 1, 15)" in text
    assert set(loop_values(steps[-1])) == set(LOOP_VALUES)
    _, dynamic = records(tiny, {"strategy": "dynamic"}, steps=1)
    assert top_table(dynamic[0])[0] == ["#", "token", "p"]


@pytest.mark.parametrize("spec", [{"strategy": "dynamic"}, {"strategy": "sink", "window_length": 8},
                                  {"strategy": "quantized", "backend": "hqq", "residual_length": 4},
                                  {"strategy": "no_cache"}, {"strategy": "static"}])
def test_the_shown_loop_run_as_written_gives_the_engines_tokens(tiny, spec, capsys):
    strategy = make_strategy(spec)
    settings = GenerationSettings(max_new_tokens=12, stop_at_eos=False)
    code = loop_snippet(strategy, settings, "Tell me about the sea.", values={"position_ids": "[[3]]"})
    assert "position_ids = " in code and "# ← [[3]]" in code
    runnable = "\n".join(line for line in code.splitlines()
                         if not line.startswith(("model_id =", "tokenizer =", "model =")))
    scope = {"model": tiny.model, "tokenizer": tiny.tokenizer}
    exec(compile(runnable, "<loop snippet>", "exec"), scope)
    prompt = encode_prompt(tiny.tokenizer, "Tell me about the sea.")
    engine = Decoder(tiny, strategy, strategy.build_cache(tiny, prompt.shape[1] + 12), prompt, settings).run()
    assert scope["sequence"][0, prompt.shape[1]:].tolist() == engine.token_ids


def test_release_drops_the_run(tiny):
    session, _ = records(tiny, {"strategy": "dynamic"}, steps=1)
    state = InspectTabState(session=session, key=("k",))
    release_state(state)
    assert state.session is None and state.key is None
    release_state(None)


gr = pytest.importorskip("gradio")


@pytest.fixture
def tab(tiny_pool):
    from kvlab.ui.inspect.tab import InspectTab

    with gr.Blocks():
        return InspectTab(tiny_pool).build()


def data(tab, state=None, **fields):
    values = {tab.prompt: "Tell me about the sea.", tab.system: "", tab.chat: True, tab.max_new_tokens: 12,
              tab.ignore_eos: True, tab.model_source: "bundled", tab.card.strategy: "sink", tab.state: state}
    values.update({box: "" for box in tab.card.knobs})
    values[tab.card.knobs[0]] = "8"
    values.update({getattr(tab, name): value for name, value in fields.items()})
    return values


def last(tab, stream) -> dict:
    final = {}
    for updates in stream:
        assert set(updates) <= set(tab.outputs)
        final.update(updates)
    return final


class Request:
    session_hash = "browser-1"


def test_steps_run_on_one_session_and_a_changed_form_restarts(tab):
    first = last(tab, tab.on_step(data(tab), Request()))
    state = first[tab.state]
    assert len(state.session.records) == 1 and "**Token 0** (step 1 of at most" in first[tab.step_info]
    assert "kv-st-evicted" in first[tab.strip] and "prefill_in_chunks" in first[tab.code]
    again = last(tab, tab.on_step10(data(tab, state), Request()))
    assert again[tab.state] is state and len(state.session.records) == 11
    end = last(tab, tab.on_run(data(tab, state), Request()))
    assert state.session.finished and "run ended after 12 steps" in end[tab.status]
    assert "run ended" in last(tab, tab.on_step(data(tab, state), Request()))[tab.status]
    changed = last(tab, tab.on_step(data(tab, state, max_new_tokens=5), Request()))
    assert "the settings changed: started a new run" in changed[tab.status] and len(state.session.records) == 1
    assert tab.live["browser-1"] is state
    tab.unload(Request())  # the tab closed: its run and cache go at once
    assert state.session is None and "browser-1" not in tab.live


def test_bad_input_is_shown_and_reset_starts_over(tab):
    bad = last(tab, tab.on_step(data(tab, prompt=" "), Request()))
    assert "✖ the prompt is empty" in bad[tab.status] and bad[tab.state] is None
    fresh = tab.reset(data(tab))
    assert "new run:" in fresh[tab.status] and fresh[tab.state].session.records == []
    assert "no step yet" in fresh[tab.strip]
    tab.stop(fresh[tab.state])
    assert fresh[tab.state].stop.is_set()


@pytest.mark.parametrize("steps", [0, -3, MAX_INSPECT_STEPS + 1])
def test_the_inspect_command_names_its_steps_option_and_range(steps):
    from kvlab.cli import build_parser
    from kvlab.cli.common import fill_model_defaults
    from kvlab.cli.inspect import _session

    args = fill_model_defaults(build_parser().parse_args(["inspect", "--prompt", "Hi", "--steps", str(steps)]))
    with pytest.raises(ValueError, match=rf"--steps must be from 1 to {MAX_INSPECT_STEPS}, got {steps}"):
        _session(args)


def test_run_to_end_says_it_is_working_before_the_first_step(tab):
    stream = tab.on_run(data(tab), Request())
    first = next(stream)
    assert list(first) == [tab.status] and "working: up to" in first[tab.status]
    assert "ready" not in first[tab.status]
    last(tab, stream)


def test_a_loop_mistake_greys_the_card_says_so_and_the_status_stays_true_at_every_step(tab):
    from kvlab.ui.inspect.tab import CORRECT_LOOP

    greyed = tab.loop_card("loop:full_sequence")
    assert all(update["interactive"] is False for update in greyed[:-1]) and "not used" in greyed[-1]
    assert all(update["interactive"] is True for update in tab.loop_card(CORRECT_LOOP)[:-1])
    state = last(tab, tab.on_step(data(tab), Request()))[tab.state]  # sink, kvlab's loop
    mistake = last(tab, tab.on_step10(data(tab, state, loop="loop:full_sequence"), Request()))
    status = mistake[tab.status]
    assert "the settings changed: started a new run" in status and "runs on a dynamic cache" in status
    assert "10 of 12 steps taken" in status  # the note sits beside the steps taken, not instead of them
    assert "sink" not in state.session.strategy.describe()
