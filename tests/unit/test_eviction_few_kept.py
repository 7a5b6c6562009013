"""A budget that keeps almost nothing says so (issue 37 item 7): the column's warning names how many prompt
positions it kept of how many, and the Compare card shows a `warning` status instead of a green `done`."""

from types import SimpleNamespace

import pytest
import torch

from kvlab.compare.events import ColumnDone, ColumnResult
from kvlab.strategies import StrategyError
from kvlab.strategies.base import make_strategy, parse_strategy_item
from kvlab.ui.compare.view import FINISHED, RunView

pytestmark = pytest.mark.unit
LOADED = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2), model=SimpleNamespace(dtype=torch.float32))


@pytest.mark.parametrize("spec, warned", [("snapkv:target_tokens=1", True), ("snapkv:target_tokens=15", True),
                                          ("snapkv:target_tokens=16", False), ("snapkv:compression_ratio=0.95", True),
                                          ("snapkv:compression_ratio=0.5", False), ("knorm:target_tokens=500", False)])
def test_a_budget_that_keeps_almost_nothing_warns_with_the_count(spec, warned):
    warning = make_strategy(parse_strategy_item(spec)).warning_on(LOADED, 154)
    assert bool(warning) is warned
    if warned:
        kept = int(warning.split()[2])
        assert warning.startswith(f"⚠ kept {kept} of 154 prompt positions per KV head")


def test_target_tokens_zero_is_unset_and_negative_is_refused():
    assert make_strategy(parse_strategy_item("snapkv:target_tokens=0")).kept_tokens(100, 0, None, torch.float32) == 50  # the ratio
    with pytest.raises(StrategyError):
        make_strategy(parse_strategy_item("snapkv:target_tokens=-1"))


def test_the_card_of_a_warned_column_shows_a_warning_status():
    warning = "⚠ kept 1 of 154 prompt positions per KV head (1%): the budget throws almost the whole prompt away"
    view = RunView(["snapkv 1 tok", "dynamic"])
    for index, warned in ((0, warning), (1, "")):
        view.apply(ColumnDone(index, ColumnResult(index=index, name="x", strategy="x", knobs={}, status="ok",
                                                  warning=warned)))
    assert "warning" in FINISHED and view.columns_finished
    assert (view.columns[0].status, view.columns[0].message) == ("warning", warning)
    assert view.columns[1].status == "done"
