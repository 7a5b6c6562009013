"""gradio's native-plot redraw protocol (kvlab.ui.shared.redraw): each situation's frames, their flags, their
order and the waits between them."""

import time

import pytest

from kvlab.ui.shared.redraw import FRAME_GAP_S, Redraw


@pytest.fixture
def log(monkeypatch):
    """What happened, in order: ("draw", primer, blank) per frame drawn, ("sleep", seconds) per wait."""
    events = []
    monkeypatch.setattr(time, "sleep", lambda seconds: events.append(("sleep", seconds)))
    return events


def recording(log):
    def draw(primer=False, blank=False):
        log.append(("draw", primer, blank))
        return {"plot": ("lower" if primer else "upper", "no point" if blank else "points")}
    return Redraw(draw)


def test_replay_sends_a_blank_primer_a_blank_frame_the_rows_and_the_rows_as_a_primer_a_gap_apart(log):
    frames = list(recording(log).replay({"status": "2 rows"}))
    assert log == [("draw", True, True), ("sleep", FRAME_GAP_S), ("draw", False, True), ("sleep", FRAME_GAP_S),
                   ("draw", False, False), ("sleep", FRAME_GAP_S), ("draw", True, False)]
    assert frames == [{"status": "2 rows", "plot": ("lower", "no point")}, {"plot": ("upper", "no point")},
                      {"plot": ("upper", "points")}, {"plot": ("lower", "points")}]


def test_switch_sends_the_rows_then_the_rows_as_a_primer_a_gap_apart(log):
    assert list(recording(log).switch()) == [{"plot": ("upper", "points")}, {"plot": ("lower", "points")}]
    assert log == [("draw", False, False), ("sleep", FRAME_GAP_S), ("draw", True, False)]


def test_a_live_run_primes_until_its_first_point_and_ends_with_its_last_frame_twice_back_to_back(log):
    redraw = recording(log)
    assert redraw.live(points=False) == {"plot": ("lower", "points")}
    assert list(redraw.ahead(points=False)) == [{"plot": ("upper", "points")}]
    assert list(redraw.ahead(points=True)) == []
    assert redraw.live(points=True) == {"plot": ("upper", "points")}
    assert list(redraw.finish({"download": ["run.json"]})) == [{"download": ["run.json"], "plot": ("upper", "points")},
                                                              {"plot": ("lower", "points")}]
    assert ("sleep", FRAME_GAP_S) not in log and not [e for e in log if e[0] == "draw" and e[2]]


def test_a_live_draw_need_not_take_blank_and_first_updates_give_way_to_the_frame(log):
    redraw = Redraw(lambda primer=False: {"plot": primer, "status": "drawn"})
    assert redraw.live(points=False) == {"plot": True, "status": "drawn"}
    assert list(redraw.switch()) == [{"plot": False, "status": "drawn"}, {"plot": True, "status": "drawn"}]
    assert list(redraw.frames([{}], {"status": "old", "table": 1})) == [{"status": "drawn", "table": 1, "plot": False}]
    assert log == [("sleep", FRAME_GAP_S)]
    assert len(list(redraw.frames([{}, {}], gap_s=0))) == 2 and log == [("sleep", FRAME_GAP_S)]  # no wait at 0
