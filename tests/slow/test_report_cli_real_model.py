"""`kvlab report` on the bundled SmolLM2 end to end: table, --json/--csv, --from merging, exit codes (the same
paths run on the tiny model in tests/unit/test_report.py)."""

import json

from kvlab.cli import main


def test_the_command_line_writes_merges_and_refuses(tmp_path, capsys):
    out, table = tmp_path / "r.json", tmp_path / "r.csv"
    code = main(["report", "--columns", "sink:window_length=16,knorm:compression_ratio=0.5,sliding_window",
                 "--max-tokens", "40", "--scored-tokens", "8", "--progress-every", "4", "--json", str(out),
                 "--csv", str(table)])
    captured = capsys.readouterr()
    assert code == 0
    assert "[8] knorm 0.5: PPL ratio" in captured.err and "column sliding_window: " in captured.err
    assert "32+8" in captured.out and "knorm 0.5" in captured.out
    record = json.loads(out.read_text())
    assert [c["status"] for c in record["columns"]] == ["ok", "ok", "error"]
    assert table.read_text().count("\n") == 4
    needle = {"kind": "kvlab.needle", "version": 1, "model": record["model"], "columns": [{"name": "knorm 0.5"}],
              "cells": [], "summary": [{"strategy": "knorm 0.5", "hits": 2, "scored": 3, "errors": 0}]}
    (tmp_path / "n.json").write_text(json.dumps(needle))
    assert main(["report", "--from", str(out), str(tmp_path / "n.json")]) == 0
    assert "2/3 [" in capsys.readouterr().out
    assert main(["report", "--from", str(tmp_path / "missing.json")]) == 2
    assert "cannot read record" in capsys.readouterr().err
    assert main(["report", "--scored-tokens", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
