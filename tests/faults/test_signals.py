"""Fault catalogue: signals a Space sends, on the real app (`python app.py`, the bundled model, `/compare` through
gradio_client). Where `unshare` is allowed the app runs as process 1 of its own PID namespace, as in the Space's
container.

- SIGTERM mid-run (a Space restart): the app ends within SIGTERM_EXIT_BOUND_S with exit status 143 and its two
  log lines, and leaves nothing half-written (no temporary file, every ready-file line and record complete).
- SIGKILL mid-run, then a restart on the same ready file and cache folder: what a killed start leaves (a
  conversion's staging folder, Gemma's assembly scratch, a ready file's temporary) is removed, the ready file
  holds the new start's line only, the model is ready and a Compare run completes.
- SIGKILL mid-conversion (slow: two cold conversions), then a restart: it removes the half conversion, converts
  again and serves a run. Run as a plain process (a workstation, a VM's service): earlier versions named the
  staging folder by pid, so in a container the restart, process 1 again, happened to clear it, while elsewhere
  every kill left a 517 MB folder behind for good.
- A half-assembled Gemma file, as a start killed mid-assembly left it under earlier versions, does not stop
  the next start from assembling it.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from kvlab.models import bundled
from kvlab.models.gguf_cache import check_gguf
from kvlab.models.loading import converted_bundled_folder, prepare_bundled_model
from kvlab.models.readiness import read_announcements

pytestmark = pytest.mark.integration
EXIT_TERMINATED = 128 + signal.SIGTERM
"""143: the status a shell reports for a process SIGTERM ended, which the app exits with after its clean shutdown."""
SIGTERM_EXIT_BOUND_S = 5.0
"""The issue's bound from SIGTERM to the end of the process (the app's own deadline is 4 s)."""
LONG_RUN_TOKENS = 128
"""A quickstart run this long is still going when the signal comes (minutes on 2 cores), and within the shared
Space's cap on one run's token steps (KVLAB_MAX_RUN_STEPS), which refuses a 512-token quickstart."""
SHORT = 4
RUN_START_TIMEOUT_S = 120


def start_long_run(client):
    """Submit a long quickstart `/compare` run and return its job once the app runs it (plus a second, so its
    torch work is under way)."""
    from gradio_client.utils import Status

    job = client.submit("quickstart", None, LONG_RUN_TOKENS, api_name="/compare")
    deadline = time.monotonic() + RUN_START_TIMEOUT_S
    while job.status().code != Status.PROCESSING:
        assert time.monotonic() < deadline and not job.done(), \
            f"the run did not start: {job.status()} {job.exception() if job.done() else ''}"
        time.sleep(0.1)
    time.sleep(1.0)
    return job


def assert_nothing_half_written(app) -> None:
    """No temporary file left in the app's folders, the ready file whole lines of JSON, every record complete."""
    temporaries = [str(path) for path in app.folder.rglob("*") if ".tmp-" in path.name]
    assert not temporaries, f"temporaries left behind: {temporaries}"
    text = app.ready_file.read_text() if app.ready_file.exists() else ""
    assert not text or text.endswith("\n"), text[-200:]
    for line in text.splitlines():
        json.loads(line)
    for record in (app.folder / "tmp").rglob("kvlab-run.json"):
        json.loads(record.read_text())


def assert_compare_runs(app) -> None:
    record = app.client().predict("quickstart", None, SHORT, api_name="/compare")
    ok = [column for column in record["columns"] if column["status"] == "ok"]
    assert len(ok) >= 3 and all(1 <= len(column["token_ids"]) <= SHORT for column in ok), record["columns"]


def test_sigterm_mid_run_ends_the_app_within_5_s_and_leaves_nothing_half_written(launch_app):
    app = launch_app().start()
    assert app.wait_announced()["state"] == "ready", app.log()[-2000:]
    start_long_run(app.client())
    sent = time.monotonic()
    app.send(signal.SIGTERM)
    try:
        status = app.wait_exit(SIGTERM_EXIT_BOUND_S)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: said in the failure
        pytest.fail(f"the app still ran {SIGTERM_EXIT_BOUND_S} s after SIGTERM (process 1: "
                    f"{app.in_pid_namespace}):\n{app.log()[-2000:]}")
    print(f"exit {time.monotonic() - sent:.2f} s after SIGTERM, as process 1: {app.in_pid_namespace}")
    log = app.log()
    assert status == EXIT_TERMINATED, log[-2000:]
    assert "kvlab: SIGTERM: stopping the running work and closing the server" in log
    assert f"kvlab: SIGTERM: stopped (exit status {EXIT_TERMINATED})" in log
    assert "Traceback" not in log, log[-3000:]
    assert_nothing_half_written(app)


