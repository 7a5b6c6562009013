"""Browser-tier fixtures: the real app as a subprocess on a free localhost port, and headless
Debian chromium driven by Playwright (no browser is ever downloaded).

The app's output goes to `artifacts/app-browser.log` for when a test fails.
"""

import os
import shutil
import types

import pytest

from pagekit import ARTIFACTS, TEST_RUN_STEPS, open_page, serving  # noqa: F401  (the fixtures below use them)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="session")
def app():
    """Start `python app.py` on a free port (or KVLAB_BROWSER_PORT) as GRADIO_SERVER_PORT, wait for it, yield its
    `url` and the `log` file its output goes to, stop it. One app for the whole browser tier, as one server would
    be."""
    port = int(os.environ.get("KVLAB_BROWSER_PORT") or 0) or None
    with serving("app-browser", port, KVLAB_MAX_RUN_STEPS=str(TEST_RUN_STEPS)) as url:
        yield types.SimpleNamespace(url=url, log=ARTIFACTS / "app-browser.log")


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
