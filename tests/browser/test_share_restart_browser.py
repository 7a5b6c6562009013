"""A share link outlives the app: a run's `?run=` link, taken in one app process, opens the same result in a
new app process started on the same shared-runs folder (`KVLAB_RUNS_DIR`), as after a Space restart; the
page states the keeping rule beside the link, and a link whose result is gone gets one line with that rule.

Both apps are started as the session's app is (`pagekit.serving`: a subprocess on a free port, stopped with
SIGTERM); the session's app is not used. No wall-clock time is asserted; waits only guard against a hang.
"""

from pagekit import open_page, serving
from test_compare_browser import wait_for_model, wait_for_status
from test_share_link_browser import REPLAYED_TIMEOUT_MS, result_of

KEPT = "kept on this server for 7 days; past 512 MiB of kept runs, the oldest go first"
DEFAULT_RULES = {"KVLAB_RUNS_KEEP_DAYS": "", "KVLAB_RUNS_MAX_MB": ""}
"""Empty: the defaults, whatever this environment sets."""


def test_a_share_link_opens_the_same_result_after_the_app_restarts(browser, tmp_path):
    runs = tmp_path / "runs"
    with serving("app-before-restart", KVLAB_RUNS_DIR=str(runs), **DEFAULT_RULES) as url:
        page = open_page(browser, url)
        try:
            wait_for_model(page)
            page.locator("#kv-max-new input").fill("6")
            page.locator("#kv-prompt textarea").fill("Name two colours of a sunset.")
            page.click("#kv-run")
            assert wait_for_status(page, "finished", "stopped", "✖")["status"].startswith("finished")
            page.wait_for_function("!document.querySelector('#kv-run').disabled")
            live = result_of(page)
            href = page.locator("#kv-share-link").get_attribute("href")
            assert KEPT in page.locator("#kv-share-kept").inner_text()
        finally:
            page.context.close()
    assert href.startswith("?run=run-") and (runs / href.removeprefix("?run=") / "kvlab-run.json").is_file()

    with serving("app-after-restart", KVLAB_RUNS_DIR=str(runs), **DEFAULT_RULES) as url:
        shared = open_page(browser, url + href)
        try:
            shared.wait_for_function("document.querySelector('#kv-run-status').innerText.startsWith('replayed')",
                                     timeout=REPLAYED_TIMEOUT_MS)
            assert result_of(shared) == live
            assert KEPT in shared.locator("#kv-share-kept").inner_text()
        finally:
            shared.context.close()
        gone = open_page(browser, url + "?run=run-" + "0" * 32)
        try:
            gone.wait_for_function("document.querySelector('#kv-run-status').innerText.includes('not kept')",
                                   timeout=REPLAYED_TIMEOUT_MS)
            status = gone.locator("#kv-run-status").inner_text()
            assert "this shared result is not kept on this server any more" in status and KEPT in status
        finally:
            gone.context.close()