def cache_with_the_converted_model(folder: Path) -> Path:
    """A cache folder whose converted SmolLM2 is a link to the one in the user's cache (converted once)."""
    prepare_bundled_model()
    models = folder / "models"
    models.mkdir(parents=True)
    (models / converted_bundled_folder().name).symlink_to(converted_bundled_folder(), target_is_directory=True)
    return folder


def leave_what_a_killed_start_leaves(cache: Path, ready_file: Path) -> list[Path]:
    """Staging folders of a conversion and of Gemma's assembly whose writer is gone (lock file present, free),
    half-written, and a ready file's temporary: what SIGKILL leaves mid-conversion or mid-write."""
    conversion = cache / "models" / f"{converted_bundled_folder().name}.tmp-killed0"
    assembly = cache / "gguf" / "gemma-3-270m.tmp-killed1"
    for folder, partial in ((conversion, "model.safetensors"), (assembly, "gemma-3-270m-q4_k_m.gguf")):
        folder.mkdir(parents=True)
        (folder / ".lock").touch()
        (folder / partial).write_bytes(b"\0" * 4096)
    temporary = ready_file.with_name(f".{ready_file.name}.tmp-killed2")
    temporary.write_text('{"state": "rea')
    return [conversion, assembly, temporary]


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_sigkill_mid_run_then_a_restart_is_ready_and_serves_a_compare_run(launch_app, tmp_path):
    cache = cache_with_the_converted_model(tmp_path / "cache")
    first = launch_app("app", KVLAB_CACHE_DIR=str(cache)).start()
    assert first.wait_announced()["state"] == "ready", first.log()[-2000:]
    start_long_run(first.client())
    first.sigkill()
    leftovers = leave_what_a_killed_start_leaves(cache, first.ready_file)
    second = launch_app("app", KVLAB_CACHE_DIR=str(cache)).start()
    assert second.wait_announced()["state"] == "ready", second.log()[-2000:]
    # The ready file holds this start's line only: the first start's "ready" is gone.
    assert [a["state"] for a in read_announcements(second.ready_file)] == ["ready"]
    assert all(a["time"] >= second.started for a in read_announcements(second.ready_file))
    assert [str(path) for path in leftovers if path.exists()] == []
    assert_compare_runs(second)


@pytest.mark.slow
def test_sigkill_mid_conversion_then_a_restart_converts_again_and_serves_a_run(launch_app, tmp_path):
    cache = tmp_path / "cache"
    first = launch_app("app", pid_namespace=False, KVLAB_CACHE_DIR=str(cache)).start()
    deadline = time.monotonic() + 300
    while not list(cache.glob("models/*.tmp*")):
        assert time.monotonic() < deadline and first.process.poll() is None, first.log()[-2000:]
        time.sleep(0.2)
    staging = list(cache.glob("models/*.tmp*"))
    time.sleep(3.0)  # into the de-quantizing
    first.sigkill()
    assert all(path.exists() for path in staging) and not converted_bundled_folder(cache).exists()
    second = launch_app("app", pid_namespace=False, KVLAB_CACHE_DIR=str(cache)).start()
    assert second.wait_announced()["state"] == "ready", second.log()[-2000:]
    assert not any(path.exists() for path in staging)
    assert (converted_bundled_folder(cache) / "ready").is_file()
    assert_compare_runs(second)


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_a_half_assembled_gemma_file_left_by_a_killed_start_is_assembled_again(tmp_path, monkeypatch):
    """Earlier versions assembled Gemma's file into the fixed folder `gguf/gemma-3-270m`; a start killed there left
    half a file, which every later start refused ("unexpected sha256") until the folder was deleted by hand."""
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the fallback cache folder: the test's own
    model = bundled.MODELS["bundled:gemma-3-270m"]
    scratch = tmp_path / "cache" / "gguf" / model.name
    scratch.mkdir(parents=True)
    (scratch / model.gguf_file).write_bytes(b"GGUF" + b"\0" * 65536)
    assembled = []

    def converted(path, folder_name, display_name, notify, expected_s):
        check_gguf(path)  # the whole file, not the half one
        assembled.append(path)
        return tmp_path / "converted"

    monkeypatch.setattr(bundled, "convert_gguf", converted)
    assert bundled.prepare(model.key) == tmp_path / "converted"
    assert len(assembled) == 1 and not assembled[0].exists()  # the scratch is gone after the conversion
    assert os.listdir(tmp_path / "cache" / "gguf") == []
