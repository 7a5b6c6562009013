"""Fault-catalogue fixtures: `python app.py` as a real subprocess that a test can signal, restart, or start on a
cache folder that is a small tmpfs (full or read-only).

`launch_app(...)` starts the app with its own ready file (`KVLAB_READY_FILE`), temporary folder (`TMPDIR`: its
exports and fallback cache folder) and port. Where `unshare` is allowed (root), the app runs as process 1 of a
new PID namespace, as it does in the Space's container (a process 1 gets no signal it has no handler for), and a
`mount` option gives it a tmpfs that root cannot write past (ENOSPC, EROFS) in a private mount namespace, so
nothing stays mounted after the test. Every app started is killed at the end of its test.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.models.readiness import read_announcements

REPO = Path(__file__).resolve().parents[2]
APP_START_TIMEOUT_S = 600
"""How long a start may take to say its model is ready (a cold conversion on a busy 2-core machine: minutes)."""


@functools.cache
def unshare_allows(*flags: str) -> bool:
    """Whether `unshare` with `flags` can run here (it needs root, or user namespaces, and the binary)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


PID_NAMESPACE = ("--pid", "--fork", "--kill-child")
MOUNT_NAMESPACE = ("--mount", "--propagation", "private")


class AppProcess:
    """One `python app.py` subprocess (see the module's docstring). `started` is `time.time()` at its start."""

    def __init__(self, folder: Path, env: dict, mount: str | None = None, pid_namespace: bool = True):
        self.folder, self.mount = folder, mount
        self.ready_file = folder / "ready.jsonl"
        self.log_path = folder / "app.log"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_SERVER_PORT": str(self.port), "KVLAB_MCP": "0",
                    "KVLAB_READY_FILE": str(self.ready_file), "TMPDIR": str(folder / "tmp"),
                    "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **env}
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        self.in_pid_namespace = pid_namespace and unshare_allows(*PID_NAMESPACE)
        self.process: subprocess.Popen | None = None
        self.started = 0.0

    def command(self) -> list[str]:
        app = [sys.executable, "app.py"]
        namespaces = list(PID_NAMESPACE) if self.in_pid_namespace else []
        if self.mount is not None:
            target = self.env["KVLAB_CACHE_DIR"]
            script = f"mount -t tmpfs -o {self.mount} kvlab-test {target} && exec {' '.join(app)}"
            return ["unshare", *MOUNT_NAMESPACE, *namespaces, "sh", "-c", script]
        return ["unshare", *namespaces, *app] if namespaces else app

    def start(self) -> "AppProcess":
        self.started = time.time()
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(self.command(), cwd=REPO, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    @property
    def app_pid(self) -> int:
        """The pid of the Python process serving the app (the child of `unshare --fork` in a PID namespace)."""
        if not self.in_pid_namespace:
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        for _ in range(200):
            pids = children.read_text().split() if children.exists() else []
            if pids:
                return int(pids[0])
            time.sleep(0.05)
        raise RuntimeError(f"unshare started no app process; see {self.log_path}:\n{self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_announced(self, timeout_s: float = APP_START_TIMEOUT_S) -> dict:
        """The ready file's first announcement (ready or error) of this start (written after it began)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            announced = [a for a in read_announcements(self.ready_file) if a.get("time", 0) >= self.started]
            if announced:
                return announced[0]
            if self.process.poll() is not None:
                raise RuntimeError(f"the app exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.25)
        raise RuntimeError(f"no model announcement within {timeout_s} s:\n{self.log()[-3000:]}")

    def client(self, timeout_s: float = 120.0):
        """A gradio_client Client on the app, once it serves."""
        from gradio_client import Client

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return Client(f"http://127.0.0.1:{self.port}/", verbose=False)
            except Exception:  # noqa: BLE001 - not serving yet: connection refused, or the config not ready
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.5)

    def send(self, signum: int) -> None:
        os.kill(self.app_pid, signum)

    def wait_exit(self, timeout_s: float) -> int:
        """The exit status after at most `timeout_s` (raises subprocess.TimeoutExpired)."""
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """End the whole start (unshare and the app) if it still runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def sigkill(self) -> int:
        """SIGKILL the app's own process, as an out-of-memory kill or a forced stop would; its exit status."""
        self.send(signal.SIGKILL)
        return self.wait_exit(60)


@pytest.fixture
def launch_app(tmp_path):
    """`launch_app(name, mount=None, pid_namespace=True, **env)`: an `AppProcess` in `tmp_path / name`, not started
    yet (call `.start()`); `pid_namespace=False` runs it as a plain process (a workstation, a VM's service); `env`
    adds to or overrides its environment. All are killed when the test ends."""
    apps: list[AppProcess] = []

    def launch(name: str = "app", mount: str | None = None, pid_namespace: bool = True, **env) -> AppProcess:
        app = AppProcess(tmp_path / name, env, mount, pid_namespace)
        apps.append(app)
        return app

    yield launch
    for app in apps:
        app.kill()

