"""The Perplexity tab's pure part (kvlab.ui.perplexity.view): choices from the registry, the form -> a plan
on a tiny model (unavailable caches left out with the reason), fake `TokenScored` events -> status, figure,
table."""

import math

import pytest

from kvlab.protocol import ColumnFailed, RunStarted
from kvlab.quality.report import TokenScored
from kvlab.strategies import StrategyError
from kvlab.strategies.base import names_with
from kvlab.ui.perplexity.view import (
    ALL_FULL,
    DEFAULT_CHOICES,
    PASTED,
    PerplexityRequest,
    PerplexityView,
    default_choices,
    perplexity_choices,
    plan_perplexity,
)

TEXT = "The quick brown fox jumps over the lazy dog. " * 20


def test_choices_are_the_papers_three_then_the_registry():
    choices = perplexity_choices()
    assert choices[:3] == DEFAULT_CHOICES == ["dynamic", "window", "sink"]
    assert choices[3] == ALL_FULL
    assert set(choices[4:]) == set(names_with("usable_in_perplexity")) - {"dynamic", "sink"}
    assert PerplexityRequest(choices=[ALL_FULL, "sliding_window"]).spec_text() == "dynamic:layer_types=full,sliding_window"
    assert default_choices("bundled:gemma-3-270m") == [ALL_FULL, "sliding_window"]
    assert default_choices("bundled") == default_choices("some/hub-id") == DEFAULT_CHOICES
    assert "no_cache" not in choices and "sliding_window" in choices


def test_the_default_request_is_dynamic_window_and_sink_with_the_window_settings():
    chosen = {column.describe(): column.strategy for column in PerplexityRequest(window=32, sinks=2).columns()}
    assert list(chosen) == ["dynamic", "window 32", "sink 2+30"]
    assert chosen["window 32"].num_sink_tokens == 0 and chosen["sink 2+30"].window_length == 32


def test_extra_columns_use_the_compare_syntax():
    request = PerplexityRequest(choices=["dynamic"], extra="sink:num_sink_tokens=1:window_length=16")
    assert request.spec_text() == "dynamic,sink:num_sink_tokens=1:window_length=16"
    assert [column.describe() for column in request.columns()] == ["dynamic", "sink 1+15"]
    with pytest.raises(ValueError, match="pick at least one cache"):
        PerplexityRequest(choices=[]).columns()
    with pytest.raises(ValueError, match="write key=value"):
        PerplexityRequest(choices=[], extra="sink:window").columns()


def test_a_cache_the_model_cannot_run_is_left_out_with_the_reason(tiny):
    request = PerplexityRequest(choices=["dynamic", "sliding_window"], tokens=24, text_choice=PASTED, pasted=TEXT)
    plan = plan_perplexity(request, tiny)
    assert [column.describe() for column in plan.columns] == ["dynamic"] and plan.input_ids.shape == (1, 24)
    assert "no sliding-window layers" in plan.skipped["sliding_window"]
    with pytest.raises(StrategyError, match="no picked cache can run on this model: sliding_window: this model"):
        plan_perplexity(PerplexityRequest(choices=["sliding_window"], text_choice=PASTED, pasted=TEXT), tiny)
    with pytest.raises(ValueError, match="the text is empty"):
        plan_perplexity(PerplexityRequest(text_choice=PASTED, pasted="  "), tiny)


def steps(view, labels, nlls, start=1):
    for offset, nll in enumerate(nlls):
        for i, _ in enumerate(labels):
            view.apply(TokenScored(i, start + offset, nll + i, 1000 * (start + offset)))


def test_view_folds_steps_into_status_figure_and_table():
    view = PerplexityView(["dynamic", "window 2"], window=2, total=5, skipped={"sliding_window": "no sliding layers"})
    steps(view, ["dynamic", "window 2"], [1.0, 2.0, 3.0])
    assert view.nll == {"dynamic": [1.0, 2.0, 3.0], "window 2": [2.0, 3.0, 4.0]}
    assert view.cache_bytes["dynamic"] == [1000, 2000, 3000]
    assert view.running_ppl("dynamic") == pytest.approx(math.exp(2.5))
    assert view.progress_text().startswith(f"token 3 of 5 · dynamic ppl {math.exp(2.5):.1f} · window 2 ppl")
    assert view.progress_text().endswith("not run: sliding_window: no sliding layers")
    assert view.final_text(stopped=True).startswith("stopped: 3 tokens per cache")
    assert view.final_text(stopped=False).startswith("done: 3 tokens per cache")
    table = view.table()
    assert list(table["cache"]) == ["dynamic", "window 2"]
    assert list(table.columns) == ["cache", "tokens 1-2", "tokens 3-3"]
    assert table.iloc[0, 1] == round(math.exp(1.5), 2)
    ppl, nbytes = view.frames()
    assert list(ppl["series"].unique()) == ["dynamic", "window 2"] and len(ppl) == 6
    assert list(ppl[ppl["series"] == "dynamic"]["nats"]) == pytest.approx([1.0, 1.5, 2.5])
    assert list(nbytes[nbytes["series"] == "dynamic"]["position"]) == [1, 2, 3]
    assert ppl["value"].iloc[0] == "1.000 nats" and nbytes["value"].str.endswith(" MiB").all()
    assert list(view.colors().values())[:2] == ["#1f77b4", "#d62728"] and "last 2 tokens" in view.caption()


def test_view_before_any_step_and_bad_input():
    view = PerplexityView(["dynamic"], window=4, total=10)
    assert view.progress_text() == "token 0 of 10" and view.final_text(False) == "done: 0 tokens per cache"
    assert all(frame.empty for frame in view.frames())
    view.apply(RunStarted(("dynamic",)))
    view.apply(ColumnFailed(0, "dynamic", "error", "RuntimeError: boom"))
    assert view.nll == {"dynamic": []}  # only a scored token changes the curves
    with pytest.raises(IndexError):
        view.apply(TokenScored(1, 1, 0.5, 10))


def test_status_compares_every_cache_at_the_same_token():
    view = PerplexityView(["dynamic", "sink 1+1"], window=2, total=10)
    steps(view, ["dynamic", "sink 1+1"], [1.0, 2.0])
    view.apply(TokenScored(0, 3, 9.0, 3000))  # dynamic is a token ahead of sink in the round
    assert view.progress_text() == f"token 2 of 10 · dynamic ppl {math.exp(1.5):.1f} · sink 1+1 ppl {math.exp(2.5):.1f}"
