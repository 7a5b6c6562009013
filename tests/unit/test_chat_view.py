"""The chat tab's pure part (kvlab.ui.chat.view): fake `kvlab.chat.session` events and stats turned into messages,
Markdown, tables and plots; the chat form's strategy card and the prefix panel's refusal. No model, no gradio."""

import pytest

from kvlab.chat.session import ChatStatus, ChatToken, ChatTurnDone, ChatTurnFailed, TurnStats
from kvlab.chat.prefix import PrefixReport, PromptResult
from kvlab.strategies import StrategyError, make_strategy
from kvlab.strategies.base import names_with
from kvlab.ui.chat import view as chat_tab
from kvlab.ui.shared.plot_frames import turns_tokens_frame, turns_ttft_frame
from kvlab.ui.shared.knobs import card_form, max_knobs


def stats(turn=2, **changes) -> TurnStats:
    base = dict(turn=turn, strategy="dynamic", action="reuse", note="only the new tail was prefilled",
                input_tokens=60, reused_tokens=44, prefilled_tokens=16, cropped_tokens=0, generated_tokens=8,
                ttft_s=0.2, decode_tok_s=12.5, cache_tokens=67, cache_bytes=3_087_360, stop_reason="eos",
                reply="Berlin.", reply_ids=[1, 2], user="And Germany?", no_reuse_ttft_s=0.7, saved_s=0.5)
    base.update(changes)
    return TurnStats(**base)


