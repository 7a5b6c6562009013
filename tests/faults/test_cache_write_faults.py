"""Fault catalogue, unit level: disks that fail under kvlab's writes, simulated at the lowest level it reaches
(free space, `os.open`, `os.fsync`, the save step), and what killed writers leave behind. No real model.

- A cache folder too full for the converted copy is refused before the slow part, in one line naming the folder
  and KVLAB_CACHE_DIR; with the setting unset the per-user fallback folder takes the copy, said in one line.
- A disk that fills while the copy is saved (safetensors says so in a SafetensorError, without errno) is the same
  one line, and no staging folder is left.
- A read-only folder (EROFS) is one line naming it (today's behaviour too; kept as a guard).
- A failed write leaves the previous file whole and no temporary; staging folders whose writer is gone are
  removed, a live writer's are kept.
- A new start's ready file holds its own lines only; the SIGTERM handler stops kvlab's work and exits 143;
  once kvlab's compute is closed, no new work starts and every decoder stops before its next forward.
"""

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvlab import compute as compute_module
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.models import gguf_cache, readiness
from kvlab.models.gguf_cache import ModelLoadError, fallback_cache_dir, writable_cache_dir
from kvlab.models.loading import prepare_gguf_file
from kvlab.strategies import make_strategy

pytestmark = pytest.mark.unit
FULL_DISK_SAVE = "Error while serializing: I/O error: No space left on device (os error 28)"
"""What safetensors' SafetensorError said when the real tmpfs filled up during a conversion."""


@pytest.fixture(autouse=True)
def own_temporary_folder(tmp_path, monkeypatch):
    """The per-user fallback cache folder (under the temporary folder) is the test's own, not the machine's."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))


def small_gguf(path: Path) -> Path:
    """A complete GGUF file with one 4x4 float32 tensor."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def free_space(free_by_folder: dict):
    """A `shutil.disk_usage` whose free bytes come from the longest matching folder in `free_by_folder`."""
    import shutil

    real = shutil.disk_usage

    def usage(path):
        text = str(path)
        matches = [folder for folder in free_by_folder if text.startswith(str(folder))]
        if not matches:
            return real(path)
        total, used, _ = real(path)
        return type(real(path))(total, used, free_by_folder[max(matches, key=lambda f: len(str(f)))])
    return usage


def test_a_full_cache_folder_refuses_the_conversion_before_the_slow_part(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr("shutil.disk_usage", free_space({cache: 1 << 20}))
    with pytest.raises(ModelLoadError) as refused:
        prepare_gguf_file(small_gguf(tmp_path / "small.gguf"))
    message = str(refused.value)
    assert message == (f"cannot write the model cache folder {cache} (No space left on device: 1 MiB free, about "
                       f"16 MiB needed); set KVLAB_CACHE_DIR to a writable folder")
    assert not (cache / "models").exists() or not any((cache / "models").iterdir())


def test_an_unset_setting_falls_back_to_the_temporary_folder_when_home_is_full(tmp_path, monkeypatch):
    monkeypatch.delenv("KVLAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr("shutil.disk_usage", free_space({tmp_path / "home": 0, tmp_path / "tmp": 1 << 40}))
    notes = []
    folder = writable_cache_dir(lambda fraction, message: notes.append(message), needed_bytes=500 << 20)
    assert folder == fallback_cache_dir() and folder.is_relative_to(tmp_path / "tmp")
    assert len(notes) == 1 and "No space left on device: 0 MiB free, about 500 MiB needed" in notes[0]
    assert "KVLAB_CACHE_DIR" in notes[0]


def test_a_disk_that_fills_while_saving_is_one_line_and_leaves_no_staging(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(cache))

    def fills_up(gguf_path, staging, display_name, notify, expected_s):
        (staging / "model.safetensors").write_bytes(b"\0" * 1024)
        raise type("SafetensorError", (Exception,), {})(FULL_DISK_SAVE)

    monkeypatch.setattr(gguf_cache, "_write_converted", fills_up)
    with pytest.raises(ModelLoadError) as refused:
        prepare_gguf_file(small_gguf(tmp_path / "small.gguf"))
    assert str(refused.value) == (f"cannot write the model cache folder {cache} (No space left on device); "
                                  "set KVLAB_CACHE_DIR to a writable folder")
    assert list((cache / "models").iterdir()) == []


def test_a_read_only_cache_folder_is_one_line(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(cache))
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(cache)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ModelLoadError, match=r"^cannot write the model cache folder .*/cache \(Read-only file "
                                             r"system\); set KVLAB_CACHE_DIR to a writable folder$"):
        writable_cache_dir(lambda fraction, message: None)


def test_a_failed_write_leaves_the_previous_file_whole_and_no_temporary(tmp_path, monkeypatch):
    from kvlab.models.atomic import write_atomic

    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / "record.json"
    write_atomic(path, '{"complete": true}\n')

    def disk_full(handle):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, '{"complete": false, "and much more": "' + "x" * 100_000 + '"}\n')
    assert path.read_text() == '{"complete": true}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_what_killed_writers_left_is_removed_and_a_live_writers_folder_kept(tmp_path, monkeypatch):
    from kvlab.models.atomic import remove_stale_temps, staging_folder
    from kvlab.models.gguf_cache import remove_stale_conversions

    cache = tmp_path / "cache"
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(cache))
    live = staging_folder(cache / "models", "model-v1")
    killed = cache / "models" / "model-v1.tmp-killed"  # its writer's lock went with its process
    killed.mkdir()
    (killed / ".lock").touch()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    earlier = cache / "gguf" / f"model.tmp{int(ended.stdout)}"  # an earlier version's name, its process ended
    earlier.mkdir(parents=True)
    temporary = tmp_path / ".ready.jsonl.tmp-killed"
    temporary.write_text('{"sta')
    try:
        assert sorted(remove_stale_conversions()) == sorted([killed, earlier])
        assert live.path.is_dir()
        assert remove_stale_temps(tmp_path / "ready.jsonl") == [temporary] and not temporary.exists()
    finally:
        live.discard()


