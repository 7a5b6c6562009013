"""The `budget_fallback` preset in Compare, in headless chromium against the real app (bundled model, CPU).

Picking the preset fills the second card's budget (3 MiB) and fallback chain; the run ends with that column
done after two switches (dynamic -> quantized -> sink), each named in its status with the reason, the plot
drawn with the switches named under it and the summary's note listing both. A screenshot goes to artifacts/.

No wall-clock time is asserted; waits only guard against a hung run.
"""

from pathlib import Path

import pytest

from test_compare_browser import pick_preset, wait_for_model, wait_for_status

pytestmark = pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "compare-budget-fallback.png"
NEW_TOKENS = 180


def test_the_budget_preset_shows_two_switches(page):
    wait_for_model(page)
    pick_preset(page, "budget_fallback")
    page.wait_for_function("document.querySelector('#kv-col-1-budget input').value === '3'")
    chain = page.locator("#kv-col-1-fallback input").input_value()
    assert chain == ("quantized:backend=hqq:residual_length=48 > sink:window_length=48")
    assert page.locator("#kv-col-0-budget input").input_value() == ""
    # Enough tokens for both switches (the second comes near token 160); fidelity is other tests' subject and
    # would only add minutes here.
    page.locator("#kv-max-new input").fill(str(NEW_TOKENS))
    page.locator("#kv-fidelity input[type=checkbox]").uncheck()

    page.click("#kv-run")
    snap = wait_for_status(page, "finished", "stopped", "✖")
    assert snap["status"].startswith("finished"), snap["status"]
    assert snap["badges"][:2] == ["done", "done"]
    status = page.locator("#kv-col-1-status").inner_text()
    assert "switched to quantized hqq int4 r48 at token" in status
    assert "switched to sink 4+44 at token" in status and "> budget 3.00 MiB" in status
    assert "switched" not in page.locator("#kv-col-0-status").inner_text()
    page.locator("#kv-plot-cache svg.marks").wait_for(state="visible")
    assert "column 2 switched to quantized hqq int4 r48 at token" in page.locator("#kv-plot-notes").inner_text()
    summary = page.locator("#kv-summary")
    summary.wait_for(state="visible")
    table = summary.inner_text()
    notes = page.locator("#kv-summary-notes").text_content()  # the whole notes, behind their toggle
    assert "dynamic · budget 3.00 MiB" in table and "switched to sink 4+44" in notes

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
