"""Several API clients and one browser page on the real app at once (issue: a visitor waited 508 s behind six
API runs). kvlab's scheduler gives the model to the client that used it least lately, shows a waiting page its
position and wait, and refuses over-cap requests at once in one line naming the setting.

- The page's own over-cap Run (6 columns × 3,000 tokens) is refused in its status line, naming
  KVLAB_MAX_RUN_STEPS; nothing runs.
- Three `gradio_client` clients from one address ask for a preset run: the first runs, the second waits
  (its progress values say so), the third is refused at once (KVLAB_MAX_RUNS_PER_CLIENT); an oversized call (the
  quickstart at 4,000 tokens) is refused at once too (KVLAB_MAX_RUN_STEPS; over the browser tier's raised cap as
  over the default).
- The page presses Run: its status shows "waiting: position 1, about N s" (ahead of the API's waiting call,
  which is now position 2), and its run starts before that API call does.

No wall-clock time is asserted; waits only guard against a hung run.
"""

import time

import pytest
from gradio_client import Client

from pagekit import TEST_RUN_STEPS, serving, wait_until
from test_compare_browser import RUN_TIMEOUT_S, pick_preset, snapshot, wait_for_model

PRESET = "sampling"
"""A light preset (3 columns) for every run here."""
API_TOKENS = 16
"""The API runs' tokens: long enough for the page to queue behind the first (tens of seconds on a CPU)."""
PAGE_TOKENS = 4
GUARD_S = 600
POLL_S = 0.3


def status_of(job) -> str:
    """"running", "waiting N" (its position) or "none" from the latest progress value of an API job."""
    outputs = job.outputs()
    latest = outputs[-1] if outputs else {}
    if "running" in latest:
        return "running"
    return f"waiting {latest['waiting']['position']}" if "waiting" in latest else "none"


def until(condition, guard_s: float = GUARD_S):
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"not met within {guard_s} s: {condition}")


@pytest.fixture
def app_url():
    """An app of its own, with no history of use, in place of the session's (the conftest's `page` opens on it):
    the fair order counts a page by its address, and every page of the session's app comes from 127.0.0.1, so
    the tests before this one make that address a recent user there."""
    with serving("app-sharing", KVLAB_MAX_RUN_STEPS=str(TEST_RUN_STEPS)) as url:
        yield url


def test_a_page_queues_ahead_of_an_api_clients_runs_and_over_cap_requests_are_refused(page, app_url):
    from gradio_client.exceptions import AppError

    wait_for_model(page)
    page.locator("#kv-max-new input").fill("3000")  # the quickstart the page opens on: 6 columns
    page.click("#kv-run")
    refusal = wait_until(page, "(() => { const s = document.querySelector('#kv-run-status').innerText;"
                               " return s.startsWith('✖') ? s : ''; })()", RUN_TIMEOUT_S)
    assert refusal.startswith("✖ refused: this run costs") and "KVLAB_MAX_RUN_STEPS" in refusal
    assert "\n" not in refusal.strip()

    clients = [Client(app_url, verbose=False) for _ in range(3)]
    jobs = []
    try:
        jobs.append(clients[0].submit(PRESET, None, API_TOKENS, api_name="/compare"))
        until(lambda: status_of(jobs[0]) == "running")
        jobs.append(clients[1].submit(PRESET, None, API_TOKENS, api_name="/compare"))
        until(lambda: status_of(jobs[1]) == "waiting 1")
        with pytest.raises(AppError) as third:
            clients[2].predict(PRESET, None, API_TOKENS, api_name="/compare")
        assert "KVLAB_MAX_RUNS_PER_CLIENT" in str(third.value) and "\n" not in str(third.value)
        with pytest.raises(AppError, match="KVLAB_MAX_RUN_STEPS"):
            clients[2].predict("quickstart", None, 4000, api_name="/compare")

        pick_preset(page, PRESET)
        page.locator("#kv-max-new input").fill(str(PAGE_TOKENS))
        page.locator("#kv-run:not([disabled])").wait_for()
        page.click("#kv-run")
        waiting = until(lambda: (s := snapshot(page)["status"]).startswith("waiting: position") and s)
        assert waiting.startswith("waiting: position 1, about ") and waiting.rstrip().endswith(" s"), waiting
        until(lambda: status_of(jobs[1]) == "waiting 2")  # queued first, yet behind the page now
        started = until(lambda: (s := snapshot(page)["status"]).startswith(("running", "finished", "✖")) and s)
        assert started.startswith("running"), started
        assert not any("running" in output for output in jobs[1].outputs()), "the API's second run went first"
    finally:
        for job in jobs:
            job.cancel()
        for client in clients:
            client.close()