def test_a_new_start_replaces_an_earlier_starts_ready_lines(tmp_path, monkeypatch):
    path = tmp_path / "ready.jsonl"
    path.write_text('{"state": "ready", "name": "m", "load_s": 1.0, "message": "", "time": 1.0}\n{"state": "re')
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(path))
    monkeypatch.setattr(readiness, "_lines", {}, raising=False)  # this process wrote nothing yet
    assert readiness.announce("error", name="m", message="no room")
    assert [(a["state"], a["message"]) for a in readiness.read_announcements(path)] == [("error", "no room")]
    assert path.read_text().endswith("\n")


def test_sigterm_stops_kvlabs_work_and_exits_143_once(monkeypatch):
    from kvlab.ui.hosting import shutdown

    closed = []
    monkeypatch.setattr(shutdown, "close_compute", lambda: closed.append(True))
    handler = shutdown.SigtermExit(deadline_s=60.0)
    previous = signal.getsignal(signal.SIGTERM)
    assert handler.install()
    try:
        with pytest.raises(SystemExit) as ended:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert ended.value.code == shutdown.EXIT_TERMINATED == 143
        assert handler.terminating.is_set() and closed == [True]
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM while exiting changes nothing
        time.sleep(0.2)
        assert closed == [True]
    finally:
        handler.restore()
    assert signal.getsignal(signal.SIGTERM) == previous
    assert handler._watchdog is None  # cancelled: this test process is not ended 60 s from now


def test_once_compute_is_closed_no_work_starts_and_decoders_stop(tiny, monkeypatch):
    shut = threading.Event()
    shut.set()
    monkeypatch.setattr(compute_module, "_closed", shut, raising=False)
    ran = []
    with pytest.raises(compute_module.ComputeClosed, match="shutting down"):
        compute_module.compute(ran.append, 1)
    assert ran == []
    strategy = make_strategy({"strategy": "dynamic"})
    ids = tiny.tokenizer("Hello there", return_tensors="pt").input_ids
    decoder = Decoder(tiny, strategy, strategy.build_cache(tiny, ids.shape[1] + 4), ids,
                      GenerationSettings(max_new_tokens=4))
    assert list(decoder) == [] and decoder.stop_reason == "stopped"


def test_a_load_that_fails_the_same_way_again_is_logged_once(caplog):
    """The page's preload and the planner's warm-up start the bundled load again after it failed; a read-only cache
    folder fails it the same way each time, and the server log says so once."""
    from kvlab.models.loading import ModelSpec
    from kvlab.ui.shared.loader import BackgroundLoader

    class ReadOnlyCachePool:
        def get(self, spec, progress=None):
            raise ModelLoadError("cannot write the model cache folder /cache (Read-only file system); set "
                                 "KVLAB_CACHE_DIR to a writable folder")

        def loaded(self, spec):
            return None

    caplog.set_level("WARNING", logger="kvlab.ui.shared.loader")
    loader = BackgroundLoader(ReadOnlyCachePool())
    for _ in range(3):
        with pytest.raises(ModelLoadError):
            loader.get(ModelSpec())
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model load failed")]
    assert failures == ["model load failed: cannot write the model cache folder /cache (Read-only file system); "
                        "set KVLAB_CACHE_DIR to a writable folder"]
