"""The Report tab: its view model on fake report events, the table and plot frames (every column from the first
frame, the Pareto front), saved records merged, bad input as one status line, and the tab's stream on the tiny
model (figures fill in, Stop keeps what was scored, the exported record replays)."""

import json
import threading
from html import unescape
from pathlib import Path

import gradio as gr
import pytest

from kvlab.protocol import ColumnFailed, RunDone, RunStarted
from kvlab.quality.record import FIGURE_FIELDS
from kvlab.quality.report import ReportProgress, Split
from kvlab.ui.report.tab import ReportTab
from kvlab.ui.report.view import (PASTED, PLOT_FIELDS, ReportRequest, ReportView, plan_report, plot_caption,
                                  plot_frame, replay_status, rows_from_files, table_frame)

MIB = 1 << 20


def figures(scored, kl, mib, ppl_diff=0.1):
    row = dict.fromkeys(FIGURE_FIELDS)
    row.update(scored_tokens=scored, ppl_ratio=1.01, ppl_ratio_unc=0.01, ppl_diff=ppl_diff, ppl_diff_unc=0.05,
               kld_mean=kl, kld_p99=kl * 5, kld_max=kl * 9, same_top=0.9, same_top_low=0.8, same_top_high=0.95,
               cache_bytes_mean=mib * MIB, cache_bytes_end=mib * MIB, bytes_vs_dense=mib / 4, decode_tok_s=20.0)
    return row


def record(columns, stopped=False, model="m"):
    return {"kind": "kvlab.report", "version": 1, "model": {"name": model}, "split": {"context_tokens": 32,
            "scored_tokens": 8}, "columns": [{"name": name, "status": status, "message": message,
                                              "split": {"context_tokens": 32, "scored_tokens": scored},
                                              "figures": figs} for name, status, message, scored, figs in columns],
            "stopped": stopped, "wall_s": 1.5}


def started_view():
    view = ReportView("m")
    view.apply(RunStarted(("sink 4+60", "quanto", "nope"), Split(32, 8)))
    return view


def test_every_column_is_a_row_and_a_plot_series_from_the_first_frame():
    view = started_view()
    assert [row["column"] for row in view.rows()] == ["sink 4+60", "quanto", "nope"]
    frame = plot_frame(view.rows(), "kld_mean", view.roster())
    assert list(frame.columns) == list(PLOT_FIELDS) and list(frame["series"]) == view.roster()
    assert frame["y"].isna().all() and not view.has_points()
    assert list(table_frame(view.rows())["status"]) == ["waiting"] * 3
    assert "0 of 8 tokens scored" in view.status_text()


def test_figures_fill_in_by_rounds_and_a_column_error_keeps_its_own_row():
    view = started_view()
    view.apply(ColumnFailed(2, "nope", "error", "unknown strategy 'nope'"))
    view.apply(ReportProgress("sink 4+60", 4, figures(4, 0.08, 1.0), MIB))
    assert not view.round_complete()  # quanto has not reported this round yet
    view.apply(ReportProgress("quanto", 4, figures(4, 0.02, 2.0), 2 * MIB))
    assert view.round_complete() and view.has_points()
    table = table_frame(view.rows())
    assert list(table["scored"]) == ["4", "4", "-"] and list(table["status"]) == ["scoring", "scoring", "error"]
    assert table["note"][2] == "unknown strategy 'nope'" and table["mean KL"][0] == "0.08000"
    assert table["top-1 [95% CI]"][1] == "0.900 [0.800, 0.950]"
    assert list(table["front"]) == ["★", "★", ""]  # fewer bytes vs lower KL: both on the front
    frame = plot_frame(view.rows(), "kld_mean", view.roster())
    assert list(frame["series"]) == ["sink 4+60", "quanto", "nope"] and frame["y"].tolist()[:2] == [0.08, 0.02]
    assert frame["cache_MiB"].tolist()[:2] == [1.0, 2.0] and list(frame["front"][:2]) == ["yes", "yes"]
    assert "1 column(s) could not run" in view.status_text() and "4 of 8 tokens" in view.status_text()


