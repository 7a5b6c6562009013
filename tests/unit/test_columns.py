"""The one check of a run's columns (`kvlab.columns.parse_columns`): how many, which are picked twice, which are
rejected and why, and the options each wing passes (its limit, words, budgets, checks, aliases, strictness)."""

import pytest

from kvlab.columns import MAX_COLUMNS, Column, parse_columns
from kvlab.strategies import StrategyError, make_strategy


def test_text_and_items_give_the_same_columns_in_order():
    from_text = parse_columns("dynamic, sink:window_length=64 ,static", MAX_COLUMNS)
    from_items = parse_columns(["dynamic", {"strategy": "sink", "window_length": 64},
                                make_strategy({"strategy": "static"})], MAX_COLUMNS)
    assert [c.describe() for c in from_text] == [c.describe() for c in from_items]
    assert [c.strategy.name for c in from_text] == ["dynamic", "sink", "static"]
    column = Column.from_text("dynamic")
    assert parse_columns([column], MAX_COLUMNS)[0] is column


@pytest.mark.parametrize("source", ["", " , ", [], None])
def test_no_column_is_the_wings_own_line(source):
    with pytest.raises(ValueError, match="^pick at least one column$"):
        parse_columns(source, MAX_COLUMNS)
    with pytest.raises(ValueError, match="^pick at least one cache, e.g. dynamic$"):
        parse_columns(source, MAX_COLUMNS, empty="pick at least one cache, e.g. dynamic")


def test_more_than_the_limit_is_refused_before_any_item_is_read():
    with pytest.raises(ValueError, match=r"^at most 2 columns, got 3$"):
        parse_columns("dynamic,nonsense:x,static", 2)
    with pytest.raises(ValueError, match=r"^at most 2 columns \(sweeps included\), got 3$"):
        parse_columns(["dynamic"] * 3, 2, counted=" (sweeps included)")
    assert len(parse_columns(["dynamic"] * MAX_COLUMNS, MAX_COLUMNS)) == MAX_COLUMNS


def test_a_bad_item_is_a_rejected_column_and_the_others_stay():
    columns = parse_columns("dynamic,nonsense,sink:window_length,static:max_cache_len=-3", MAX_COLUMNS)
    assert columns[0].strategy is not None and not columns[0].rejected
    assert [c.strategy for c in columns[1:]] == [None, None, None]
    assert "nonsense" in columns[1].rejected and columns[1].title == "nonsense"
    assert "write key=value" in columns[2].rejected and columns[2].title == "sink:window_length"
    assert columns[3].rejected and columns[3].describe() == "static:max_cache_len=-3"


def test_duplicates_budgets_and_checks_are_the_wings_choice():
    assert all(c.strategy is not None for c in parse_columns("dynamic,dynamic", MAX_COLUMNS))
    twice = parse_columns("dynamic,dynamic,snapkv:budget_mib=2", 40, unique=True, budget_refusal="no budgets here")
    assert twice[0].strategy is not None
    assert twice[1].rejected == "'dynamic' is picked twice: give each column different knobs"
    assert twice[2].rejected == "no budgets here" and twice[2].title.startswith("snapkv")
    checked = parse_columns("dynamic,no_cache", 40, check=lambda s: "" if s.use_cache else f"{s.name} keeps none")
    assert checked[0].strategy is not None and checked[1].rejected == "no_cache keeps none"


def test_strict_raises_the_first_column_that_cannot_run():
    with pytest.raises(StrategyError, match="picked twice"):
        parse_columns("dynamic,dynamic", 40, unique=True, strict=True)
    with pytest.raises(StrategyError, match="write key=value"):
        parse_columns("dynamic,sink:window_length", 40, strict=True)
    with pytest.raises(StrategyError, match="unknown strategy"):
        parse_columns([{"strategy": "nonsense"}], 40, strict=True)
    given = Column.from_text("nonsense")
    assert parse_columns(["dynamic", given], 40, strict=True)[1] is given  # rejected by its front: it stays


def test_prepare_rewrites_each_spec_and_fallback_reaches_budgeted_text_items():
    def window(spec):
        return {**spec, "strategy": "sink", "num_sink_tokens": 0} if spec["strategy"] == "window" else spec

    columns = parse_columns("window:window_length=32,dynamic", 40, prepare=window)
    assert columns[0].strategy.knobs()["num_sink_tokens"] == 0 and columns[1].strategy.name == "dynamic"
    budgeted = parse_columns("dynamic:budget_mib=1", MAX_COLUMNS, fallback="sink:window_length=16")
    assert [s.name for s in budgeted[0].budget.fallback] == ["sink"]
