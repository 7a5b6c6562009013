"""The quality report's one scoring loop on the tiny model: dense against itself is exactly 0, static against
dynamic within 1e-6, the split, events, stop, refused and failing columns, records, tables and merging."""

import json
import math
import threading

import pytest
import torch

from kvlab.protocol import ColumnFailed, RunDone, RunStarted
from kvlab.quality.record import merge_rows, rows_from_record
from kvlab.quality.report import ReportProgress, check_split, report_columns, run_report
from kvlab.quality.table import format_markdown, format_table, pareto_marks, rows_to_csv
from kvlab.strategies.dynamic import Dynamic


def _ids(n=40, seed=0):
    return torch.randint(3, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def _done(events):
    events = list(events)
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunDone)
    return events, events[-1].record


def _figures(record, name):
    return next(c for c in record["columns"] if c["name"] == name)["figures"]


def test_dense_against_itself_is_exactly_zero_and_static_within_1e_6(tiny):
    events, record = _done(run_report(tiny, _ids(), "dynamic,static", scored_tokens=24, progress_every=8,
                                      warm_up=False))
    dense, static = _figures(record, "dynamic"), _figures(record, "static")
    assert dense["ppl_diff"] == 0.0 and dense["kld_mean"] == 0.0 and dense["kld_max"] == 0.0
    assert dense["ppl_ratio"] == 1.0 and dense["same_top"] == 1.0 and dense["ppl_diff_unc"] == 0.0
    # the random model's PPL is near its vocabulary (1,000), so ΔPPL is judged relative to it
    assert abs(static["ln_ppl_ratio"]) <= 1e-6 and abs(static["ppl_diff"]) <= 1e-6 * static["ppl_base"]
    assert static["kld_max"] <= 1e-6 and static["same_top"] == 1.0 and static["kld_mean"] > 0
    assert dense["bytes_vs_dense"] == 1.0 and dense["cache_bytes_end"] > 0 and dense["decode_tok_s"] > 0
    assert record["split"] == {"context_tokens": 16, "scored_tokens": 24}
    progress = [e for e in events if isinstance(e, ReportProgress)]
    assert [(e.column, e.scored) for e in progress[:2]] == [("dynamic", 8), ("static", 8)]
    assert [e.scored for e in progress if e.column == "dynamic"] == [8, 16, 24]


def test_lossy_columns_differ_and_eviction_compresses_the_context_at_prefill(tiny):
    ids = _ids(48, 1)
    _, record = _done(run_report(tiny, ids, "knorm:compression_ratio=0.5,sink:window_length=8:num_sink_tokens=2",
                                 scored_tokens=16, warm_up=False))
    knorm = _figures(record, "knorm 0.5")
    assert knorm["kld_mean"] > 0 and knorm["scored_tokens"] == 16
    dense_end = record["reference"]["cache_bytes_end"]
    # 32 context tokens pruned to 16 per head, then 15 fed: 31 of the dense 47 positions
    assert knorm["cache_bytes_end"] == pytest.approx(dense_end * 31 / 47)
    assert _figures(record, "sink 2+6")["cache_bytes_end"] < knorm["cache_bytes_end"]


def test_a_refused_or_failing_column_reports_alone_and_the_others_finish(tiny, monkeypatch):
    class Broken(Dynamic):
        label = "broken"

        def forward(self, loaded, cache, sequence, new_tokens):
            if cache.get_seq_length() > 31:  # the context is 28 tokens: 5 tokens scored, then a failure
                raise RuntimeError("boom")
            return super().forward(loaded, cache, sequence, new_tokens)

    events, record = _done(run_report(tiny, _ids(), ["dynamic", "no_cache", "sliding_window", "h2o",
                                                     Broken(label="broken")], scored_tokens=12, warm_up=False))
    errors = {e.name: e.message for e in events if isinstance(e, ColumnFailed)}
    assert [e.column for e in events if isinstance(e, ColumnFailed)] == [1, 2, 3, 4]
    assert "no_cache keeps no cache" in errors["no_cache"]
    assert "sliding-window layers" in errors["sliding_window"]
    assert "unknown strategy 'h2o'" in errors["h2o"]
    assert errors["broken"] == "RuntimeError: boom"
    statuses = {c["name"]: c["status"] for c in record["columns"]}
    assert statuses == {"dynamic": "ok", "no_cache": "error", "sliding_window": "error", "h2o": "error",
                        "broken": "error"}
    assert _figures(record, "dynamic")["scored_tokens"] == 12
    assert _figures(record, "broken")["scored_tokens"] == 5
    # the plain table: the row says "error (below)", the message goes on its own line under the table
    table = format_table(rows_from_record(record)).splitlines()
    broken_row = next(line for line in table if line.startswith("broken "))
    assert "error (below)" in broken_row and "boom" not in broken_row
    assert "broken: RuntimeError: boom" in table


