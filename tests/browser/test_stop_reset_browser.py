"""Runs that can be stopped and reset, in headless chromium against the real app (class 3 of the first-visit
review).

- Inspect: Reset pressed during a 512-step "Run to end" says at once that it is queued behind the step in
  hand, and the new run starts long before the old one would have ended (no status ever reaches step 512);
  five quick Step clicks take five steps (none dropped).
- Compare: closing the page of a long run ends its remaining work, so another page's run gets the
  model-bound queue instead of waiting for it.

No wall-clock time is asserted; waits only guard against a hung run (the closed page's run would have
needed far longer than the guard).
"""

import re
import time

from test_compare_browser import snapshot, wait_for_model

LONG_STEPS = 512
QUEUE_GUARD_S = 240
STATUS_JS = "document.querySelector('#kvi-status').innerText"


def inspect_status(page) -> str:
    return page.evaluate(f"() => {STATUS_JS}")


def test_inspect_reset_stops_a_long_run_and_no_step_click_is_dropped(page):
    page.get_by_role("tab", name="Inspect").click()
    page.locator("#kvi-max-new input").fill(str(LONG_STEPS))
    page.locator("#kvi-max-new input").press("Tab")
    page.click("#kvi-run")
    page.wait_for_function(f"/^([3-9]|\\d\\d+) of {LONG_STEPS} steps/.test({STATUS_JS})", timeout=600_000)
    page.click("#kvi-reset")
    page.wait_for_function(f"{STATUS_JS}.startsWith('resetting') || {STATUS_JS}.startsWith('new run')",
                           timeout=30_000)
    seen = []
    deadline = time.monotonic() + 600
    while not (status := inspect_status(page)).startswith("new run") and time.monotonic() < deadline:
        seen.append(status)
        time.sleep(0.2)
    assert status.startswith("new run"), seen[-3:]
    steps = [int(m.group(1)) for s in seen if (m := re.match(r"(\d+) of", s))]
    assert not steps or max(steps) < LONG_STEPS and "run ended" not in " ".join(seen), seen[-3:]

    for _ in range(5):
        page.locator("#kvi-step").click(no_wait_after=True)
    page.wait_for_function(f"/^5 of {LONG_STEPS} steps/.test({STATUS_JS})", timeout=600_000)


def test_a_closed_page_ends_its_compare_run_and_frees_the_queue(browser, app_url, page):
    from pagekit import open_page

    closing = open_page(browser, app_url)
    wait_for_model(closing)
    closing.locator("#kv-max-new input").fill("2000")
    closing.locator("#kv-ignore-eos input").check()
    closing.click("#kv-run")
    closing.wait_for_function("document.querySelector('#kv-run-status').innerText.startsWith('running')",
                              timeout=600_000)
    closing.context.close()

    wait_for_model(page)
    page.locator("#kv-max-new input").fill("4")
    page.click("#kv-run")
    deadline = time.monotonic() + QUEUE_GUARD_S
    while time.monotonic() < deadline:
        status = snapshot(page)["status"]
        if status.startswith(("finished", "summary ready", "stopped", "✖")):
            break
        time.sleep(0.5)
    assert status.startswith(("finished", "summary ready")), f"the other page's run still held the queue: {status!r}"
