"""The command line reads what a user types (issue 37, items 4-6), before any model loads.

A negative value after a flag reaches kvlab's own range check instead of argparse's "expected one argument",
for every option; a removed flag gets one line saying what replaced it and the run goes on; every comma-list
option given empty is refused in one line with exit 2 instead of running the default.
"""

import pytest

from kvlab.cli import build_parser, main
from kvlab.cli.common import LIST_FLAGS, REMOVED_FLAGS, prepare_argv
from kvlab.models import loading as models

pytestmark = pytest.mark.unit


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for input that should have been refused first")
    monkeypatch.setattr(models, "load_model", refuse)


def test_a_negative_value_after_a_flag_is_joined_to_it():
    argv, notes = prepare_argv(["needle", "--depths", "-0.5,1.5", "--lengths", "-1k", "--seeds", "-.5"])
    assert argv == ["needle", "--depths=-0.5,1.5", "--lengths=-1k", "--seeds=-.5"] and notes == []
    args = build_parser().parse_args(argv)
    assert (args.depths, args.lengths) == ("-0.5,1.5", "-1k")


def test_a_flag_after_a_flag_is_left_alone():
    assert prepare_argv(["compare", "--ignore-eos", "--no-fidelity"])[0] == ["compare", "--ignore-eos", "--no-fidelity"]


def test_every_negative_number_option_reaches_kvlabs_check(capsys, no_model_load):
    assert main(["perplexity", "--max-tokens", "-5"]) == 2
    assert capsys.readouterr().err.strip() == "kvlab perplexity: --max-tokens must be at least 2, got -5"


def test_a_removed_flag_says_what_replaced_it_and_the_run_goes_on(capsys, no_model_load):
    assert ("compare", "--no-retime") in REMOVED_FLAGS
    # the run goes on past the removed flag and stops at the next (real) problem: an empty strategy list
    assert main(["compare", "--no-retime", "--prompt", "hi", "--strategies", ","]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("kvlab compare: --no-retime is removed: live timing") and "ignoring it" in err[0]
    assert err[1].startswith("kvlab compare: --strategies is empty")


LISTS = [("needle", "lengths"), ("needle", "depths"), ("needle", "seeds"), ("needle", "strategies"),
         ("compare", "strategies"), ("perplexity", "strategies"), ("plan", "strategies"), ("report", "columns"),
         ("bench", "only"), ("bench", "strategies")]


@pytest.mark.parametrize("command, dest", LISTS)
@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_list_option_exits_2_in_one_line(capsys, no_model_load, command, dest, value):
    assert dest in LIST_FLAGS
    assert main([command, f"--{dest}", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"kvlab {command}: --{dest} is empty: give at least one item, or leave the flag out for "
                    "the default")]