def test_stop_keeps_what_was_scored(tiny):
    stop = threading.Event()
    seen = []
    for event in run_report(tiny, _ids(), "dynamic,static", scored_tokens=24, progress_every=4, stop=stop,
                            warm_up=False):
        seen.append(event)
        if isinstance(event, ReportProgress) and event.scored == 8:
            stop.set()
    record = seen[-1].record
    assert record["stopped"] and seen[-1].stopped
    assert {c["status"] for c in record["columns"]} == {"stopped"}
    assert {c["split"]["scored_tokens"] for c in record["columns"]} == {8}


def test_split_and_columns_are_checked_before_any_compute():
    assert check_split(100, 30) == check_split(100, 30, 70)
    with pytest.raises(ValueError, match="context must hold at least 1 token"):
        check_split(10, 10)
    with pytest.raises(ValueError, match="more than the text's 10 tokens"):
        check_split(10, 5, 6)
    with pytest.raises(ValueError, match="at least one column"):
        report_columns(" , ")
    twice = report_columns("dynamic,dynamic,snapkv:budget_mib=2")
    assert "picked twice" in twice[1].rejected and "budget_mib is Compare's" in twice[2].rejected


def test_records_merge_into_one_table_with_the_pareto_front(tiny, tmp_path):
    _, record = _done(run_report(tiny, _ids(), "dynamic,sink:window_length=8:num_sink_tokens=2", scored_tokens=12,
                                 warm_up=False))
    record = json.loads(json.dumps(record))  # as saved
    assert all(v is None or not (isinstance(v, float) and math.isnan(v))
               for c in record["columns"] for v in c["figures"].values())
    needle = {"kind": "kvlab.needle", "version": 1, "model": record["model"], "columns": [{"name": "sink 2+6"}],
              "cells": [], "summary": [{"strategy": "sink 2+6", "hits": 3, "scored": 4, "errors": 0}]}
    rows = merge_rows([rows_from_record(record, "a.json"), rows_from_record(needle, "b.json")])
    assert len(rows) == 2
    sink = rows[1]
    assert sink["needle_hits"] == 3 and sink["needle_cells"] == 4 and 0 < sink["needle_low"] < 0.75 < sink["needle_high"]
    assert sink["source"] == "a.json + b.json" and sink["kld_mean"] > 0
    assert pareto_marks(rows) == [True, True]
    text = format_table(rows)
    assert "3/4 [" in text and "28+12" in text
    assert format_markdown(rows).count("\n") == 4
    assert rows_to_csv(rows).splitlines()[0].startswith("model,column,status")
    with pytest.raises(ValueError, match="not a report, Compare or Needle record"):
        rows_from_record({"kind": "other"})


