"""`kvlab compare` says what it is doing on stderr while it runs: a line per column start and end and per phase,
from the runner's own events on the tiny model (the summary table stays on stdout)."""

import io

import pytest
import torch

from kvlab.cli.compare import progress
from kvlab.compare.runner import collect, run_compare
from kvlab.generation import GenerationSettings

pytestmark = pytest.mark.unit


def test_compare_progress_names_every_column_as_it_starts_and_ends(tiny):
    out = io.StringIO()
    columns = [{"strategy": "dynamic"}, {"strategy": "static", "max_cache_len": 4}, {"strategy": "no_cache"}]
    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False, timing_policy="quiet")
    done = collect(progress(run_compare(tiny, torch.tensor([[1, 400, 401]]), columns, settings), out))
    lines = out.getvalue().splitlines()
    assert "[column 1] dynamic: running" in lines and "[column 1] dynamic: done, 5 tokens" in lines
    assert "[column 3] no_cache: done, 5 tokens" in lines
    static = [line for line in lines if line.startswith("[column 2]")]
    assert static[0].endswith(": running") and "error" in static[-1] and "max_cache_len" in static[-1]
    assert any(line.startswith("[run] retiming") for line in lines)  # the quiet policy re-times in fair mode
    assert [r.status for r in done.results] == ["ok", "error", "ok"]
