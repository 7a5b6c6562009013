"""`kvlab compare` says what it is doing on stderr while it runs: a line per column start and end and per phase,
from the runner's own events on the tiny model (the summary table stays on stdout)."""

import io

import pytest
import torch

from kvlab.cli.compare import fidelity_table, progress, summary_first
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings

pytestmark = pytest.mark.unit


def test_compare_progress_names_every_column_as_it_starts_and_ends(tiny):
    out = io.StringIO()
    columns = [{"strategy": "dynamic"}, {"strategy": "static", "max_cache_len": 4}, {"strategy": "no_cache"}]
    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False, timing_policy="quiet")
    table = io.StringIO()
    done = collect(summary_first(progress(run_compare(tiny, torch.tensor([[1, 400, 401]]), columns, settings), out),
                                 table))
    lines = out.getvalue().splitlines()
    assert "[column 1] dynamic: running" in lines and "[column 1] dynamic: done, 5 tokens" in lines
    assert "[column 3] no_cache: done, 5 tokens" in lines
    static = [line for line in lines if line.startswith("[column 2]")]
    assert static[0].endswith(": running") and "error" in static[-1] and "max_cache_len" in static[-1]
    assert any(line.startswith("[run] retiming") for line in lines)  # the quiet policy re-times in fair mode
    assert [r.status for r in done.results] == ["ok", "error", "ok"]
    # The summary is printed before the fidelity pass, without its teacher-forced figures; they follow.
    ready = next(i for i, line in enumerate(lines) if line.startswith("[run] summary ready after"))
    assert lines[ready].endswith("fidelity: scoring 2 columns")
    scored = [line for line in lines if line.startswith("[fidelity]")]
    assert len(scored) == 2 and scored[-1].startswith("[fidelity] 2 of 2 columns scored: no_cache, top-1 ")
    assert all(i > ready for i, line in enumerate(lines) if line.startswith("[fidelity]"))
    assert "agreement" in table.getvalue() and "top-1" not in table.getvalue()
    assert "top-1 agreement" in fidelity_table(done) and "scored" in fidelity_table(done)
