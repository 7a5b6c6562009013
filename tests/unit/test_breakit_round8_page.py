"""Break-it round 8 (the page and faults): findings pinned without a browser or a running app.

- A runs folder (KVLAB_RUNS_DIR) that is full or read-only once the app serves: every finished Compare run on the
  page ended in "✖ the run failed: OSError: [Errno 28] No space left on device" (its result and downloads lost,
  an empty folder left behind), and a replayed record was called "not a kvlab run". Right: the result is offered
  for download all the same, and one line says it could not be kept for a share link, why, and the setting.
"""

import errno
import json
from pathlib import Path

import pytest

from kvlab.ui.compare import records
from kvlab.ui.compare.kept_runs import RUNS_DIR_ENV

pytestmark = pytest.mark.unit


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["write_atomic", "owner"])
def test_a_full_runs_folder_offers_the_result_and_says_why_it_has_no_link(tmp_path, monkeypatch, where):
    runs = tmp_path / "runs"
    monkeypatch.setenv(RUNS_DIR_ENV, str(runs))
    if where == "write_atomic":
        monkeypatch.setattr(records, "write_atomic", full_disk)
    else:  # the first write into the new folder, as it failed on a full filesystem
        write_text = Path.write_text
        monkeypatch.setattr(Path, "write_text", lambda path, *a, **k: full_disk() if path.is_relative_to(runs)
                            else write_text(path, *a, **k))
    exports, note = records.keep_exports({"kind": "compare"}, [{"column": "dynamic"}], owner="10.0.0.1")
    assert note is not None and "\n" not in note
    assert "No space left on device" in note and RUNS_DIR_ENV in note and "share link" in note
    assert str(runs) not in note  # no server path on the page
    assert [Path(path).name for path in exports] == list(records.EXPORT_NAMES)
    monkeypatch.undo()
    assert json.loads(Path(exports[0]).read_text()) == {"kind": "compare"}
    assert not any(runs.iterdir()) if runs.exists() else True  # no empty or half folder left behind


def test_a_writable_runs_folder_keeps_the_result_with_no_note(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    exports, note = records.keep_exports({"kind": "compare"}, [{"column": "dynamic"}], owner="10.0.0.1")
    assert note is None and Path(exports[0]).parent.parent == tmp_path / "runs"


def test_a_kept_run_another_app_removes_meanwhile_is_skipped_by_prune(tmp_path, monkeypatch):
    """Round 8, read from the code and fixed after: two apps on one runs folder, one pruning while the other
    removes a folder, made `prune`'s `stat()` raise FileNotFoundError at the end of a run."""
    from kvlab.ui.compare import kept_runs

    monkeypatch.setenv("KVLAB_RUNS_DIR", str(tmp_path))
    gone, kept = tmp_path / "kvlab-run-gone", tmp_path / "kvlab-run-kept"
    for folder in (gone, kept):
        folder.mkdir()
        (folder / "kvlab-run.json").write_text("{}")
    real_expired = kept_runs._expired

    def expired_while_another_app_removes(folder, now):
        answer = real_expired(folder, now)
        if folder == gone:
            import shutil

            shutil.rmtree(gone)  # the other app removes it between this check and the next stat()
        return answer

    monkeypatch.setattr(kept_runs, "_expired", expired_while_another_app_removes)
    assert kept_runs.prune("kvlab-run-", keep=kept) == []
    assert kept.is_dir() and not gone.exists()
