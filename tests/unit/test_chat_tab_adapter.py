"""The chat tab's adapter: fake `kvlab.chat` events and stats turned into messages, Markdown, tables, plots."""

import pytest

from kvlab.chat import ChatStatus, ChatToken, ChatTurnDone, ChatTurnFailed, TurnStats
from kvlab.prefix import PrefixReport, PromptResult
from kvlab.strategies import StrategyError

chat_tab = pytest.importorskip("kvlab_ui.chat_tab")


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


def test_table_and_plot_have_one_entry_per_turn():
    turns = [stats(turn=1, action="fresh", reused_tokens=0, prefilled_tokens=37), stats(turn=2)]
    frame = chat_tab.turns_frame(turns)
    assert list(frame["reused"]) == [0, 44] and list(frame["prefilled"]) == [37, 16]
    assert {"ttft_s", "no_reuse_ttft_s", "saved_s", "decode_tok_s", "cache_bytes"} <= set(frame.columns)
    figure = chat_tab.turns_figure(turns)
    times, tokens = figure.axes
    assert len(times.patches) == 4 and len(tokens.patches) == 4
    assert chat_tab.turns_figure([]) is None and chat_tab.turns_frame([]).empty


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


def test_form_fields_make_the_chosen_strategy_with_its_own_knobs_only():
    make = chat_tab.strategy_from_fields
    assert make("static", 256.0, "quanto", 4, 128, 256, 4).max_cache_len == 256
    quantized = make("quantized", 256, "hqq", 2.0, 16, 256, 4)
    assert (quantized.backend, quantized.nbits, quantized.residual_length) == ("hqq", 2, 16)
    assert make("dynamic", 256, "quanto", 4, 128, 256, 4).name == "dynamic"
    with pytest.raises(StrategyError, match="nbits"):
        make("quantized", 256, "quanto", 3, 128, 256, 4)
    with pytest.raises(StrategyError, match="unknown strategy"):
        make("bogus", None, None, None, None, None, None)
    assert chat_tab.knob_visibility("static") == (True, False, False)
    assert chat_tab.chat_strategy_choices()[:3] == ["dynamic", "static", "quantized"]
