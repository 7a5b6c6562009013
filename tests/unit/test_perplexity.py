"""The perplexity backend: strategy choices from the registry, turn-taking stream, running log-PPL (tiny model)."""

import math

import pytest
import torch

from kvlab.quality.perplexity import moving_log_ppl, perplexity_strategies, stream_many, stream_nll
from kvlab.strategies import StrategyError


def test_perplexity_strategies_come_from_the_registry_and_explain_refusals(tiny):
    chosen = perplexity_strategies(tiny, "dynamic,sink:num_sink_tokens=0,sink", window=8, sinks=2)
    assert list(chosen) == ["dynamic", "window 8", "sink 2+6"]
    assert chosen["window 8"].name == chosen["sink 2+6"].name == "sink"
    assert chosen["window 8"].num_sink_tokens == 0 and chosen["sink 2+6"].num_sink_tokens == 2
    assert list(perplexity_strategies(tiny, ["dense", "window"], window=8)) == ["dynamic", "window 8"]
    with pytest.raises(StrategyError, match="sliding_window: this model has no sliding-window layers"):
        perplexity_strategies(tiny, "sliding_window")
    with pytest.raises(StrategyError, match="unknown strategy 'h2o'; allowed: no_cache, dynamic"):
        perplexity_strategies(tiny, "h2o")
    with pytest.raises(StrategyError, match="num_sink_tokens must be an integer"):
        perplexity_strategies(tiny, "sink", window=8, sinks=8)
    with pytest.raises(StrategyError, match="no_cache keeps no cache"):
        perplexity_strategies(tiny, "no_cache")
    with pytest.raises(StrategyError, match="picked twice"):
        perplexity_strategies(tiny, "dynamic,dynamic")


def test_static_and_quantized_stream_too(tiny):
    ids = torch.randint(3, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    chosen = perplexity_strategies(tiny, "dynamic,static,quantized:backend=quanto:residual_length=4")
    nll = {name: stream_nll(tiny, ids, strategy) for name, strategy in chosen.items()}
    assert nll["static"] == pytest.approx(nll["dynamic"], abs=1e-5)
    assert len(nll["quantized quanto int4 r4"]) == 11


def test_stream_many_takes_turns_and_matches_single_streams(tiny):
    ids = torch.randint(3, 1000, (1, 30), generator=torch.Generator().manual_seed(0))
    chosen = perplexity_strategies(tiny, ["dense", "window", "sink"], window=8, sinks=2)
    seen = list(stream_many(tiny, ids, chosen))
    assert [step.name for step in seen[:6]] == ["dynamic", "window 8", "sink 2+6"] * 2
    assert len(seen) == 3 * 29
    for name, strategy in chosen.items():
        mine = [step.nll for step in seen if step.name == name]
        assert mine == pytest.approx(stream_nll(tiny, ids, strategy), abs=1e-5)
    window_bytes = [step.cache_bytes for step in seen if step.name == "window 8" and step.position >= 8]
    assert len(set(window_bytes)) == 1
    dense_bytes = [step.cache_bytes for step in seen if step.name == "dynamic"]
    assert dense_bytes == sorted(dense_bytes) and dense_bytes[-1] > window_bytes[0]


def test_moving_log_ppl_is_the_mean_over_the_last_span():
    nll = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert moving_log_ppl(nll, 2) == pytest.approx([1.0, 1.5, 2.5, 3.5, 4.5])
    assert moving_log_ppl(nll, 10)[-1] == pytest.approx(3.0)
    assert math.isclose(moving_log_ppl([0.5], 4)[0], 0.5)


def reference_curve(loaded, ids, strategy) -> list[tuple[float, int]]:
    """(NLL in nats, cache bytes) of tokens 1..seq-1 fed one at a time through a fresh cache of `strategy`: the
    StreamingLLM loop written out by hand, token p predicted from what the cache holds after tokens 0..p-1."""
    from kvlab.accounting import cache_bytes

    cache, out = strategy.build_cache(loaded, ids.shape[1]), []
    with torch.inference_mode():
        for position in range(1, ids.shape[1]):
            logits = strategy.forward(loaded, cache, ids[:, :position], 1)
            out.append((-float(torch.log_softmax(logits[0].float(), dim=-1)[ids[0, position]]), cache_bytes(cache)))
    return out


def test_the_report_with_a_one_token_context_is_the_streaming_loop_token_for_token(tiny):
    from kvlab.protocol import RunDone, RunStarted
    from kvlab.quality.perplexity import perplexity_columns, run_perplexity
    from kvlab.quality.report import TokenScored

    ids = torch.randint(3, 1000, (1, 30), generator=torch.Generator().manual_seed(0))
    columns = perplexity_columns("dynamic,window,sink,static,quantized:backend=quanto:residual_length=4", 8, 2)
    events = list(run_perplexity(tiny, ids, columns))
    assert isinstance(events[0], RunStarted) and events[0].plan.context_tokens == 1 and isinstance(events[-1], RunDone)
    scored = [e for e in events if isinstance(e, TokenScored)]
    assert [e.column for e in scored[:10]] == [0, 1, 2, 3, 4] * 2  # in turns, one token each per round
    for index, column in enumerate(columns):
        curve = [(e.nll, e.cache_bytes) for e in scored if e.column == index]
        assert [e.position for e in scored if e.column == index] == list(range(1, 30))
        assert curve == reference_curve(tiny, ids, column.strategy), column.describe()  # bit for bit
    record = events[-1].record
    assert record["reference"] is None and [c["status"] for c in record["columns"]] == ["ok"] * 5
    assert all(c["figures"] is None and c["split"] == {"context_tokens": 1, "scored_tokens": 29}
               for c in record["columns"])
