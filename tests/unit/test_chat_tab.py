"""ChatTab's handlers, called as the page calls them, on a tiny random model (no browser).

The tab is built inside an in-process `gr.Blocks` around a pool that serves the
tiny model; every handler returns or yields `{component: update}` dicts, which
are checked against the components the event declares as its outputs.
"""

from html import unescape

import pytest

gr = pytest.importorskip("gradio")

from kvlab.ui.chat.tab import ChatTab  # noqa: E402
from kvlab.ui.chat.view import ChatForm  # noqa: E402

NEW_TOKENS = 4



@pytest.fixture
def tab(tiny_pool):
    with gr.Blocks():
        return ChatTab(tiny_pool).build()


def form(name="dynamic", *knobs, **fields) -> ChatForm:
    fields.setdefault("max_new_tokens", NEW_TOKENS)
    fields.setdefault("measure", False)
    return ChatForm(strategy_name=name, knobs=list(knobs), **fields)


def last(tab, updates_stream) -> dict:
    """Every update of a streamed turn merged, checking each targets one of the turn's outputs."""
    final = {}
    for updates in updates_stream:
        assert set(updates) <= set(tab.turn_outputs), "a turn updated a component that is not its output"
        final.update(updates)
    return final


def test_two_turns_keep_one_cache_and_say_what_was_reused(tab):
    first = last(tab, tab.send("Hi there", None, form()))
    state = first[tab.state]
    assert [m["role"] for m in first[tab.chatbot]] == ["user", "assistant"]
    assert "Turn 1" in first[tab.turn_info] and first[tab.message] == ""
    second = last(tab, tab.send("And again?", state, form(measure=True)))
    assert "Turn 2" in second[tab.turn_info]
    assert "reused** from the cache" in second[tab.turn_info]
    assert state.session.turns[-1].reused_tokens > 0
    assert list(second[tab.turn_table]["turn"]) == [1, 2]
    assert list(second[tab.ttft_plot]["value"].drop_duplicates("turn")["turn"]) == ["1", "2"]
    assert set(second[tab.tokens_plot]["value"]["series"]) == {"reused", "prefilled"}
    assert list(second[tab.tokens_plot]["color_map"]) == ["reused", "prefilled"]  # the series it shows


def test_an_empty_message_is_refused(tab):
    updates = last(tab, tab.send("   ", None, form()))
    assert "the message is empty" in updates[tab.notice] and updates[tab.message] == ""


def test_a_static_cache_too_small_offers_a_way_on(tab):
    refused = last(tab, tab.send("What is the capital of France?", None, form("static", "16")))
    notice = unescape(refused[tab.notice])
    assert "max_cache_len=16" in notice and "switch to the dynamic strategy" in notice
    assert refused[tab.capacity_row]["visible"] is True
    assert refused[tab.message] == "What is the capital of France?"
    state = refused[tab.state]
    grown = tab.grow(state)
    size = int(grown[tab.card.knobs[0]])
    assert size > 16 and "will be rebuilt" in grown[tab.notice]
    done = last(tab, tab.send("What is the capital of France?", state, form("static", str(size))))
    assert "Turn 1" in done[tab.turn_info] and "static" in done[tab.turn_info]


def test_switch_to_dynamic_updates_the_session_and_the_card(tab):
    state = last(tab, tab.send("Hi", None, form("static", "512")))[tab.state]
    updates = tab.to_dynamic(state)
    assert state.session.strategy.name == "dynamic"
    assert updates[tab.card.strategy] == "dynamic"
    assert [updates[box]["visible"] for box in tab.card.knobs].count(True) == 1  # layer_types


def test_undo_clear_and_regenerate(tab):
    assert tab.undo(None)[tab.notice] == "nothing to undo"
    refused = last(tab, tab.regenerate(None, form()))
    assert "there is no reply to regenerate yet" in refused[tab.notice]
    state = last(tab, tab.send("Hi", None, form()))[tab.state]
    regenerated = last(tab, tab.regenerate(state, form()))
    assert [m["role"] for m in regenerated[tab.chatbot]] == ["user", "assistant"]
    assert "removed the last turn" in tab.undo(state)[tab.notice] and state.session.history == []
    last(tab, tab.send("Hi", state, form()))
    cleared = tab.clear(state)
    assert cleared[tab.chatbot] == [] and cleared[tab.turn_info] == ""


def test_a_strategy_the_model_cannot_run_is_explained(tab):
    refused = last(tab, tab.send("Hi", None, form("sliding_window")))
    notice = unescape(refused[tab.notice])
    assert "cannot run here" in notice and "no sliding-window layers" in notice
    about = tab.pick_strategy("sliding_window", "bundled")[tab.card.about]["value"]
    assert "unavailable here" in about


