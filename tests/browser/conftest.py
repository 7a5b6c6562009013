"""Browser-tier fixtures: the real app as a subprocess on a free localhost port, and headless
Debian chromium driven by Playwright (no browser is ever downloaded).

The app's output goes to `artifacts/app-browser.log` for when a test fails.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pagekit import open_page  # noqa: F401  (the fixtures below use it)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
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
            raise RuntimeError(f"the app exited with {process.returncode}; see {log_path}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the app did not answer at {url} within {APP_START_TIMEOUT_S} s; see {log_path}")


@pytest.fixture(scope="session")
def app():
    """Start `python app.py` on a free port (or KVLAB_BROWSER_PORT) as GRADIO_SERVER_PORT, wait for it, yield its `url` and the `log`
    file its output goes to, stop it. One app for the whole browser tier, as one server would be."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = int(os.environ.get("KVLAB_BROWSER_PORT") or free_port())
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
           "PYTHONUNBUFFERED": "1", "KVLAB_MAX_RUN_STEPS": str(TEST_RUN_STEPS)}
    log_path = ARTIFACTS / "app-browser.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(url, process, log_path)
        yield types.SimpleNamespace(url=url, log=log_path)
    finally:
        process.terminate()
        try:
            process.wait(APP_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(APP_STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def app_url(app):
    """The running app's URL."""
    return app.url


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium (skips the test when Playwright or chromium is not installed).

    Module-scoped: Playwright's sync API allows one instance per thread, and another browser
    module may start its own."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); no browser is downloaded")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, app_url):
    """A fresh tab on the app, 1600×1000, with its Compare tab loaded."""
    page = open_page(browser, app_url)
    try:
        yield page
    finally:
        page.context.close()


@pytest.fixture
def other_page(browser, app_url):
    """A second, independent tab (another session) on the same app."""
    page = open_page(browser, app_url)
    try:
        yield page
    finally:
        page.context.close()
