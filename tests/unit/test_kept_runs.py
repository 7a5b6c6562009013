"""Shared Compare results are kept where a restart finds them (`kvlab.ui.compare.kept_runs`): the folder (a
setting, a Space's persistent storage, the user cache), a 7-day expiry and a size cap the page states where
the link is shown, one line for a link whose result expired or was evicted, and a share per client (an
address) past which that client's own oldest go, so one client cannot evict every other's results. Files and
clocks only (the clock moved by hand); no model, no browser."""

import json
import os
import time
import types
from pathlib import Path

import gradio as gr
import pytest

from kvlab.models.loading import ModelPool
from kvlab.ui.compare import kept_runs
from kvlab.ui.compare.records import shared_exports, share_id, write_exports
from kvlab.ui.compare.tab import CompareTab
from kvlab.ui.shared.theme import share_html

pytestmark = pytest.mark.unit

DAY_S = 24 * 3600


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """KVLAB_RUNS_DIR set to a fresh folder; the keeping settings at their defaults."""
    folder = tmp_path / "runs"
    monkeypatch.setenv("KVLAB_RUNS_DIR", str(folder))
    monkeypatch.delenv("KVLAB_RUNS_KEEP_DAYS", raising=False)
    monkeypatch.delenv("KVLAB_RUNS_MAX_MB", raising=False)
    monkeypatch.delenv("KVLAB_RUNS_CLIENT_MB", raising=False)
    return folder


def write(size_bytes: int = 100, owner: str | None = None) -> list[str]:
    return write_exports({"format": "kvlab.compare", "padding": "x" * size_bytes}, [], owner)


def age(paths: list[str], days: float) -> None:
    """Make a written result `days` old."""
    folder = Path(paths[0]).parent
    then = time.time() - days * DAY_S
    os.utime(folder, (then, then))


