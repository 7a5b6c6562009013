"""`engine:llamacpp` in the quality report on the bundled SmolLM2's own GGUF: 64 context + 32 scored tokens of
the shipped text, q8_0 scored against llama.cpp's own f16 run (the row says so, its figures are finite, its
bytes are llama.cpp's), beside kvlab's dense reference; skipped with its reason where `llama_cpp` is not
importable. The ≥ 1,024-token agreement run is tests/slow/test_report_engines_agreement.py."""

import importlib.util
import math

import pytest

from kvlab.protocol import RunDone
from kvlab.quality.defaults import shipped_text
from kvlab.quality.record import rows_from_record
from kvlab.quality.report import run_report
from kvlab.quality.table import format_table

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="llama_cpp (llama-cpp-python) is not importable here: an engine:llamacpp "
                                        "report column needs it")]

Q8 = "engine:llamacpp q8_0"


def test_a_llamacpp_q8_0_row_is_scored_against_llamacpps_own_f16_run(bundled):
    ids = bundled.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :96]
    events = list(run_report(bundled, ids, "engine:llamacpp:type_k=q8_0:type_v=q8_0", scored_tokens=32,
                             context_tokens=64, warm_up=False))
    assert isinstance(events[-1], RunDone)
    record = events[-1].record
    column = next(c for c in record["columns"] if c["name"] == Q8)
    assert column["status"] == "ok" and column["reference"] == "engine:llamacpp f16"
    figures = column["figures"]
    assert figures["scored_tokens"] == 32 and all(math.isfinite(figures[key]) for key in (
        "ppl", "ppl_base", "ppl_ratio", "kld_mean", "kld_max", "same_top", "cache_bytes_mean"))
    assert 0 <= figures["kld_mean"] < 0.1 and figures["same_top"] >= 0.8
    # llama.cpp's own bytes: 30 layers x 3 KV heads x 64 values, q8_0 (34 bytes per 32 values), K and V, per cell
    (reference,) = record["engine_references"]
    assert reference["name"] == "engine:llamacpp f16" and reference["scored_tokens"] == 32
    assert figures["cache_bytes_end"] < reference["cache_bytes_end"] < record["reference"]["cache_bytes_end"]
    assert 0.5 < figures["bytes_vs_dense"] < 0.6  # 34/64 of f16's K/V rows, plus the cells' own bytes
    assert f"{Q8} (vs engine:llamacpp f16)" in format_table(rows_from_record(record))