def test_events_fill_the_reply_bubble_then_the_stats():
    view = chat_tab.start_view([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                               "And Germany?")
    assert [m["role"] for m in view.messages] == ["user", "assistant", "user", "assistant"]
    for event in (ChatToken(5, "Ber"), ChatToken(6, "lin"), ChatStatus("measuring without reuse")):
        chat_tab.apply_event(view, event)
    assert view.messages[-1]["content"] == "Berlin" and view.status == "measuring without reuse"
    final = stats()
    chat_tab.apply_event(view, ChatTurnDone(final))
    assert view.stats is final and view.messages[-1]["content"] == "Berlin." and view.status == ""


def test_a_failed_turn_is_reported():
    view = chat_tab.apply_event(chat_tab.start_view([], "Hi"), ChatTurnFailed("RuntimeError: boom"))
    assert view.failed == "RuntimeError: boom"


def test_regenerate_view_adds_only_a_reply_bubble():
    view = chat_tab.start_view([{"role": "user", "content": "Hi"}], None)
    assert [m["role"] for m in view.messages] == ["user", "assistant"]


def test_turn_markdown_shows_reuse_ttft_bytes_and_saving():
    text = chat_tab.turn_markdown(stats(match=True))
    for part in ("Turn 2", "44 reused", "16 newly prefilled", "0.200 s", "12.5 tok/s", "3,087,360 bytes",
                 "0.700 s", "saved **0.500 s**", "identical"):
        assert part in text
    assert chat_tab.turn_markdown(None) == ""
    fresh = chat_tab.turn_markdown(stats(turn=1, action="fresh", reused_tokens=0, prefilled_tokens=60))
    assert "noise" in fresh
    lossy = chat_tab.turn_markdown(stats(match=False, lossy=True))
    assert "different (lossy cache)" in lossy


def test_a_reused_turn_whose_saving_noise_made_negative_reads_within_noise_not_a_loss():
    noisy = stats(ttft_s=2.743, no_reuse_ttft_s=0.7, saved_s=-2.043)
    text = chat_tab.turn_markdown(noisy)
    assert "within noise" in text and "2.043 s slower" in text and "saved **-" not in text
    frame = chat_tab.turns_frame([stats(), noisy])
    assert list(frame["saved_s"]) == [0.5, "within noise (-2.043)"]
    fresh = stats(turn=1, action="fresh", reused_tokens=0, prefilled_tokens=60, saved_s=-0.01)
    assert "reused nothing" in chat_tab.turn_markdown(fresh)  # same work both ways: plainly noise, as before


def test_table_and_plot_have_one_entry_per_turn():
    turns = [stats(turn=1, action="fresh", reused_tokens=0, prefilled_tokens=37), stats(turn=2)]
    frame = chat_tab.turns_frame(turns)
    assert list(frame["reused"]) == [0, 44] and list(frame["prefilled"]) == [37, 16]
    assert {"ttft_s", "no_reuse_ttft_s", "saved_s", "decode_tok_s", "cache_bytes"} <= set(frame.columns)
    times, tokens = turns_ttft_frame(turns), turns_tokens_frame(turns)
    assert len(times) == 4 and len(tokens) == 4  # with/without reuse and reused/prefilled, per turn
    assert set(times["series"]) == {"with reuse", "without reuse"} and list(times["turn"][:2]) == ["1", "2"]
    assert list(tokens[tokens["series"] == "reused"]["tokens"]) == [0, 44]
    assert all(value.endswith(" s") for value in times["value"])
    assert all(value.endswith(" tokens") for value in tokens["value"])
    assert turns_ttft_frame([]).empty and turns_tokens_frame([]).empty and chat_tab.turns_frame([]).empty


def test_prefix_report_rendering():
    result = PromptResult(prompt="When?", input_tokens=220, reused_tokens=199, prefilled_tokens=21, reply="At 5 pm.",
                          reply_ids=[1], with_reuse_s=0.3, copy_s=0.01, without_reuse_s=1.3, saved_s=1.0,
                          no_reuse_reply="At 5 pm.", match=True)
    report = PrefixReport("dynamic", False, 199, 1.1, 199, 9_169_920, [result, result])
    text = chat_tab.prefix_markdown(report)
    assert "199 tokens" in text and "2/2" in text and "9,169,920 bytes" in text
    assert f"{report.total_saved_s:.3f} s" in text
    frame = chat_tab.prefix_frame(report)
    assert list(frame["saved_s"]) == [1.0, 1.0] and list(frame["match"]) == [True, True]


def form(name, *knobs, **fields) -> "chat_tab.ChatForm":
    return chat_tab.ChatForm(strategy_name=name, knobs=list(knobs), **fields)


def test_form_fields_make_the_chosen_strategy_with_its_own_knobs_only():
    assert form("static", "256").strategy().max_cache_len == 256
    quantized = form("quantized", "hqq", "2", "16").strategy()
    assert (quantized.backend, quantized.nbits, quantized.residual_length) == ("hqq", 2, 16)
    assert form("dynamic").strategy().name == "dynamic"
    with pytest.raises(StrategyError, match="nbits"):
        form("quantized", "quanto", "3").strategy()
    with pytest.raises(StrategyError, match="unknown strategy"):
        form("bogus").strategy()
    with pytest.raises(StrategyError, match="unknown strategy 'no_cache'"):
        form("no_cache").strategy()  # keeps no cache: not offered in chat
    assert form("dynamic", max_new_tokens=12.0).settings().max_new_tokens == 12


def test_the_card_shows_each_strategys_own_knobs_generated_from_its_dataclass():
    count = max_knobs(chat_tab.chat_strategy_choices())
    static = card_form("static", chat_tab.prefilled_knobs("static"), None, count)["knobs"]
    assert [(f["label"], f["value"]) for f in static if f["visible"]] == [("max_cache_len", "512"),
                                                                         ("compile", "false")]
    sink = card_form("sink", chat_tab.prefilled_knobs("sink"), None, count)["knobs"]
    assert [(f["label"], f["value"]) for f in sink if f["visible"]] == [("window_length", "256"),
                                                                       ("num_sink_tokens", "4")]
    dynamic = card_form("dynamic", {}, None, count)["knobs"]
    assert [(f["label"], f["value"]) for f in dynamic if f["visible"]] == [("layer_types", "model")]


def test_chat_choices_come_from_the_usable_in_chat_capability():
    choices = chat_tab.chat_strategy_choices()
    assert choices == names_with("usable_in_chat")
    assert choices[:2] == ["dynamic", "static"] and {"quantized", "sink"} <= set(choices)
    assert "no_cache" not in choices


def test_prefix_refuses_by_capability_with_the_reason():
    assert chat_tab.prefix_refusal(make_strategy({"strategy": "dynamic"})) is None
    assert chat_tab.prefix_refusal(make_strategy({"strategy": "quantized"})) is None
    refusal = chat_tab.prefix_refusal(make_strategy({"strategy": "sink"}))
    assert "evicts tokens" in refusal and "would not hold the whole prefix" in refusal
    assert "dynamic" in refusal.split("pick one of")[1] and "sink" not in refusal.split("pick one of")[1]
    assert "keeps no cache" in chat_tab.prefix_refusal(make_strategy({"strategy": "no_cache"}))
    assert chat_tab.prompt_lines(" a \n\n b\n") == ["a", "b"]