def test_the_folder_is_the_setting_else_a_spaces_persistent_storage_else_the_users_data(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("KVLAB_RUNS_DIR", raising=False)
    storage = tmp_path / "data"
    monkeypatch.setattr(kept_runs, "SPACE_STORAGE", storage)
    assert kept_runs.runs_dir() == tmp_path / "share" / "kvlab" / "runs"
    monkeypatch.setenv("SPACE_ID", "someone/kvlab")
    assert kept_runs.runs_dir() == tmp_path / "share" / "kvlab" / "runs"  # persistent storage off: no /data
    storage.mkdir()
    assert kept_runs.runs_dir() == storage / "kvlab" / "runs"
    monkeypatch.setenv("KVLAB_RUNS_DIR", str(tmp_path / "mine"))
    assert kept_runs.runs_dir() == tmp_path / "mine"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("KVLAB_RUNS_DIR")
    monkeypatch.delenv("SPACE_ID")
    assert kept_runs.runs_dir() == Path.home() / ".local" / "share" / "kvlab" / "runs"


@pytest.mark.parametrize("env,value", [("KVLAB_RUNS_KEEP_DAYS", "0"), ("KVLAB_RUNS_KEEP_DAYS", "a week"),
                                       ("KVLAB_RUNS_MAX_MB", "-5"), ("KVLAB_RUNS_MAX_MB", "1.5"),
                                       ("KVLAB_RUNS_CLIENT_MB", "0"), ("KVLAB_RUNS_CLIENT_MB", "lots")])
def test_a_bad_setting_is_one_line_naming_it(runs, monkeypatch, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=f"^{env} must be a whole number >= 1, got '{value}'$"):
        kept_runs.check_settings()


def test_a_runs_folder_that_cannot_be_written_is_refused_at_start(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVLAB_RUNS_DIR", str(blocker / "runs"))
    with pytest.raises(ValueError, match="KVLAB_RUNS_DIR must be a folder the app can write"):
        kept_runs.check_settings()


def test_the_page_states_the_rule_where_the_link_is_shown(runs, monkeypatch):
    assert kept_runs.policy_text() == "kept on this server for 7 days; past 512 MiB of kept runs, the oldest go first"
    monkeypatch.setenv("KVLAB_RUNS_KEEP_DAYS", "1")
    monkeypatch.setenv("KVLAB_RUNS_MAX_MB", "2048")
    link = share_html("run-" + "0" * 32, kept_runs.policy_text())
    assert "(copy it to share; kept on this server for 1 day; past 2,048 MiB of kept runs, the oldest go first)" in link


def test_a_result_is_found_again_by_a_new_process_until_it_expires(runs):
    paths = write()
    run_id = share_id(paths)
    assert Path(paths[0]).parent.parent == runs and runs.stat().st_mode & 0o077 == 0
    assert shared_exports(run_id) == paths  # nothing in memory: what a restarted app reads
    age(paths, 6.9)
    assert shared_exports(run_id) == paths
    age(paths, 7.1)
    assert shared_exports(run_id) is None and not Path(paths[0]).parent.exists()


def test_writing_removes_the_expired_then_the_oldest_past_the_cap_never_the_newest(runs, monkeypatch):
    monkeypatch.setenv("KVLAB_RUNS_MAX_MB", "1")
    expired, old, middle = write(), write(300_000), write(300_000)
    age(expired, 8)
    age(old, 2)
    age(middle, 1)
    newest = write(600_000)  # 1.2 MB with the two: over the 1 MiB cap, so the oldest goes
    kept = {share_id(p) for p in (expired, old, middle, newest) if shared_exports(share_id(p))}
    assert kept == {share_id(middle), share_id(newest)}
    alone = write(2_000_000)  # larger than the cap by itself: kept, every other one goes
    assert [share_id(p) for p in (middle, newest, alone) if shared_exports(share_id(p))] == [share_id(alone)]


def test_the_record_is_the_same_file_the_run_wrote(runs):
    paths = write()
    assert json.loads(Path(shared_exports(share_id(paths))[0]).read_text())["format"] == "kvlab.compare"


def test_an_expired_or_evicted_link_gets_one_line_with_the_rule(runs):
    with gr.Blocks():
        tab = CompareTab(ModelPool(), preload=False).build()
    paths = write()
    age(paths, 30)
    request = type("Request", (), {"query_params": {"run": share_id(paths)}})()
    status = tab.open_shared({}, request)[tab.run_status]
    assert "this shared result is not kept on this server any more" in status
    assert "kept on this server for 7 days; past 512 MiB of kept runs, the oldest go first" in status
    assert status.count("\n") == 0 and share_id(paths) not in status


def test_one_client_past_its_share_loses_its_own_oldest_never_another_clients(runs, monkeypatch):
    monkeypatch.setenv("KVLAB_RUNS_MAX_MB", "2")
    monkeypatch.setenv("KVLAB_RUNS_CLIENT_MB", "1")
    theirs = write(300_000, owner="10.0.0.1")
    age(theirs, 1)  # the oldest of all: the first to go if one client's flood could evict it
    mine = []
    for n in range(12):  # 3.6 MB from one address: past its 1 MiB share and the 2 MiB cap of all
        mine.append(write(300_000, owner="10.0.0.9"))
        age(mine[-1], (12 - n) / 1000)
    assert shared_exports(share_id(theirs)) == theirs
    kept = [share_id(p) for p in mine if shared_exports(share_id(p))]
    assert kept == [share_id(p) for p in mine[-3:]]  # 0.9 MB: its newest, within its share
    tags = {(Path(p[0]).parent / kept_runs.OWNER_FILE).read_text() for p in (theirs, mine[-1])}
    assert tags == {kept_runs.owner_tag("10.0.0.1"), kept_runs.owner_tag("10.0.0.9")}
    assert not any("10.0.0" in path.read_text(errors="replace") for path in runs.rglob(kept_runs.OWNER_FILE))


def test_a_replayed_upload_is_kept_for_the_uploaders_address(runs, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("KVLAB_PROXY_HOPS", raising=False)
    with gr.Blocks():
        tab = CompareTab(ModelPool(), preload=False).build()
    record = Path(__file__).parent.parent / "fixtures" / "record_v3_compare.json"
    request = types.SimpleNamespace(headers={}, client=types.SimpleNamespace(host="10.0.0.9"), session_hash="s1")
    exports = tab.replay(str(record), {}, request)[tab.exports]
    owner = Path(exports[0]).parent / kept_runs.OWNER_FILE
    assert owner.read_text() == kept_runs.owner_tag("10.0.0.9")
