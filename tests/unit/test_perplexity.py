"""StreamingLLM's perplexity view of the quality report (tiny model): its columns from the registry and their
refusals, the report with a one-token context streaming each cache's own NLL in turns, bit for bit the
token-by-token loop it replaces, and the running log-PPL."""

import math
import threading

import pytest
import torch

from kvlab.protocol import RunDone, RunStarted
from kvlab.quality.perplexity import moving_log_ppl, perplexity_columns, refusals, run_perplexity
from kvlab.quality.report import TokenScored
from kvlab.strategies import StrategyError


def chosen(specs, window=8, sinks=2) -> dict:
    return {column.describe(): column.strategy for column in perplexity_columns(specs, window, sinks)}


def curves(loaded, ids, columns, stop=None) -> dict[str, list[TokenScored]]:
    names = [column.describe() for column in columns]
    out = {name: [] for name in names}
    for event in run_perplexity(loaded, ids, columns, stop):
        if isinstance(event, TokenScored):
            out[names[event.column]].append(event)
    return out


def test_perplexity_columns_come_from_the_registry_and_explain_refusals(tiny):
    picked = chosen("dynamic,sink:num_sink_tokens=0,sink")
    assert list(picked) == ["dynamic", "window 8", "sink 2+6"]
    assert picked["window 8"].name == picked["sink 2+6"].name == "sink"
    assert picked["window 8"].num_sink_tokens == 0 and picked["sink 2+6"].num_sink_tokens == 2
    assert list(chosen(["dense", "window"])) == ["dynamic", "window 8"]
    refused = refusals(tiny, perplexity_columns("dynamic,sliding_window,snapkv"), 20)
    assert list(refused) == ["sliding_window", "snapkv 0.5"] and "no sliding-window layers" in refused["sliding_window"]
    assert "needs a prompt longer than window_size" in refused["snapkv 0.5"]  # a one-token context is not compressed
    with pytest.raises(StrategyError, match="unknown strategy 'h2o'; allowed: no_cache, dynamic"):
        chosen("h2o")
    with pytest.raises(StrategyError, match="num_sink_tokens must be an integer"):
        chosen("sink", window=8, sinks=8)
    with pytest.raises(StrategyError, match="no_cache keeps no cache"):
        chosen("no_cache")
    with pytest.raises(StrategyError, match="picked twice"):
        chosen("dynamic,dynamic")
    with pytest.raises(StrategyError, match="budget_mib is Compare's"):
        chosen("dynamic:budget_mib=1")


def test_static_and_quantized_stream_too(tiny):
    ids = torch.randint(3, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    nll = {name: [e.nll for e in events] for name, events in
           curves(tiny, ids, perplexity_columns("dynamic,static,quantized:backend=quanto:residual_length=4")).items()}
    assert nll["static"] == pytest.approx(nll["dynamic"], abs=1e-5)
    assert len(nll["quantized quanto int4 r4"]) == 11


def test_caches_take_turns_and_a_window_holds_constant_bytes(tiny):
    ids = torch.randint(3, 1000, (1, 30), generator=torch.Generator().manual_seed(0))
    columns = perplexity_columns(["dense", "window", "sink"], 8, 2)
    seen = [e for e in run_perplexity(tiny, ids, columns) if isinstance(e, TokenScored)]
    assert [e.column for e in seen[:6]] == [0, 1, 2] * 2 and len(seen) == 3 * 29
    for index, column in enumerate(columns):
        alone = curves(tiny, ids, [column])[column.describe()]
        assert [e.nll for e in seen if e.column == index] == [e.nll for e in alone]
    window_bytes = [e.cache_bytes for e in seen if e.column == 1 and e.position >= 8]
    assert len(set(window_bytes)) == 1
    dense_bytes = [e.cache_bytes for e in seen if e.column == 0]
    assert dense_bytes == sorted(dense_bytes) and dense_bytes[-1] > window_bytes[0]


def test_a_stop_keeps_what_was_scored_and_bad_input_is_refused(tiny):
    ids = torch.randint(3, 1000, (1, 40), generator=torch.Generator().manual_seed(1))
    stop, seen = threading.Event(), []
    for event in run_perplexity(tiny, ids, perplexity_columns("sink", 16, 4), stop):
        seen.append(event)
        if isinstance(event, TokenScored) and event.position == 10:
            stop.set()
    assert isinstance(seen[0], RunStarted) and isinstance(seen[-1], RunDone) and seen[-1].stopped
    assert [e.position for e in seen if isinstance(e, TokenScored)] == list(range(1, 11))
    assert seen[-1].record["columns"][0]["status"] == "stopped"
    with pytest.raises(ValueError, match="at least 2 tokens"):
        run_perplexity(tiny, torch.tensor([[3]]), perplexity_columns("dynamic"))


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


def test_the_cli_ends_a_run_whose_cache_fails_with_one_line_and_keeps_what_was_scored(tiny, tmp_path, capsys,
                                                                                  monkeypatch):
    """A cache that raises while streaming: its reason on stderr in one line, exit 1, the tokens scored before
    it written as after a stop; a cache that cannot take a one-token context is refused before any compute."""
    import json

    from kvlab.cli import main
    from kvlab.models import loading
    from kvlab.strategies.sink import Sink

    real, calls = Sink.forward, []

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise RuntimeError("injected failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(loading, "load_model", lambda spec, progress=None: tiny)
    monkeypatch.setattr(Sink, "forward", forward)
    text, saved = tmp_path / "t.txt", tmp_path / "p.json"
    text.write_text(" ".join(f"word{i}" for i in range(100)))
    code = main(["perplexity", "--text", str(text), "--strategies", "dynamic,sink", "--window", "8", "--sinks", "2",
                 "--max-tokens", "30", "--json", str(saved)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvlab perplexity")]
    assert code == 1 and err == ["kvlab perplexity: sink 2+6: RuntimeError: injected failure"]
    record = json.loads(saved.read_text())
    assert record["stopped"] and len(record["strategies"]["sink 2+6"]["nll"]) == 5
    assert len(record["strategies"]["dynamic"]["nll"]) == 6  # its token of the failing round, then the stop
    assert main(["perplexity", "--text", str(text), "--strategies", "snapkv", "--max-tokens", "30"]) == 2
    assert "kvlab perplexity: snapkv 0.5: snapkv needs a prompt longer than window_size" in capsys.readouterr().err
