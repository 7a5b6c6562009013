"""The link from Compare's "first divergence" cell into Inspect, in headless chromium against the real app
(bundled model, CPU).

The sampling preset's columns (dynamic, static, quanto int2) run greedy for a few tokens; the quantized column's
first-divergence cell is a link; following it selects Inspect with the quantized strategy, `dynamic` to compare
with, the same prompt, stepped to that step, and the lockstep view names the same first divergence and draws
its chart. A screenshot goes to artifacts/.

No wall-clock time is asserted; waits only guard against a hung run.
"""

from pathlib import Path
from urllib.parse import parse_qsl, urljoin, urlsplit

import pytest

from pagekit import wait_until
from test_compare_browser import SAMPLING_PROMPT, pick_preset, wait_for_model, wait_for_status

STEP_TIMEOUT_MS = 600_000
NEW_TOKENS = 12
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "inspect-diverge.png"


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_the_first_divergence_link_opens_inspect_at_that_step_with_both_strategies(page):
    wait_for_model(page)
    pick_preset(page, "sampling")
    page.wait_for_function(f"document.querySelector('#kv-prompt textarea').value === {SAMPLING_PROMPT!r}")
    page.locator("#kv-decoding").get_by_text("greedy").click()
    page.locator("#kv-max-new input").fill(str(NEW_TOKENS))
    page.click("#kv-run")
    snap = wait_for_status(page, "finished", "stopped", "✖")
    assert snap["status"].startswith("finished"), snap["status"]

    links = page.locator("#kv-summary a[href*='inspect=1']")
    # The table is re-rendered after the status line (a heavier component): wait for its link, say what it shows.
    try:
        wait_until(page, "document.querySelectorAll(\"#kv-summary a[href*='inspect=1']\").length > 0", 300)
    except AssertionError:
        raise AssertionError("no first-divergence link; the summary reads: "
                             + page.locator("#kv-summary").inner_text()[:1500]) from None
    hrefs = links.evaluate_all("els => [...new Set(els.map(e => e.getAttribute('href')))]")
    assert len(hrefs) == 1  # dynamic and static agree with the baseline: no link; quanto int2 diverges
    query = dict(parse_qsl(urlsplit(hrefs[0]).query))
    step = int(query["step"])
    assert query["strategy"].startswith("quantized") and query["compare"] == "dynamic"
    inspect = page.context.new_page()  # follow the link as a new tab would (a click in the table selects the cell)
    inspect.set_default_timeout(60_000)
    inspect.goto(urljoin(page.url, hrefs[0]))
    inspect.wait_for_function(
        f"(document.querySelector('#kvi-step-info') || {{}}).innerText?.includes('Token {step} ')",
        timeout=STEP_TIMEOUT_MS)
    assert inspect.locator("#kvi-step-info").is_visible()  # the Inspect tab is the one shown
    assert inspect.locator("#kvi-strategy input").input_value().startswith("quantized")
    assert inspect.locator("#kvi-compare input").input_value() == "dynamic"
    assert inspect.locator("#kvi-prompt textarea").input_value() == SAMPLING_PROMPT
    info = inspect.locator("#kvi-diverge-info").inner_text()
    assert "Lockstep with dynamic" in info and f"first divergence: token {step}" in info, info
    inspect.locator("#kvi-diverge-plot img").wait_for(state="visible")

    ARTIFACTS.mkdir(exist_ok=True)
    inspect.screenshot(path=str(SCREENSHOT), full_page=True)
