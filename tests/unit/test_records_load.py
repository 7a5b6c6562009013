"""Every record format kvlab has written still loads through the one reader (`kvlab.record`), in today's layout.

The files: the shipped leaderboards (`records/*.json`, `records/smoke/*.json`: report version 1, before the
envelope carried `measured_at` and `environment`; `records/engines/*.json`: version 1 with engine columns, each
column's `reference` and `engine_references`); tests/fixtures/record_v1_compare.json (`kvlab compare
--json` from the kvlab before records were versioned: no format key at all), record_v2_quickstart.json
(`format_version` 2, flat timing fields), record_v3_compare.json (`format_version` 3) and record_v1_needle.json
(`kvlab needle --json`, version 1, before the envelope); a version-4 Compare record written now; and a share
link's files as the page's export leaves them.
"""

import json
from pathlib import Path

import pytest
import torch

from kvlab.compare.record import VERSION
from kvlab.compare.replay import load_record as replay
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings
from kvlab.needle.record import load_record as load_needle
from kvlab.compare.preset import parse_preset
from kvlab.quality.record import REPORT, load_record, rows_from_record
from kvlab.record import RecordError, check_record

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHIPPED = [path for folder in ("", "smoke", "engines") for path in sorted((ROOT / "records" / folder).glob("*.json"))]
COMPARE_FILES = {1: "record_v1_compare.json", 2: "record_v2_quickstart.json", 3: "record_v3_compare.json"}


def test_the_shipped_records_are_there():
    assert len(SHIPPED) == 6 and all(json.loads(path.read_text())["kind"] == "kvlab.report" for path in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shipped_report_loads_into_its_table(path):
    saved = json.loads(path.read_text())
    record = load_record(path)
    assert record["kind"] == "kvlab.report" and record["version"] == 1 and record["command"] == saved["command"]
    rows = rows_from_record(record, path.name)
    assert [row["column"] for row in rows] == [column["name"] for column in saved["columns"]]
    assert [row["reference"] for row in rows] == [column.get("reference", saved["reference"]["name"])
                                                  for column in saved["columns"]]
    assert rows[0]["model"] == saved["model"]["name"] and all(row["protocol"] == "report" for row in rows)


@pytest.mark.parametrize("version", sorted(COMPARE_FILES))
def test_every_older_compare_record_replays_in_the_current_layout(version):
    path = FIXTURES / COMPARE_FILES[version]
    saved = json.loads(path.read_text())
    assert saved.get("format_version") == (version if version > 1 else None) and "kind" not in saved
    replayed = replay(path)
    assert replayed.record["kind"] == "kvlab.compare" and replayed.record["version"] == VERSION
    assert "format" not in replayed.record and "format_version" not in replayed.record
    assert [r.name for r in replayed.done.results] == [c["name"] for c in saved["columns"]]
    assert [r.text for r in replayed.done.results] == [c["text"] for c in saved["columns"]]
    assert all(r.timing.policy in ("live", "quiet") for r in replayed.done.results)
    assert rows_from_record(load_record(path))[0]["protocol"] == "compare"


def test_the_version_1_needle_record_loads_with_its_cells():
    path = FIXTURES / "record_v1_needle.json"
    saved = json.loads(path.read_text())
    record, cells = load_needle(path)
    assert record["kind"] == "kvlab.needle" and record["version"] == 1 and "environment" not in saved
    assert [c.prompt_ids for c in cells] == [c["prompt_ids"] for c in saved["cells"]]
    assert record["model"]["hub_id"] == saved["model"]["hub_id"]
    assert [row["protocol"] for row in rows_from_record(load_record(path))] == ["needle"] * len(saved["columns"])


@pytest.fixture(scope="module")
def written(tiny):
    preset = parse_preset({"name": "t", "prompt": {"text": "hi"}, "columns": [{"strategy": "dynamic"}]})
    settings = GenerationSettings(max_new_tokens=3, stop_at_eos=False, fidelity=False)
    done = collect(run_compare(tiny, torch.tensor([[1, 400, 401]]), [{"strategy": "dynamic"}], settings,
                               preset=preset))
    return json.loads(json.dumps(done.record))


def test_a_record_written_now_is_in_the_envelope_and_reads_back_unchanged(written):
    assert written["kind"] == "kvlab.compare" and written["version"] == VERSION
    assert {"measured_at", "environment", "model", "columns", "wall_s", "stopped"} <= set(written)
    assert replay(json.dumps(written).encode()).record == written


def test_a_share_links_files_replay(written, monkeypatch, tmp_path):
    from kvlab.ui.compare import records
    from kvlab.ui.shared import exports

    monkeypatch.setattr(exports, "EXPORTS_DIR", tmp_path)
    monkeypatch.setenv("KVLAB_RUNS_DIR", str(tmp_path / "runs"))
    page = {**written, "slots": [3], "memory": {"elapsed_s": [0.5], "rss_bytes": [1], "cuda_allocated_bytes": [0]}}
    paths = records.write_exports(page, [])
    shared = records.shared_exports(records.share_id(paths))
    assert shared == paths and replay(shared[0]).record == page


def test_a_record_of_another_kind_is_refused_by_name():
    with pytest.raises(RecordError, match=r"^not a kvlab Compare run record \(kind 'kvlab.needle'; expected "):
        replay(FIXTURES.joinpath("record_v1_needle.json").read_bytes())
    with pytest.raises(RecordError, match=r"^not a report record \(no kind; expected kvlab.report\)$"):
        check_record({"columns": []}, (REPORT,))
