"""The perplexity view's backend: cache choices, turn-taking stream, running log-PPL (tiny model)."""

import math

import pytest
import torch

from kvlab.perplexity import cache_makers, moving_log_ppl, stream_many, stream_nll


def test_cache_makers_build_each_cache_and_explain_refusals(tiny):
    makers = cache_makers(tiny, ["dense", "window", "sink"], window=8, sinks=2)
    assert set(makers) == {"dense", "window", "sink"}
    assert makers["window"]().num_sink_tokens == 0 and makers["sink"]().num_sink_tokens == 2
    with pytest.raises(ValueError, match="sliding_window: this model has no sliding-window layers"):
        cache_makers(tiny, ["sliding_window"], 8, 2)
    with pytest.raises(ValueError, match="unknown perplexity strategy 'h2o'; allowed: dense, window, sink"):
        cache_makers(tiny, ["h2o"], 8, 2)
    with pytest.raises(ValueError, match="num_sink_tokens must be an integer"):
        cache_makers(tiny, ["sink"], 8, 8)


def test_stream_many_takes_turns_and_matches_single_streams(tiny):
    ids = torch.randint(3, 1000, (1, 30), generator=torch.Generator().manual_seed(0))
    makers = cache_makers(tiny, ["dense", "window", "sink"], window=8, sinks=2)
    seen = list(stream_many(tiny.model, ids, makers))
    assert [name for name, *_ in seen[:6]] == ["dense", "window", "sink"] * 2
    assert len(seen) == 3 * 29
    for name in makers:
        mine = [nll for n, _, nll, _ in seen if n == name]
        assert mine == pytest.approx(stream_nll(tiny.model, ids, makers[name]), abs=1e-5)
    window_bytes = [size for n, pos, _, size in seen if n == "window" and pos >= 8]
    assert len(set(window_bytes)) == 1
    dense_bytes = [size for n, _, _, size in seen if n == "dense"]
    assert dense_bytes == sorted(dense_bytes) and dense_bytes[-1] > window_bytes[0]


def test_moving_log_ppl_is_the_mean_over_the_last_span():
    nll = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert moving_log_ppl(nll, 2) == pytest.approx([1.0, 1.5, 2.5, 3.5, 4.5])
    assert moving_log_ppl(nll, 10)[-1] == pytest.approx(3.0)
    assert math.isclose(moving_log_ppl([0.5], 4)[0], 0.5)
