"""Share ids and export folders on a public Space: an export folder's name (and so a share id) is a 128-bit
token from `secrets`, the folder readable by its owner only; a share id is checked against the exact form kvlab
makes before any file is touched, so `..`, slashes, other folders' names or another visitor's PNG or report
export never reach a path, and the page says so in one line without echoing the id."""

import re
import stat
from pathlib import Path

import gradio as gr
import pytest

from kvlab.models.loading import ModelPool
from kvlab.ui.compare import records
from kvlab.ui.compare.records import EXPORT_NAMES, shared_exports, write_exports
from kvlab.ui.compare.tab import CompareTab
from kvlab.ui.shared import exports
from kvlab.ui.shared.exports import EXPORTS_DIR, fresh_export_folder

HOSTILE_IDS = ["../../etc", "run-../../etc/passwd", "run-", "run-abc", "run-nosuch", "run-" + "0" * 31,
               "run-" + "0" * 33, "run-" + "A" * 32, "run-" + "g" * 32, "run-" + "0" * 32 + "/kvlab-run.json",
               "/tmp/kvlab-exports/run-" + "0" * 32, "png-" + "0" * 32, "report-" + "0" * 32, "run-%2e%2e",
               "run-" + "0" * 32 + "\n", "", None, ["run-" + "0" * 32], 12]


def test_export_folders_are_unguessable_and_private(monkeypatch, tmp_path):
    monkeypatch.setattr(exports, "EXPORTS_DIR", tmp_path)
    names = {fresh_export_folder("run-").name for _ in range(50)}
    assert len(names) == 50 and all(re.fullmatch(r"run-[0-9a-f]{32}", name) for name in names)
    folder = fresh_export_folder("png-")
    assert re.fullmatch(r"png-[0-9a-f]{32}", folder.name) and stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_share_id_is_checked_before_any_file_is_touched(monkeypatch):
    touched = []
    monkeypatch.setattr(Path, "is_file", lambda self: touched.append(self) or False)
    monkeypatch.setattr(Path, "is_dir", lambda self: touched.append(self) or False)
    monkeypatch.setattr(Path, "exists", lambda self: touched.append(self) or False)
    for run_id in HOSTILE_IDS:
        assert not records.valid_share_id(run_id) and shared_exports(run_id) is None
    assert touched == []
    assert records.valid_share_id("run-" + "0123456789abcdef" * 2) and shared_exports("run-" + "0" * 32) is None
    assert touched  # a well-formed id is looked up (and not found)


def test_a_written_result_is_found_by_its_own_share_id_only(monkeypatch, tmp_path):
    monkeypatch.setattr(exports, "EXPORTS_DIR", tmp_path)
    monkeypatch.setenv("KVLAB_RUNS_DIR", str(tmp_path))
    paths = write_exports({"format": "kvlab.compare"}, [])
    run_id = Path(paths[0]).parent.name
    assert records.valid_share_id(run_id) and shared_exports(run_id) == paths
    assert [Path(p).name for p in paths] == list(EXPORT_NAMES)
    assert stat.S_IMODE(Path(paths[0]).parent.stat().st_mode) == 0o700
    png = fresh_export_folder("png-")
    for name in EXPORT_NAMES:
        (png / name).write_text("{}")
    assert shared_exports(png.name) is None  # another kind of export folder is not a shared result
    assert shared_exports(run_id[:-1] + ("0" if run_id[-1] != "0" else "1")) is None


@pytest.fixture(scope="module")
def tab():
    with gr.Blocks():
        return CompareTab(ModelPool(), preload=False).build()


@pytest.mark.parametrize("run_id", [i for i in HOSTILE_IDS if isinstance(i, str) and i])
def test_the_page_refuses_a_malformed_share_link_in_one_line_without_echoing_it(run_id, tab):
    request = type("Request", (), {"query_params": {"run": run_id}})()
    status = tab.open_shared({}, request)[tab.run_status]
    assert "does not name a shared result" in status and status.count("\n") == 0
    assert run_id.strip() not in status


def test_the_exports_are_not_in_a_folder_gradio_serves():
    from gradio.utils import get_cache_folder, get_upload_folder, is_in_or_equal

    from kvlab.ui.compare.kept_runs import runs_dir

    for served in (get_cache_folder(), get_upload_folder()):
        for kept in (EXPORTS_DIR, runs_dir()):
            assert not is_in_or_equal(kept, served) and not is_in_or_equal(served, kept)
