"""A loop mistake with knobs on the command line gets a message saying what it takes (issue 37 item 8)."""

import pytest

from kvlab.inspect.diverge_run import parse_strategy
from kvlab.strategies import StrategyError

pytestmark = pytest.mark.unit


def test_a_loop_mistake_alone_parses():
    assert parse_strategy("loop:full_sequence").name == "loop:full_sequence"


@pytest.mark.parametrize("text, message", [
    ("loop:full_sequence:window_length=32", "loop:full_sequence takes no knobs (got 'window_length=32'): a loop "
                                            "mistake always runs on a dynamic cache; write loop:full_sequence alone"),
    ("loop:positions_from_zero:nbits=2", "loop:positions_from_zero takes no knobs"),
    ("loop:everything", "unknown loop mistake 'loop:everything': choose loop:full_sequence or "
                        "loop:positions_from_zero"),
])
def test_a_loop_mistake_with_knobs_says_what_it_takes(text, message):
    with pytest.raises(StrategyError) as err:
        parse_strategy(text)
    assert str(err.value).startswith(message)