def test_picking_a_strategy_generates_its_knob_fields(tab):
    updates = tab.pick_strategy("quantized", "bundled")
    shown = [(updates[box]["label"], updates[box]["value"]) for box in tab.card.knobs if updates[box]["visible"]]
    assert shown[:3] == [("backend", "quanto"), ("nbits", ""), ("residual_length", "128")]
    static = tab.pick_strategy("static", "bundled")
    assert static[tab.card.knobs[0]]["value"] == "512"  # the chat's pre-filled static size


def test_the_prefix_panel_refuses_by_capability_and_reports_a_run(tab):
    refused = tab.run_prefix(form("sink", "32", "4"), "A shared document.", "First?\nSecond?")
    assert "evicts tokens" in refused[tab.prefix_info] and refused[tab.prefix_table] is None
    report = tab.run_prefix(form(max_new_tokens=2), "A shared document about tea.", "First?\nSecond?")
    assert "prefilled once" in report[tab.prefix_info] and "2 prompts" in report[tab.prefix_info]
    assert list(report[tab.prefix_table]["prompt"]) == ["First?", "Second?"]


# --- every control works while a reply streams (fault catalogue #13.7) -------------------------------------


def stream_in_background(updates_stream):
    """Drain a streamed turn in a thread (as gradio does); returns (thread, updates so far, first token event)."""
    import threading

    seen, started = [], threading.Event()

    def drain():
        for updates in updates_stream:
            seen.append(updates)
            if len(seen) >= 2:
                started.set()
        started.set()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    assert started.wait(60), "the reply never started streaming"
    return thread, seen


def long_form():
    return form(max_new_tokens=400, measure=True)


def test_clear_while_a_reply_streams_stops_it_then_clears(tab):
    first = last(tab, tab.send("Hello", None, form()))
    state = first[tab.state]
    thread, _ = stream_in_background(tab.send("Tell me a very long story", state, long_form()))
    updates = tab.clear(state)
    thread.join(60)
    assert not thread.is_alive()
    assert "stopped the reply that was running, then cleared" in updates[tab.notice]
    assert updates[tab.chatbot] == [] and state.session.history == [] and state.session.cache is None
    after = last(tab, tab.send("Fresh start", state, form()))
    assert [m["role"] for m in after[tab.chatbot]] == ["user", "assistant"]
    assert state.session.turns[-1].action == "fresh"


def test_regenerate_while_streaming_regenerates_that_reply_and_keeps_the_message(tab):
    state = last(tab, tab.send("Hello", None, form()))[tab.state]
    thread, _ = stream_in_background(tab.send("Tell me a very long story", state, long_form()))
    final = last(tab, tab.regenerate(state, form()))
    thread.join(60)
    users = [m["content"] for m in final[tab.chatbot] if m["role"] == "user"]
    assert users == ["Hello", "Tell me a very long story"]
    assert "stopped the reply that was running first" in final[tab.notice]
    assert len(state.session.history) == 4 and state.session.turns[-1].generated_tokens <= NEW_TOKENS


def test_send_while_streaming_sends_after_stopping_and_never_wipes_typed_text(tab):
    state = last(tab, tab.send("Hello", None, form()))[tab.state]
    thread, seen = stream_in_background(tab.send("Tell me a very long story", state, long_form()))
    final = last(tab, tab.send("Stop, and answer this instead", state, form()))
    thread.join(60)
    assert all(tab.message not in updates for updates in seen[1:]), "the message box was updated mid-reply"
    users = [m["content"] for m in final[tab.chatbot] if m["role"] == "user"]
    assert users[-1] == "Stop, and answer this instead" and len(users) == 3
    assert "stopped the reply that was running first" in final[tab.notice]


def test_undo_while_streaming_removes_the_turn_in_progress(tab):
    state = last(tab, tab.send("Hello", None, form()))[tab.state]
    thread, _ = stream_in_background(tab.send("Tell me a very long story", state, long_form()))
    updates = tab.undo(state)
    thread.join(60)
    assert "stopped the reply that was running, then removed the last turn" in updates[tab.notice]
    assert [m["content"] for m in state.session.history if m["role"] == "user"] == ["Hello"]


def test_closing_the_tab_frees_its_conversation_and_cache(tab):
    state = last(tab, tab.send("Hello", None, form(), key="session-a"))[tab.state]
    assert state.session.cache is not None and tab.sessions.live_caches() == 1
    assert tab.sessions.release("session-a")
    assert state.session.cache is None and state.session.history == [] and tab.sessions.live_caches() == 0
