"""Compare on the bundled Whisper tiny.en in headless chromium: picking the speech model puts a clip picker in
the prompt box's place; Run transcribes the clip under the quickstart's columns, each exact column's text is the
clip's sentence with its word error rate in the column, the sink column is refused with its reason for an
encoder-decoder cache, and the summary shows the cache split into its self- and cross-attention parts. No
wall-clock time is asserted; waits only guard against a hung run.
"""

import re
import time

from test_compare_browser import ARTIFACTS, snapshot, wait_for_status

MODEL_TIMEOUT_MS = 240_000


def pick(page, field: str, option: re.Pattern) -> None:
    page.locator(f"{field} input").click()
    page.get_by_role("option", name=option).click()


def test_a_whisper_compare_transcribes_a_clip_and_refuses_the_sink_column(page):
    pick(page, "#kv-model", re.compile(r"^bundled:whisper-tiny\.en"))
    page.wait_for_function("() => { const c = document.querySelector('#kv-clip');"
                           " return c && c.offsetParent !== null; }", timeout=30_000)
    assert not page.locator("#kv-prompt").is_visible()
    pick(page, "#kv-clip", re.compile(r"^memorize"))
    page.click("#kv-load")
    page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')",
                           timeout=MODEL_TIMEOUT_MS)
    page.click("#kv-run")
    snap = wait_for_status(page, "finished", "summary ready", "stopped", "✖")
    assert not snap["status"].startswith(("stopped", "✖")), snap["status"]
    names = [page.locator(f"#kv-col-{i}-strategy input").input_value().split("  ")[0] for i in range(6)]
    assert {"dynamic", "static", "sink"} <= set(names)
    for i, name in enumerate(names):
        status = page.locator(f"#kv-col-{i}-status").inner_text()
        if name == "sink":
            assert "unavailable" in status and "not for an encoder-decoder cache" in status, status
        elif name in ("dynamic", "static", "no_cache"):
            assert snap["texts"][i].lower().rstrip(".") == "find it and memorize it", (name, snap["texts"][i])
    summary = page.locator("#kv-summary").inner_text()
    assert "WER 0.0 %" in summary and "cross=" in summary and "self=" in summary
    page.screenshot(path=str(ARTIFACTS / "compare-whisper.png"), full_page=True)
    time.sleep(0.5)
    assert snapshot(page)["texts"] == snap["texts"]  # nothing more arrives after the run
