"""Kept results live outside the temporary folder (~/.local/share/kvlab/runs, a Space's /data), which gradio
refuses to take a file from ("Cannot move ... to the gradio cache dir"): the page is offered copies under the
temporary folder, and the kept files stay where they are."""

import os
import tempfile
from pathlib import Path

import pytest

from kvlab.ui.shared import exports

pytestmark = pytest.mark.unit


def test_kept_files_outside_the_temporary_folder_are_offered_as_copies_under_it(tmp_path, monkeypatch):
    home = Path(os.environ.get("HOME", "/root")) / ".cache" / "kvlab-test-offer"  # outside the temporary folder
    home.mkdir(parents=True, exist_ok=True)
    try:
        kept = home / "run-0123"
        kept.mkdir(exist_ok=True)
        (kept / "kvlab-run.json").write_text('{"a": 1}')
        (kept / "kvlab-summary.csv").write_text("a\n1\n")
        paths = [str(kept / "kvlab-run.json"), str(kept / "kvlab-summary.csv")]
        monkeypatch.setattr(exports, "EXPORTS_DIR", tmp_path / "exports")
        offered = exports.offered_copies(paths)
        temporary = Path(tempfile.gettempdir()).resolve()
        assert [Path(p).name for p in offered] == ["kvlab-run.json", "kvlab-summary.csv"]
        assert all(Path(p).resolve().is_relative_to(temporary) for p in offered)
        assert Path(offered[0]).read_text() == '{"a": 1}' and Path(paths[0]).exists()
    finally:
        import shutil
        shutil.rmtree(home, ignore_errors=True)


def test_files_already_under_the_temporary_folder_are_offered_as_they_are(tmp_path):
    path = tmp_path / "kvlab-run.json"
    path.write_text("{}")
    if not path.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
        pytest.skip("pytest's tmp_path is not under the temporary folder here")
    assert exports.offered_copies([str(path)]) == [str(path)]
