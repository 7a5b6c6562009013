"""Run records: serving-style latency figures, the versioned record with its environment, and replaying it."""

import json
from pathlib import Path

import pytest
import torch

from kvlab.cli import main
from kvlab.compare.events import ColumnResult, latency_summary_ms, percentile
from kvlab.compare.replay import RecordError, load_record
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.compare.record import VERSION
from kvlab.compare.summary import SUMMARY_COLUMNS, rows_to_csv, summary_rows
from kvlab.generation import GenerationSettings
from kvlab.measure import ColumnTiming
from kvlab.compare.preset import parse_preset

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_itl_percentiles_and_end_to_end_latency_follow_the_serving_benchmarks():
    result = ColumnResult(index=0, name="x", strategy="dynamic", knobs={},
                          per_token_s=[0.5] + [0.010, 0.020, 0.030, 0.040, 0.100])
    result.finish_decode_stats()
    assert result.itl_ms_mean == pytest.approx(40.0) and result.itl_ms_p50 == pytest.approx(30.0)
    assert result.itl_ms_p90 == pytest.approx(76.0) and result.itl_ms_p99 == pytest.approx(97.6)
    assert result.e2e_latency_s == pytest.approx(0.7) and result.decode_tok_s == pytest.approx(5 / 0.2)
    assert percentile([7.0], 99) == 7.0 and latency_summary_ms([]) == {}
    lonely = ColumnResult(index=0, name="x", strategy="dynamic", knobs={}, per_token_s=[0.5])
    lonely.finish_decode_stats()
    assert lonely.itl_ms_p50 is None and lonely.e2e_latency_s == 0.5


@pytest.fixture(scope="module")
def record(tiny):
    preset = parse_preset({"name": "t", "prompt": {"text": "hi"}, "columns": [{"strategy": "dynamic"}]})
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False)
    done = collect(run_compare(tiny, torch.tensor([[1, 400, 401]]),
                               [{"strategy": "dynamic"}, {"strategy": "quantized", "residual_length": 2},
                                {"strategy": "sliding_window"}], settings, preset=preset))
    return done.record


def test_a_record_says_its_kind_and_where_it_was_measured(record):
    assert record["kind"] == "kvlab.compare" and record["version"] == VERSION == 4
    assert "format" not in record and "format_version" not in record
    env = record["environment"]
    for key in ("kvlab", "kvlab_commit", "torch", "transformers", "gradio", "python", "cpu", "cores_available",
                "torch_threads", "dtype", "device", "gpu"):
        assert key in env
    assert env["dtype"] == "float32" and env["device"] == "cpu" and record["measured_at"].endswith("+00:00")
    column = record["columns"][0]
    assert column["itl_ms_p50"] > 0 and column["e2e_latency_s"] > 0


def test_every_front_s_record_keeps_the_run_s_memory_samples(record):
    """The run itself keeps its process memory samples, so a CLI or API record replays with the memory plot a
    page run shows (they were the page's alone)."""
    memory = record["memory"]
    count = len(memory["elapsed_s"])
    assert count >= 1 and len(memory["rss_bytes"]) == len(memory["cuda_allocated_bytes"]) == count
    assert memory["elapsed_s"] == sorted(memory["elapsed_s"]) and memory["elapsed_s"][-1] <= record["wall_s"]
    assert all(rss > 10 * 2**20 for rss in memory["rss_bytes"])  # a process with torch loaded holds more than 10 MiB


