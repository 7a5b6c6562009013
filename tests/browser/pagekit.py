"""Helpers the browser tests import by name (a module of its own: every tier has a `conftest`,
and which one `import conftest` finds depends on the order pytest collected them)."""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
APP_START_TIMEOUT_S = 240
APP_STOP_TIMEOUT_S = 20


TEST_RUN_STEPS = 200_000
"""The app's per-run cap here (KVLAB_MAX_RUN_STEPS): the long runs some tests stop or abandon (6 columns × 1,500
or 2,000 tokens: up to 143,000 steps) cost more than the default; the sharing test's over-cap requests
(300,000 steps and more) cost more than this."""

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + APP_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the app exited with {process.returncode}; see {log_path}:\n"
                               f"{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the app did not answer at {url} within {APP_START_TIMEOUT_S} s; see {log_path}")


@contextmanager
def serving(log_name: str, port: int | None = None, **env):
    """`python app.py` on `port` (default: a free one) with `env` added to this environment; yields its URL once
    it answers, then stops it (SIGTERM, as a restart does; SIGKILL after APP_STOP_TIMEOUT_S). Its output goes
    to `artifacts/<log_name>.log`."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = port or free_port()
    full = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
            "PYTHONUNBUFFERED": "1", **env}
    log_path = ARTIFACTS / f"{log_name}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO_ROOT, env=full, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(url, process, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(APP_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(APP_STOP_TIMEOUT_S)


def open_page(browser, url: str):
    """A new browser context (its own gradio session) with the app loaded; close its `.context` when done."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url)
    page.wait_for_selector("#kv-run")
    return page


def wait_until(page, expression: str, timeout_s: float, poll_s: float = 0.25):
    """Evaluate `expression` (JavaScript) in `page` from here until it is truthy; returns its value. Unlike
    `page.wait_for_function`, whose checks run on the page's own animation frames or timers, this works on a
    page that is not in front (headless chromium pauses those); raises AssertionError with the last value."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = page.evaluate(expression)
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{expression!r} stayed {value!r} for {timeout_s} s")
