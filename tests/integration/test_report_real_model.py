"""The quality report on the bundled SmolLM2: dense against itself exactly 0, static within 1e-6, the plain
transformers snippet of docs/report.md reproduces the report's mean KL for quanto int4 to 1e-4, and a re-run
of the stored smoke leaderboard reproduces its figures (the command line on the real model: tests/slow)."""

import json
import re
from pathlib import Path

import pytest

from kvlab.quality.defaults import shipped_text
from kvlab.protocol import RunDone
from kvlab.quality.report import run_report

DOC = Path(__file__).resolve().parents[2] / "docs" / "report.md"
QUANTO_INT4 = "quantized quanto int4 r128"


def _snippet() -> dict:
    """The docs' plain-transformers block, executed (not as __main__): its `teacher_forced_kl`."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    code = next(block for block in blocks if "def teacher_forced_kl" in block)
    namespace = {"__name__": "docs_report_snippet"}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


def _figures(record, name):
    return next(c for c in record["columns"] if c["name"] == name)["figures"]


@pytest.fixture(scope="module")
def small_report(bundled):
    """200 tokens of the shipped text: 150 context, 50 scored; dynamic, static and quanto int4."""
    ids = bundled.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :200]
    events = list(run_report(bundled, ids, "dynamic,static,quantized:backend=quanto:nbits=4", scored_tokens=50))
    assert isinstance(events[-1], RunDone)
    return ids, events[-1].record


def test_dense_is_exactly_zero_and_static_within_1e_6_on_the_real_model(small_report):
    _, record = small_report
    dense, static = _figures(record, "dynamic"), _figures(record, "static")
    assert dense["ppl_diff"] == 0.0 and dense["kld_mean"] == 0.0 and dense["kld_max"] == 0.0
    assert abs(static["ppl_diff"]) <= 1e-6 and static["kld_max"] <= 1e-6
    assert record["split"] == {"context_tokens": 150, "scored_tokens": 50}
    quanto = _figures(record, QUANTO_INT4)
    assert quanto["kld_mean"] > 1e-4 and quanto["bytes_vs_dense"] < 1


def test_the_docs_plain_transformers_snippet_reproduces_the_mean_kl_of_quanto_int4(small_report, bundled):
    ids, record = small_report
    mean_kl = _snippet()["teacher_forced_kl"](bundled.model, ids, 150)
    assert mean_kl == pytest.approx(_figures(record, QUANTO_INT4)["kld_mean"], abs=1e-4)


SMOKE = Path(__file__).resolve().parents[2] / "records" / "smoke" / "smollm2.json"
REPRODUCE_TOLERANCE = {"kld_mean": 1e-4, "ln_ppl_ratio": 1e-4, "same_top": 0.0}
"""How close a re-run must come to the stored leaderboard figures: KL and ln PPL ratio within 1e-4 nats (float
rounding across machines and thread counts), top-1 agreement and cache bytes exactly."""


def test_a_rerun_reproduces_the_stored_leaderboard_figures(bundled):
    from kvlab.quality.leaderboard import leaderboard_for

    stored = json.loads(SMOKE.read_text())
    subset = [c for c in stored["columns"] if c["spec"]["strategy"] in ("quantized", "knorm")]
    columns = ",".join(":".join([c["spec"]["strategy"], *(f"{k}={v}" for k, v in c["spec"].items()
                                                           if k != "strategy")]) for c in subset)
    split = stored["split"]
    record = leaderboard_for(bundled, columns, scored_tokens=split["scored_tokens"],
                             context_tokens=split["context_tokens"], max_tokens=stored["text"]["tokens"])
    for old, new in zip(subset, record["columns"]):
        assert new["name"] == old["name"] and new["status"] == "ok"
        for field, tolerance in REPRODUCE_TOLERANCE.items():
            assert new["figures"][field] == pytest.approx(old["figures"][field], abs=tolerance), (old["name"], field)
        assert new["figures"]["cache_bytes_end"] == old["figures"]["cache_bytes_end"]
