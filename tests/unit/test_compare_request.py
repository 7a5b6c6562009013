"""A Compare run asked for as a prompt and a list of strategies (the command line's `--strategies`, the
`compare_strategies` agent tool) is read by one pair of functions in the Compare wing."""

import pytest

from kvlab.compare.preset import strategies_preset, strategy_columns

pytestmark = pytest.mark.unit


def test_a_bad_item_is_rejected_in_its_own_column_and_the_others_run():
    columns = strategy_columns(["dynamic", "sink:window_length=-1"])
    assert columns[0].strategy is not None and columns[1].strategy is None and columns[1].rejected


def test_when_nothing_could_run_every_reason_is_raised():
    with pytest.raises(ValueError, match=r"nope: .*; sink:window_length=-1: "):
        strategy_columns(["nope", "sink:window_length=-1"])


def test_the_preset_carries_the_prompt_and_its_sections():
    preset = strategies_preset("hi", ["dynamic", "sink:window_length=8"], "mcp", model={"source": "bundled"},
                               generation={"max_new_tokens": 4})
    assert preset.prompt.text == "hi" and preset.generation.max_new_tokens == 4 and len(preset.columns) == 2
    with pytest.raises(ValueError, match="the prompt is empty"):
        strategies_preset("  ", ["dynamic"], "mcp")