def test_a_stopped_run_ends_as_its_record_with_what_was_scored():
    view = started_view()
    view.apply(ReportProgress("sink 4+60", 4, figures(4, 0.08, 1.0), MIB))
    saved = record([("sink 4+60", "stopped", "", 5, figures(5, 0.07, 1.0)),
                    ("quanto", "stopped", "", 4, figures(4, 0.03, 0.5)), ("nope", "error", "bad", 0, None)], True)
    view.apply(RunDone(saved, 2.0, stopped=True))
    table = table_frame(view.rows())
    assert list(table["status"]) == ["stopped", "stopped", "error"] and list(table["scored"]) == ["5", "4", "-"]
    assert list(table["front"]) == ["", "★", ""]  # quanto: fewer bytes and lower KL
    assert "stopped after 4–5 of 8 tokens" in view.status_text()  # a Stop inside a round: the columns differ by one
    with pytest.raises(TypeError):
        view.apply("not an event")


def test_the_delta_ppl_plot_takes_its_front_on_the_distance_from_dense():
    rows = ReportView("m")
    rows.apply(RunDone(record([("a", "ok", "", 8, figures(8, 0.1, 1.0, ppl_diff=-0.5)),
                                  ("b", "ok", "", 8, figures(8, 0.2, 2.0, ppl_diff=0.2))]), 1.0))
    assert list(plot_frame(rows.rows(), "ppl_diff")["front"]) == ["yes", "yes"]
    assert list(plot_frame(rows.rows(), "kld_mean")["front"]) == ["yes", "no"]
    assert "front" in plot_caption(rows.rows(), "kld_mean") and ": `a`." in plot_caption(rows.rows(), "kld_mean")


