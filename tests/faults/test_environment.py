"""Fault catalogue: faults in the environment at start-up (folders, permissions). Each case is an input and the
observable right behaviour: one line naming what is wrong and the setting that fixes it, never a traceback."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvlab.models.loading import ModelLoadError, fallback_cache_dir, write_problem, writable_cache_dir

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def blocked_folder(tmp_path: Path) -> Path:
    """A folder path that cannot be created by anyone, root included: its parent is a regular file."""
    (tmp_path / "a-file").write_text("not a folder")
    return tmp_path / "a-file" / "cache"


def test_a_set_cache_folder_that_cannot_be_written_is_named_with_its_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(blocked_folder(tmp_path)))
    notes = []
    with pytest.raises(ModelLoadError, match=r"cannot write the model cache folder .*a-file/cache \(Not a directory\); "
                                             r"set KVLAB_CACHE_DIR to a writable folder"):
        writable_cache_dir(lambda fraction, message: notes.append(message))
    assert notes == []


def test_an_unwritable_home_falls_back_to_a_temporary_folder_and_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("KVLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(blocked_folder(tmp_path)))
    notes = []
    assert writable_cache_dir(lambda fraction, message: notes.append(message)) == fallback_cache_dir()
    assert len(notes) == 1 and "cannot be written (Not a directory)" in notes[0] and "KVLAB_CACHE_DIR" in notes[0]
    assert write_problem(fallback_cache_dir()) is None


@pytest.mark.parametrize("command", [
    ["compare", "--prompt", "Say hi", "--strategies", "dynamic"],
    ["chat", "--turns", "presets/chat_turns.yaml"],
    ["prefix", "--prefix", "presets/prefix_document.txt", "--prompts", "presets/prefix_prompts.yaml"],
    ["perplexity", "--max-tokens", "16"],
])
def test_every_cli_command_says_which_folder_in_one_line(tmp_path, command):
    env = {**os.environ, "KVLAB_CACHE_DIR": str(blocked_folder(tmp_path)), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kvlab", *command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kvlab ")]
    assert len(lines) == 1 and "cannot write the model cache folder" in lines[0] and "KVLAB_CACHE_DIR" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to run as another user")
def test_a_non_root_user_with_a_read_only_home_gets_a_working_run():
    base = Path(tempfile.mkdtemp(prefix="kvlab-readonly-home-"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir(mode=0o555)
    env = {key: value for key, value in os.environ.items() if key != "KVLAB_CACHE_DIR"}
    scratch = base / "tmp"
    scratch.mkdir(mode=0o777)
    scratch.chmod(0o777)
    env.update(HOME=str(home), PYTHONPATH=str(REPO), TMPDIR=str(scratch))
    try:
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "kvlab", "compare", "--prompt", "Say hi", "--strategies", "dynamic",
                               "--max-new-tokens", "2", "--no-fidelity"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cannot be written (Permission denied): converting into" in proc.stderr
    assert " ok " in proc.stdout
