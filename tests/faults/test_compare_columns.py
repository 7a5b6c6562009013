"""Fault catalogue: one compare run, one bad or impossible column. Each case is the `--strategies` input and
the observable right behaviour: that column reports its own status and reason (in its row and on stderr), the
others finish, and the exit status is 0 while any column finished, 1 when none did; when no column could even be
built, one line gives the reasons and the exit status is 2, before any model loads and with no record."""

import json

import pytest

from kvlab.cli import main

pytestmark = pytest.mark.integration

CASES = [
    ("dynamic,quantized:backend=quanto:nbits=3",
     [("ok", ""), ("error", "nbits=3 is not supported by the quanto backend (optimum-quanto ")], 0),
    ("quantized:backend=quanto:nbits=4:axis_key=-1,dynamic",
     [("error", "fails with axis_key=-1, axis_value=0, nbits=4"), ("ok", "")], 0),
    ("static:max_cache_len=10,dynamic", [("error", "static cache too small: max_cache_len=10"), ("ok", "")], 0),
    ("h2o,dynamic", [("error", "unknown strategy 'h2o'; allowed: no_cache, dynamic"), ("ok", "")], 0),
    ("static:oops", [("error", "bad knob 'oops' in 'static:oops': write key=value")], 2),
    ("sink:window_length=0,dynamic", [("error", "window_length must be an integer >= 1"), ("ok", "")], 0),
    ("sliding_window,dynamic", [("unavailable", "this model has no sliding-window layers"), ("ok", "")], 0),
    ("offloaded,dynamic", [("unavailable", "needs a CUDA GPU"), ("ok", "")], 0),
    ("quantized:backend=fp8:residual_length=4", [("error", "the fp8 backend quantizes per tensor")], 2),
]


@pytest.mark.parametrize("strategies, expected, exit_status", CASES, ids=[case[0] for case in CASES])
def test_a_bad_column_reports_its_reason_and_the_others_run(tmp_path, capsys, strategies, expected, exit_status):
    out = tmp_path / "run.json"
    status = main(["compare", "--prompt", "Say hi in five words.", "--strategies", strategies, "--max-new-tokens", "6",
                   "--no-fidelity", "--json", str(out)])
    stderr = capsys.readouterr().err
    assert status == exit_status, stderr[-2000:]
    if exit_status == 2:
        assert not out.exists() and "[model]" not in stderr
        assert [line for line in stderr.splitlines() if expected[0][1] in line][0].startswith("kvlab compare: ")
        return
    columns = json.loads(out.read_text())["columns"]
    assert len(columns) == len(expected)
    for column, (state, why) in zip(columns, expected):
        assert column["status"] == state and why in column["message"]
        if state == "error":
            assert f"column {column['index'] + 1} " in stderr and why in stderr
