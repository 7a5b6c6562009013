"""Engine columns in the quality report, on the tiny in-process model: a model with no GGUF refuses
`engine:llamacpp` in its own row while kvlab's columns finish; an engine column is scored against its engine's
own reference (one per distinct reference, stepped once per round, closed at the end), the record names each
column's reference and holds the engine reference's cost, the table names the reference and takes the Pareto
front per (model, reference); the Perplexity view refuses engine columns."""

import json

import pytest
import torch

from kvlab.engines import llamacpp
from kvlab.engines.gguf import NO_GGUF
from kvlab.protocol import ColumnFailed, RunDone
from kvlab.quality.perplexity import perplexity_columns
from kvlab.quality.record import load_record, rows_from_record
from kvlab.quality.report import ReportProgress, report_columns, run_report
from kvlab.quality.table import format_markdown, format_table, pareto_marks
from kvlab.strategies import StrategyError
from kvlab.strategies.engine_llamacpp import LlamaCppEngine

LLAMA_Q4 = "engine:llamacpp:type_k=q4_0:type_v=q4_0"


def _ids(n=40, seed=0):
    return torch.randint(3, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def test_a_model_with_no_gguf_refuses_the_llamacpp_column_and_the_others_finish(tiny, monkeypatch):
    monkeypatch.setattr(llamacpp, "binding_reason", lambda: None)  # the binding's presence is not the point here
    events = list(run_report(tiny, _ids(), f"dynamic,{LLAMA_Q4},quantized:backend=quanto:nbits=4",
                             scored_tokens=8, warm_up=False))
    failed = [e for e in events if isinstance(e, ColumnFailed)]
    assert [(e.column, e.status) for e in failed] == [(1, "unavailable")]
    assert failed[0].message == NO_GGUF.format(source="tiny-random-llama") and "\n" not in failed[0].message
    record = events[-1].record
    statuses = {c["name"]: (c["status"], c["reference"]) for c in record["columns"]}
    assert statuses == {"dynamic": ("ok", "dynamic"), "engine:llamacpp q4_0": ("error", "engine:llamacpp f16"),
                        "quantized quanto int4 r128": ("ok", "dynamic")}
    assert "engine_references" not in record  # no llama.cpp column passed its check: no llama.cpp reference


class FakeScorer:
    """Stands in for `kvlab.engines.llamacpp.LlamaCppScorer`: logits that depend on the cache type (f16: a fixed
    draw; any other type: that draw plus noise), bytes growing per token, and a record of closing."""

    opened: list = []
    fail_at: dict = {}

    def __init__(self, knobs, ids, context_tokens, vocab):
        self.knobs, self.steps, self.index, self.closed = knobs, len(ids) - context_tokens, 0, False
        self.base = torch.randn(vocab, generator=torch.Generator().manual_seed(1))
        self.noise = torch.Generator().manual_seed(2)
        FakeScorer.opened.append(self)

    def __iter__(self):
        return self

    def __next__(self):
        from kvlab.engines.llamacpp import EngineError, ScoreStep

        if self.index >= self.steps:
            raise StopIteration
        if self.index == self.fail_at.get(self.knobs["type_k"]):
            raise EngineError("llama.cpp failed to evaluate token 35: boom")
        logits = self.base + (0 if self.knobs["type_k"] == "f16" else torch.randn(self.base.shape,
                                                                                  generator=self.noise))
        self.index += 1
        return ScoreStep(self.index - 1, 0.01, 1000 * self.index, logits)

    def close(self):
        self.closed = True


@pytest.fixture
def fake_llamacpp(tiny, monkeypatch):
    FakeScorer.opened, FakeScorer.fail_at = [], {}
    vocab = tiny.model.config.vocab_size
    monkeypatch.setattr(LlamaCppEngine, "unavailable_reason", lambda self, loaded: None)
    monkeypatch.setattr(LlamaCppEngine, "score_text", lambda self, loaded, ids, context, stop, threads:
                        FakeScorer(self.engine_knobs(), ids, context, vocab))
    return FakeScorer


def test_engine_columns_are_scored_against_their_engines_own_reference(tiny, fake_llamacpp, tmp_path):
    columns = f"dynamic,{LLAMA_Q4},engine:llamacpp:type_k=q8_0:type_v=q8_0,engine:llamacpp,knorm:compression_ratio=0.5"
    events = list(run_report(tiny, _ids(), columns, scored_tokens=8, progress_every=4, warm_up=False))
    record = events[-1].record
    assert isinstance(events[-1], RunDone) and not [e for e in events if isinstance(e, ColumnFailed)]
    # one f16 reference for the three llama.cpp columns, stepped once per round; every context closed
    assert [s.knobs["type_k"] for s in fake_llamacpp.opened] == ["f16", "q4_0", "q8_0", "f16"]
    assert all(s.closed for s in fake_llamacpp.opened) and fake_llamacpp.opened[0].index == 8
    assert [row["name"] for row in record["engine_references"]] == ["engine:llamacpp f16"]
    assert record["engine_references"][0]["cache_bytes_end"] == 8000 and record["reference"]["name"] == "dynamic"
    references = {c["name"]: c["reference"] for c in record["columns"]}
    assert references == {"dynamic": "dynamic", "engine:llamacpp q4_0": "engine:llamacpp f16",
                          "engine:llamacpp q8_0": "engine:llamacpp f16", "engine:llamacpp f16": "engine:llamacpp f16",
                          "knorm 0.5": "dynamic"}
    figures = {c["name"]: c["figures"] for c in record["columns"]}
    assert figures["engine:llamacpp f16"]["kld_mean"] == 0.0 and figures["engine:llamacpp q4_0"]["kld_mean"] > 0
    assert figures["engine:llamacpp q4_0"]["bytes_vs_dense"] == 1.0  # against its reference's bytes
    progress = [e for e in events if isinstance(e, ReportProgress) and e.column == "engine:llamacpp q4_0"]
    assert [(e.scored, e.reference) for e in progress] == [(4, "engine:llamacpp f16"), (8, "engine:llamacpp f16")]
    # saved and read back: each row names its reference; the front is per (model, reference)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    rows = rows_from_record(load_record(path))
    assert [row["reference"] for row in rows] == list(references.values())
    assert pareto_marks(rows) == [True, False, False, True, True]
    text = format_table(rows)
    assert "engine:llamacpp q4_0 (vs engine:llamacpp f16)" in text and "knorm 0.5 (vs" not in text
    assert "| engine:llamacpp f16 (vs engine:llamacpp f16) |" in format_markdown(rows)


def test_a_stopped_or_abandoned_run_closes_every_engine_context(tiny, fake_llamacpp):
    events = run_report(tiny, _ids(), f"dynamic,{LLAMA_Q4}", scored_tokens=8, progress_every=2, warm_up=False)
    for event in events:
        if isinstance(event, ReportProgress):
            break
    events.close()
    assert len(fake_llamacpp.opened) == 2 and all(s.closed for s in fake_llamacpp.opened)


def test_an_engine_without_distributions_and_the_perplexity_view_refuse_engine_columns():
    server = report_columns("dynamic,engine:openai:base_url=http://127.0.0.1:8080/v1")[1]
    assert server.rejected == ("engine:openai gives no distributions to score, so the report cannot score it (it "
                               "streams text only)")
    assert report_columns(LLAMA_Q4)[0].strategy is not None
    assert report_columns(LLAMA_Q4, engines=False)[0].rejected.startswith("engine:llamacpp runs a serving engine")
    with pytest.raises(StrategyError, match="^engine:llamacpp runs a serving engine, not a transformers cache: "
                                            "this view streams kvlab's caches only$"):
        perplexity_columns(f"dynamic,{LLAMA_Q4}")


def test_a_failing_engine_reference_ends_its_columns_only(tiny, fake_llamacpp):
    fake_llamacpp.fail_at["f16"] = 3
    events = list(run_report(tiny, _ids(), f"dynamic,{LLAMA_Q4}", scored_tokens=8, warm_up=False))
    failed = [e for e in events if isinstance(e, ColumnFailed)]
    assert [(e.name, e.message) for e in failed] == [
        ("engine:llamacpp q4_0", "its reference engine:llamacpp f16 failed: llama.cpp failed to evaluate token 35: "
                                 "boom")]
    record = events[-1].record
    assert [(c["status"], c["split"]["scored_tokens"]) for c in record["columns"]] == [("ok", 8), ("error", 3)]
    assert record["reference"]["name"] == "dynamic" and record["engine_references"][0]["scored_tokens"] == 3
    assert all(s.closed for s in fake_llamacpp.opened)
