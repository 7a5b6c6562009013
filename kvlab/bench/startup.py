"""Start-up section: seconds from process start to model ready and to first token, in fresh processes.

Three launches per repeat: the backend (`startup_child.py`) on an empty cache
folder (first launch, which converts the bundled GGUF; sizes with
`fresh_launch`) and again on the same folder (second launch), then `python
app.py` itself, timed until its page answers and until its preloaded model is
ready. The app says it is ready (or failed) through `kvlab.models.readiness`: the bench
names a temporary file in `KVLAB_READY_FILE` and polls it; the last lines of the
app's stderr are kept for error messages. Every child process is stopped and
every temporary folder removed in `finally`, SIGTERM included (the command line
turns it into SystemExit). This module measures and builds the record; it
prints and draws nothing, and it never imports gradio itself (a child times
that import).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..models.readiness import ERROR, READY_FILE_ENV, read_announcements
from .harness import PROMPT, BenchSize, Context, make_check, summarize

STARTUP_READY_MAX_S = 5.0
"""A second launch must have its model ready within this many seconds of process start."""
APP_TIMEOUT_S = 900.0
"""Longest wait for app.py to serve and announce its model ready, which includes the opening columns' one-time
warm-up (`kvlab.ui.compare.warm`): minutes on a 2-core machine busy with other work."""
APP_POLL_S = 0.02
APP_STOP_TIMEOUT_S = 20.0
STDERR_TAIL_LINES = 5
UI_MODULE = "gradio"
"""The module whose import time the app pays before its model starts loading (timed in a child)."""
HERE = Path(__file__).resolve().parent
STARTUP_CHILD = HERE / "startup_child.py"
IMPORT_TIME_CHILD = HERE / "import_time_child.py"
BACKEND_MARKS = ("imports_s", "lazy_imports_s", "ready_s", "first_token_s")
APP_MARKS = ("served_s", "ready_s")


def child_env(cache_folder: Path) -> tuple[dict, str]:
    """(environment, repository root) for a child that loads the bundled model from `cache_folder`."""
    env = dict(os.environ, KVLAB_CACHE_DIR=str(cache_folder), PYTHONUNBUFFERED="1")
    root = str(HERE.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env, root


def launch(cache_folder: Path) -> dict:
    """Start a fresh python that loads the bundled model and makes one token; seconds from spawn to each mark
    (`imports_s`, `lazy_imports_s`, `ready_s`, `first_token_s`).

    Raises:
        RuntimeError: the child failed (its last stderr line is in the message).
    """
    env, root = child_env(cache_folder)
    started = time.time()
    proc = subprocess.run([sys.executable, "-P", str(STARTUP_CHILD), PROMPT], env=env, cwd=root,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    marks = json.loads(proc.stdout.strip().splitlines()[-1])
    return {f"{name}_s": value - started for name, value in marks.items()}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_app(cache_folder: Path) -> dict:
    """Start `python app.py` as a user would; seconds from spawn until its page answers (`served_s`) and until
    it announces in its ready file that its preloaded model is ready (`ready_s`). The app is stopped and the
    ready file's folder removed before returning.

    Raises:
        RuntimeError: the app announced a load error, exited, or did not get there within APP_TIMEOUT_S.
    """
    env, root = child_env(cache_folder)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="kvlab-bench-"))
    ready_file = folder / "ready.jsonl"
    env["GRADIO_SERVER_PORT"] = str(port)
    env[READY_FILE_ENV] = str(ready_file)
    tail: list[str] = []
    reader = None
    started = time.time()
    try:
        proc = subprocess.Popen([sys.executable, "app.py"], env=env, cwd=root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            reader = threading.Thread(target=_keep_tail, args=(proc.stderr, tail), daemon=True)
            reader.start()
            return _wait_for_app(proc, port, ready_file, started, tail)
        finally:
            _stop(proc)
    finally:
        if reader is not None:
            reader.join(timeout=5)
        shutil.rmtree(folder, ignore_errors=True)


def _keep_tail(stream, tail: list[str]) -> None:
    for line in stream:
        tail[:] = (tail + [line.rstrip()])[-STDERR_TAIL_LINES:]


def _answers(port: int) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
    except OSError:
        return False
    return True


def _wait_for_app(proc, port: int, ready_file: Path, started: float, tail: list[str]) -> dict:
    """Poll the page and the ready file until both answered; marks in seconds since `started`."""
    marks: dict[str, float] = {}
    while time.time() - started < APP_TIMEOUT_S and proc.poll() is None:
        if "served_s" not in marks and _answers(port):
            marks["served_s"] = time.time() - started
        announced = [] if "ready_s" in marks else read_announcements(ready_file)
        if announced and announced[0]["state"] == ERROR:
            raise RuntimeError(f"app.py could not load its model: {announced[0]['message']}")
        if announced:
            marks["ready_s"] = announced[0]["time"] - started
        if {"served_s", "ready_s"} <= marks.keys():
            return marks
        time.sleep(APP_POLL_S)
    raise RuntimeError(f"app.py did not serve and load within {APP_TIMEOUT_S:.0f} s (exit status "
                       f"{proc.poll()}); last log lines: {tail}")


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=APP_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ui_import_s() -> float:
    """Seconds `import gradio` (UI_MODULE) takes in a fresh python here, nothing imported before it."""
    out = subprocess.run([sys.executable, "-P", str(IMPORT_TIME_CHILD), UI_MODULE], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_startup(ctx: Context) -> dict:
    """The start-up section's record: backend launches, the app's launch, `import gradio` alone, two checks."""
    launches, app, ui_s = measure_startup(ctx)
    return startup_section(ctx.size, launches, app, ui_s)


def measure_startup(ctx: Context) -> tuple[dict, list[dict], list[float]]:
    """({"first": [marks], "second": [marks]}, [app marks], [seconds to import gradio]), one per repeat."""
    from ..models.loading import cache_dir, prepare_bundled_model

    size = ctx.size
    launches = {"first": [], "second": []}
    app, ui_s = [], []
    for rep in range(size.startup_repeats):
        count = f"repeat {rep + 1}/{size.startup_repeats}"
        if size.fresh_launch:
            folder = Path(tempfile.mkdtemp(prefix="kvlab-bench-"))
            try:
                ctx.say(f"startup: first launch on an empty cache folder, {count}")
                launches["first"].append(launch(folder))
                ctx.say(f"startup: second launch, {count}")
                launches["second"].append(launch(folder))
                ctx.say(f"startup: app.py second launch, {count}")
                app.append(launch_app(folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            prepare_bundled_model()
            ctx.say(f"startup: second launch, {count}")
            launches["second"].append(launch(cache_dir()))
            ctx.say(f"startup: app.py second launch, {count}")
            app.append(launch_app(cache_dir()))
        ui_s.append(ui_import_s())
    return launches, app, ui_s


def startup_section(size: BenchSize, launches: dict, app: list[dict], ui_s: list[float]) -> dict:
    """The record: what each child does, median/min/max of every mark, and the two checks."""
    record = {"target_ready_s": STARTUP_READY_MAX_S,
              "child": "python -P kvlab/bench/startup_child.py: import torch+transformers, kvlab and transformers' "
                       "lazy modules, load_model, one dynamic token",
              "app": "python app.py: its page answers (served) and it announces in its ready file "
                     f"({READY_FILE_ENV}) that the preloaded model is ready",
              "gradio_import_s": summarize(ui_s)}
    for name, runs in launches.items():
        if runs:
            record[name] = {key: summarize([r[key] for r in runs]) for key in BACKEND_MARKS}
        else:
            record[name] = {"skipped": f"size {size.name} skips a fresh conversion (about 20 s); use --size small or full"}
    record["app_second"] = {key: summarize([r[key] for r in app]) for key in APP_MARKS}
    record["checks"] = startup_checks(launches["second"], app, ui_s)
    return record


def startup_checks(second: list[dict], app: list[dict], ui_s: list[float]) -> list[dict]:
    """Second launch to model ready, backend and app, against STARTUP_READY_MAX_S; reasons break the time down."""
    imports, lazy, ready = (statistics.median(r[key] for r in second) for key in ("imports_s", "lazy_imports_s", "ready_s"))
    reason = (f"interpreter + `import torch, transformers` {imports:.1f} s, kvlab and transformers' lazy "
              f"modelling/cache imports {lazy - imports:.1f} s, load_model {ready - lazy:.1f} s")
    served, app_ready = (statistics.median(r[key] for r in app) for key in APP_MARKS)
    app_reason = (f"`import gradio` alone takes {statistics.median(ui_s):.1f} s here and runs before the model "
                  f"starts loading; page served at {served:.1f} s, model ready at {app_ready:.1f} s (the backend "
                  f"alone: {ready:.1f} s). Loading the model in a thread while gradio imports did not help: both "
                  f"are import work that holds the GIL")
    return [
        make_check("startup", "second launch: process start to model ready", [r["ready_s"] for r in second],
                   f"≤ {STARTUP_READY_MAX_S} s", lambda v: v <= STARTUP_READY_MAX_S, reason, unit="s"),
        make_check("startup", "app.py second launch: start to model ready", [r["ready_s"] for r in app],
                   f"≤ {STARTUP_READY_MAX_S} s", lambda v: v <= STARTUP_READY_MAX_S, app_reason, unit="s"),
    ]