def test_saved_records_merge_and_an_unreadable_one_is_one_line(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(record([("sink 4+60", "ok", "", 8, figures(8, 0.05, 1.0))])))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(record([("quanto", "ok", "", 8, figures(8, 0.01, 2.0))], model="n")))
    needle = tmp_path / "needle.json"
    needle.write_text(json.dumps({"kind": "kvlab.needle", "version": 1, "model": {"name": "m"}, "cells": [],
                                  "columns": [{"name": "sink 4+60"}],
                                  "summary": [{"strategy": "sink 4+60", "hits": 4, "scored": 5}]}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    stranger = tmp_path / "stranger.json"
    stranger.write_text(json.dumps({"kind": "something else"}))
    rows, problems = rows_from_files([report, other, needle, broken, stranger])
    assert [(row["model"], row["column"]) for row in rows] == [("m", "sink 4+60"), ("n", "quanto")]
    assert rows[0]["needle_hits"] == 4 and len(problems) == 2
    assert problems[0].startswith("cannot read record broken.json: ")
    assert problems[1].startswith("cannot read record stranger.json: not a report, Compare or Needle record")
    assert not any(str(tmp_path) in problem for problem in problems), "a server path reached the page"
    table = table_frame(rows)
    assert list(table["model"]) == ["m", "n"] and table["needle [95% CI]"][0].startswith("4/5")
    assert list(plot_frame(rows)["series"]) == ["m · sink 4+60", "n · quanto"]
    status = unescape(replay_status(rows, 3, problems))
    assert status.startswith("2 row(s) from 3 saved record(s) · models: m, n  \n⚠️ cannot read record broken.json")
    assert replay_status(rows[:1], 1, []) == "1 row(s) from 1 saved record(s) · model: m"


def test_bad_input_is_one_clear_error_before_any_compute(tiny):
    with pytest.raises(ValueError, match="more than the text's"):
        plan_report(ReportRequest(text_choice=PASTED, pasted="a short text", context_tokens=16, scored_tokens=8),
                    tiny)
    with pytest.raises(ValueError, match="the text is empty"):
        plan_report(ReportRequest(text_choice=PASTED, pasted="  "), tiny)
    with pytest.raises(ValueError, match="pick at least one column"):
        plan_report(ReportRequest(columns=" ", context_tokens=16, scored_tokens=8), tiny)
    with pytest.raises(ValueError, match="scored tokens must be a whole number"):
        plan_report(ReportRequest(scored_tokens=2.5), tiny)
    plan = plan_report(ReportRequest(context_tokens=16, scored_tokens=8), tiny)
    assert plan.input_ids.shape == (1, 24) and plan.split == Split(16, 8) and plan.progress_every == 4


@pytest.fixture
def tab(tiny_pool):
    with gr.Blocks():
        return ReportTab(tiny_pool).build()


def plot_values(tab, updates):
    return [u[tab.plot]["value"] for u in updates if tab.plot in u and u[tab.plot].get("value") is not None]


def test_the_tab_streams_figures_every_column_plotted_from_the_first_frame_and_the_record_replays(tab):
    session = {}
    request = ReportRequest(columns="static, sink:window_length=8:num_sink_tokens=2, nope", context_tokens=16,
                            scored_tokens=8)
    updates = list(tab.stream(request, threading.Event(), session))
    frames = plot_values(tab, updates)
    assert all(list(frame["series"]) == ["static", "sink 2+6", "nope"] for frame in frames)
    assert frames[0]["y"].isna().all() and frames[-1]["y"].notna().sum() == 2
    scored = [list(u[tab.table]["scored"]) for u in updates if tab.table in u]
    assert ["4", "4", "-"] in scored and scored[-1] == ["8", "8", "-"]
    final = updates[-2]
    assert "done in" in final[tab.status] and "1 column(s) could not run" in final[tab.status]
    assert "unknown strategy" in final[tab.table]["note"][2]
    saved, csv = final[tab.download]
    assert saved.endswith("report.json") and csv.endswith("report.csv")
    assert "kld_mean" in Path(csv).read_text().splitlines()[0]
    assert [row["column"] for row in session["rows"]] == ["static", "sink 2+6", "nope"]
    switched = list(tab.switch_y(session, "ΔPPL"))  # the radio: the same points against ΔPPL, spec rebuilt
    kept = final[tab.table]
    assert [round(v, 4) for v in switched[1][tab.plot]["value"]["y"][:2]] == [float(v.split(" ± ")[0])
                                                                                for v in kept["ΔPPL"][:2]]
    colors = [u[tab.plot]["color_map"] for u in switched]
    assert [c.lower() for c in colors[0].values()] == list(colors[1].values()) != list(colors[0].values())
    assert "|ΔPPL|" in switched[1][tab.front]
    replayed = list(tab.replay({}, [saved], "ΔPPL"))
    assert replayed[0][tab.table].equals(final[tab.table])
    assert plot_values(tab, replayed)[-1]["y"].notna().sum() == 2


def test_stop_keeps_what_was_scored_and_bad_input_leaves_the_page_as_it_was(tab):
    stop = threading.Event()
    updates = []
    for update in tab.stream(ReportRequest(columns="static", context_tokens=16, scored_tokens=64), stop, {}):
        updates.append(update)
        if tab.table in update and update[tab.table]["scored"][0] != "-":
            stop.set()
    final = updates[-2]
    assert "stopped after" in final[tab.status] and final[tab.table]["status"][0] == "stopped"
    assert 4 <= int(final[tab.table]["scored"][0]) < 64 and final[tab.download]
    bad = list(tab.stream(ReportRequest(columns="", context_tokens=16, scored_tokens=8), threading.Event(), {}))
    assert list(bad[-1]) == [tab.status]
    assert unescape(bad[-1][tab.status]) == "⚠️ pick at least one column, e.g. quantized:backend=quanto:nbits=4"
    broken = Path(final[tab.download][0]).with_name("broken.json")
    broken.write_text("{")
    replayed = list(tab.replay({}, [broken], "mean KL"))
    assert [list(update) for update in replayed] == [[tab.status]]
    assert unescape(replayed[0][tab.status]) == ("⚠️ cannot read record broken.json: not a JSON file, so not a kvlab "
                                                 "record (Expecting property name enclosed in double quotes at line "
                                                 "1 column 2)")
    nothing = list(tab.replay({}, [], "mean KL"))
    assert nothing == [{tab.status: "⚠️ no rows: pick report, Compare or Needle records"}]
