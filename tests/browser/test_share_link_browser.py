"""A share link reproduces the result in another browser (class 2 of the first-visit review).

After a live run, the page's "link to this result" opened in a second browser context (another session,
as a colleague would) shows the same prompt, settings, columns (strategies), texts, statuses, summary and
exports, with Run
ready and Stop idle; after a replay of the exported record in a third context, that page's link does too.
No wall-clock time is asserted; waits only guard against a hung run.
"""

import pytest

from pagekit import open_page
from test_compare_browser import snapshot, strategies, wait_for_model, wait_for_status
from test_native_plots_browser import newest_record

REPLAYED_TIMEOUT_MS = 120_000


def result_of(page) -> dict:
    """What a visitor reads of a finished result."""
    page.locator("#kv-summary").wait_for(state="visible")
    page.wait_for_function("(document.querySelector('#kv-exports').innerText.match(/kvlab-/g) || []).length >= 2")
    snap = snapshot(page)
    return {"strategies": strategies(page), "texts": snap["texts"], "badges": snap["badges"],
            "summary": page.locator("#kv-summary").inner_text(),
            "exports": sorted(name for name in ("kvlab-run", "kvlab-summary")
                              if name in page.locator("#kv-exports").inner_text()),
            "prompt": page.locator("#kv-prompt textarea").input_value(),
            "max_new": page.locator("#kv-max-new input").input_value(),
            "run_ready": page.locator("#kv-run").is_enabled(), "stop_idle": page.locator("#kv-stop").is_disabled(),
            "buttons": (page.locator("#kv-run").inner_text().strip(), page.locator("#kv-stop").inner_text().strip())}


def open_link(browser, app_url: str, page) -> object:
    """A new browser context on the page's share link, once its result is shown."""
    href = page.locator("#kv-share-link").get_attribute("href")
    assert href and href.startswith("?run=run-"), href
    other = open_page(browser, app_url.rstrip("/") + "/" + href)
    other.wait_for_function("document.querySelector('#kv-run-status').innerText.startsWith('replayed')",
                            timeout=REPLAYED_TIMEOUT_MS)
    return other


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_a_share_link_shows_the_same_result_in_another_browser(page, browser, app_url):
    wait_for_model(page)
    page.locator("#kv-max-new input").fill("8")
    page.locator("#kv-prompt textarea").fill("Name three colours of the sky.")  # the link restores the form too
    page.locator("#kv-col-2-strategy input").click()  # a third column changed from the preset: the link keeps it
    page.get_by_role("option", name="dynamic", exact=True).first.click()
    page.click("#kv-run")
    assert wait_for_status(page, "finished", "stopped", "✖")["status"].startswith("finished")
    page.wait_for_function("document.querySelector('#kv-stop').disabled && !document.querySelector('#kv-run').disabled")
    live = result_of(page)
    assert live["strategies"][2] == "dynamic" and live["exports"] == ["kvlab-run", "kvlab-summary"]
    assert live["run_ready"] and live["stop_idle"] and live["buttons"] == ("Run", "Stop")

    shared = open_link(browser, app_url, page)
    try:
        assert result_of(shared) == live
    finally:
        shared.context.close()

    # After a replay: the exported record uploaded in a third context; that page's own link opens it again.
    record = newest_record()  # the app runs on this machine: its export of the run just made
    replayer = open_page(browser, app_url)
    try:
        replayer.locator("#kv-replay-box").click()
        replayer.locator("#kv-replay input[type=file]").set_input_files(str(record))
        replayer.wait_for_function("document.querySelector('#kv-run-status').innerText.startsWith('replayed')",
                                   timeout=REPLAYED_TIMEOUT_MS)
        replayed = result_of(replayer)
        assert replayed == live
        again = open_link(browser, app_url, replayer)
        try:
            assert result_of(again) == live
        finally:
            again.context.close()
    finally:
        replayer.context.close()