def test_a_record_replays_into_the_same_summary(record, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    replayed = load_record(path)
    original = summary_rows([ColumnResult(**{k: v for k, v in c.items() if k in ColumnResult.__dataclass_fields__
                                             and k != "timing"}, timing=ColumnTiming(**c["timing"]))
                             for c in record["columns"]])
    assert summary_rows(replayed.done.results) == original
    assert rows_to_csv(summary_rows(replayed.done.results)).splitlines()[0] == ",".join(SUMMARY_COLUMNS)
    assert replayed.label.startswith("replayed: measured on ") and record["measured_at"] in replayed.label
    assert [r.status for r in replayed.done.results] == ["ok", "ok", "unavailable"]


@pytest.mark.parametrize("content, message", [
    (b"not json", "not a JSON file"),
    (b"[1, 2]", "the JSON is not an object"),
    (json.dumps({"format": "other-tool", "format_version": 1}).encode(), "not a kvlab Compare run record"),
    (json.dumps({"model": {}, "columns": [{}]}).encode(), "column 1 of the record is incomplete"),
    (json.dumps({"format": "kvlab.compare", "format_version": 99, "columns": [{}]}).encode(),
     "format_version 99 cannot be read by this kvlab, which reads versions 1, 2, 3 and 4"),
    (json.dumps({"kind": "kvlab.compare", "version": 99, "columns": [{}]}).encode(),
     "Compare record version 99 cannot be read by this kvlab"),
    (json.dumps({"kind": "kvlab.compare", "version": VERSION, "columns": []}).encode(), "no columns"),
    (json.dumps({"format": "kvlab.compare", "format_version": 3, "columns": [{"name": "x"}]}).encode(),
     "column 1 of the record is incomplete"),
])
def test_old_or_foreign_files_get_a_clear_message(content, message):
    with pytest.raises(RecordError, match=message):
        load_record(content)


def test_the_cli_replays_a_record_and_refuses_what_it_cannot(record, tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(record))
    assert main(["compare", "--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("replayed: measured on ") and "ITL p50 (ms)" in out and "quantized quanto" in out
    assert main(["compare", "--replay", str(path), "--prompt", "x"]) == 2
    assert "--replay shows a recorded run and takes no --prompt" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert main(["compare", "--replay", str(tmp_path / "bad.json")]) == 2
    assert "not a JSON file" in capsys.readouterr().err


def test_a_version_2_record_made_by_an_older_kvlab_still_replays_with_its_timing_nested():
    """tests/fixtures/record_v2_quickstart.json: `python -m kvlab compare --preset quickstart --max-new-tokens 4
    --json ...` from the kvlab that wrote format_version 2 (flat live_*/quiet_* fields, quiet re-timing)."""
    path = FIXTURES / "record_v2_quickstart.json"
    old = json.loads(path.read_text())
    assert old["format_version"] == 2 and "live_decode_tok_s" in old["columns"][1]
    replayed = load_record(path)
    assert replayed.record["version"] == VERSION and replayed.record["timing"]["policy"] == "quiet"
    assert "format_version" not in replayed.record
    assert "settle_s" not in replayed.record["timing"] and "retimed" not in replayed.record["timing"]
    assert GenerationSettings(**replayed.record["settings"]).timing_policy == "quiet"  # was `retime: true`
    by_name = {r.name: r for r in replayed.done.results}
    dynamic, flat = by_name["dynamic"], next(c for c in old["columns"] if c["name"] == "dynamic")
    assert dynamic.timing.policy == "quiet" and dynamic.decode_tok_s == flat["decode_tok_s"]
    assert dynamic.timing.live["decode_tok_s"] == flat["live_decode_tok_s"]
    assert dynamic.timing.live["ttft_s"] == flat["live_ttft_s"]
    assert dynamic.timing.noise == flat["timing_noise"] and dynamic.timing.warm_up_s == flat["warm_up_s"]
    assert dynamic.timing.ttft_samples_s == flat["ttft_samples_s"]
    assert dynamic.timing.per_token_s == flat["quiet_per_token_s"]
    rows = summary_rows(replayed.done.results)
    assert [row["status"] for row in rows] == [c["status"] for c in old["columns"]]
    assert rows[1]["timing"] == "quiet" and rows[1]["noise"] == flat["timing_noise"]
    unavailable = by_name["offloaded"]
    assert unavailable.timing.policy == "live" and unavailable.timing.live == {}
