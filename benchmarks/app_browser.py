"""The app section's browser path: headless Debian Chromium, driven by Playwright, runs the Compare tab's
start preset (quickstart) as a user would and reads each run's JSON export.

No browser is ever downloaded: Playwright launches `/usr/bin/chromium`. The
browser runs on this machine. This module drives a page; it measures nothing
itself (the app's record does).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.request
from urllib.parse import urljoin

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
POLL_MS = 1000
"""How often the driver reads the page while a run streams. Playwright's default polls on every animation
frame, which keeps Chromium drawing on the cores the run is measured on; a user's browser does not."""
RUN_TIMEOUT_MS = 1_800_000
"""Longest wait for one run to finish on a busy machine (milliseconds)."""
MODEL_TIMEOUT_MS = 600_000
EXPORT_LINKS_JS = "() => [...document.querySelectorAll('#kv-exports a')].map(a => a.href)"
FINISHED_JS = """(before) => {
  const status = (document.querySelector('#kv-run-status') || {}).innerText || '';
  const links = [...document.querySelectorAll('#kv-exports a')].map(a => a.href);
  return (status.startsWith('finished') || status.startsWith('✖') || status.startsWith('stopped'))
    && (status.startsWith('✖') || links.some(h => h.includes('kvlab-run.json') && !before.includes(h)));
}"""


def browser_problem() -> str | None:
    """Why the browser path cannot run here (Playwright or Chromium missing), or None."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (requirements-test.txt)"
    if not shutil.which(CHROMIUM):
        return f"{CHROMIUM} is not installed (apt-get install chromium); no browser is downloaded"
    return None


def run_in_browser(url: str, runs: int, new_tokens: int | None, say, mark=lambda run: None,
                   between=lambda: None) -> list[dict]:
    """Open the app at `url`, press Run `runs` times on the start preset (with `new_tokens` typed into max new
    tokens when given) and return each run's JSON record, fetched from its export link. `mark(i)` is called
    just before run i's click (0-based), and `mark(None)` once the runs are over, before the browser closes;
    `between()` after each run but the last, with the page open and idle (the bench's CLI run goes there).

    Raises:
        RuntimeError: a run ended with an error line instead of a summary.
        playwright's TimeoutError: the page did not get there within the timeouts.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(MODEL_TIMEOUT_MS)
            page.goto(url)
            page.wait_for_selector("#kv-run")
            page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')",
                                   polling=POLL_MS)
            if new_tokens:
                page.locator("#kv-max-new input").fill(str(new_tokens))
            records = []
            for run in range(runs):
                if run:
                    _wait_until_idle(page, say)
                    between()
                records.append(_one_run(page, url, run, say, mark))
                mark(None)
            return records
        finally:
            browser.close()


SETTLE_MS = 2000
"""After a run, the page is left this long to finish drawing before the CLI run between two browser runs."""


def _wait_until_idle(page, say) -> None:
    """Leave the page SETTLE_MS to finish drawing the run it just showed. Raises nothing of its own."""
    page.wait_for_timeout(SETTLE_MS)


def _one_run(page, url: str, run: int, say, mark) -> dict:
    say(f"app: browser run {run + 1} after start")
    before = page.evaluate(EXPORT_LINKS_JS)
    page.locator("#kv-run:not([disabled])").wait_for()
    mark(run)
    page.click("#kv-run")
    page.wait_for_function(FINISHED_JS, arg=before, timeout=RUN_TIMEOUT_MS, polling=POLL_MS)
    status = page.locator("#kv-run-status").inner_text()
    if status.startswith("✖"):
        raise RuntimeError(f"the browser run failed: {status}")
    link = next(h for h in page.evaluate(EXPORT_LINKS_JS) if "kvlab-run.json" in h and h not in before)
    with urllib.request.urlopen(urljoin(url, link), timeout=60) as response:
        return json.loads(response.read())