def test_the_command_line_builds_the_table_from_records_and_refuses_bad_input(tiny, tmp_path, capsys):
    from kvlab.cli import main

    _, record = _done(run_report(tiny, _ids(), "dynamic,knorm", scored_tokens=12, warm_up=False))
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(record))
    merged = tmp_path / "m.csv"
    assert main(["report", "--from", str(saved), "--csv", str(merged)]) == 0
    out = capsys.readouterr().out
    assert "knorm 0.5" in out and "28+12" in out and merged.read_text().count("\n") == 3
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))
    for argv, message in ((["--scored-tokens", "0"], "--scored-tokens must be at least 1"),
                          (["--scored-tokens", "100000"], "must be less than --max-tokens (4096)"),
                          (["--text", str(latin1)], "not UTF-8 text (byte 3"),
                          (["--columns", "snapkv:quantize=,h2o"], "no column can run: snapkv:quantize=: bad knob"),
                          (["--from", str(saved), "--columns", "dynamic"], "--columns does not apply to --from"),
                          (["--columns", " , "], "--columns is empty"),
                          (["--context-tokens", "4000", "--scored-tokens", "200"], "is more than --max-tokens"),
                          (["--text", str(tmp_path / "none.txt")], "no such file"),
                          (["--from", str(tmp_path / "none.json")], "cannot read record")):
        assert main(["report", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_recall_runs_the_needle_grid_per_column_with_a_dense_gate(tiny):
    from kvlab.quality.recall import needle_grid, run_recall
    from kvlab.quality.report import report_columns

    grid = needle_grid(tiny, "128", "0,1", "0,1,2")
    columns = [(c.describe(), c) for c in report_columns("sink:window_length=32,knorm")]
    needle = run_recall(tiny, columns, grid)
    assert needle["grid"]["seeds"] == [0, 1, 2]
    assert [row["strategy"] for row in needle["summary"]] == ["dynamic", "sink 4+28", "knorm 0.5"]
    assert all(row["cells"] == 6 and row["hits"] + row["gated"] <= 6 for row in needle["summary"])


def test_a_stopped_command_line_run_keeps_what_was_scored_and_exits_130(tiny, tmp_path, capsys, monkeypatch):
    import kvlab.cli.outputs as outputs
    import kvlab.cli.report as cli_report
    import kvlab.models.loading as loading
    from kvlab.cli import main

    held = []
    follow = cli_report._progress

    class Interrupted(outputs.StopOnInterrupt):
        def __init__(self, stop, prog):
            super().__init__(stop, prog)
            held.append(stop)

    def progress(event):  # the first Ctrl-C, as StopOnInterrupt turns it into a stop request
        follow(event)
        if isinstance(event, ReportProgress) and event.scored == 4:
            held[0].set()

    monkeypatch.setattr(loading, "load_model", lambda spec, progress=None: tiny)
    monkeypatch.setattr(cli_report, "_progress", progress)
    monkeypatch.setattr(outputs, "StopOnInterrupt", Interrupted)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i}" for i in range(200)))
    saved = tmp_path / "r.json"
    code = main(["report", "--text", str(text), "--columns", "dynamic", "--max-tokens", "60", "--scored-tokens", "20",
                 "--progress-every", "4", "--json", str(saved)])
    assert code == 130
    record = json.loads(saved.read_text())
    assert record["stopped"] and record["columns"][0]["split"]["scored_tokens"] == 4
    assert "stopped: kept 4" in capsys.readouterr().err


def test_a_compare_row_never_fills_a_report_row_and_a_malformed_record_is_one_line(tmp_path, capsys):
    from kvlab.cli import main

    model = {"name": "m"}
    report = {"kind": "kvlab.report", "version": 1, "model": model, "columns": [
        {"name": "sink 4+28", "status": "ok", "split": {"context_tokens": 80, "scored_tokens": 48},
         "figures": {"kld_mean": 0.30333, "same_top": 0.594, "same_top_low": 0.423, "same_top_high": 0.745}}]}
    compare = {"format": "kvlab.compare", "format_version": 3, "model": model, "columns": [
        {"index": 0, "name": "sink 4+28", "strategy": "sink", "knobs": {}, "status": "ok", "top1_agreement": 1.0,
         "mean_kl": 0.01099, "peak_cache_bytes": 5}]}
    for order in ((compare, report), (report, compare)):
        rows = merge_rows([rows_from_record(r) for r in order])
        by = {row["protocol"]: row for row in rows}
        assert len(rows) == 2 and by["report"]["kld_mean"] == 0.30333 and by["report"]["same_top"] == 0.594
        assert by["compare"]["kld_mean"] == 0.01099 and by["compare"]["same_top_low"] is None
    for bad, said in (({"kind": "kvlab.report", "version": 1, "columns": "oops"}, "the report record has no columns"),
                      ({**report, "columns": [{}]}, "column 1 of the record is incomplete: it lacks name, split"),
                      ({**report, "model": "x"}, "not a well-formed kvlab.report record, its field model")):
        with pytest.raises(ValueError, match=said):
            rows_from_record(bad)
    path = tmp_path / "mangled.json"
    path.write_text(json.dumps({"kind": "kvlab.report", "version": 1, "columns": "oops"}))
    assert main(["report", "--from", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"kind": "kvlab.report", "version": 1, "model": model, "columns": []}))
    assert main(["report", "--from", str(empty)]) == 2
    assert "no rows" in capsys.readouterr().err


def test_the_curve_is_each_columns_own_nll_token_by_token_with_or_without_the_reference(tiny):
    from kvlab.quality.report import TokenScored

    ids = _ids(30, 2)
    for reference in ("dynamic", None):
        events, record = _done(run_report(tiny, ids, "sink:window_length=8:num_sink_tokens=2", scored_tokens=12,
                                          warm_up=False, reference=reference, curve=True))
        curve = [e for e in events if isinstance(e, TokenScored)]
        assert [e.position for e in curve] == list(range(18, 30)) and {e.column for e in curve} == {0}
        assert len({e.cache_bytes for e in curve}) == 1 and curve[0].cache_bytes > 0  # the window is full
        if reference:
            assert math.exp(sum(e.nll for e in curve) / 12) == pytest.approx(_figures(record, "sink 2+6")["ppl"])
            with_reference = [e.nll for e in curve]
        else:
            assert [e.nll for e in curve] == with_reference and record["reference"] is None
            assert not [e for e in events if isinstance(e, ReportProgress)]
