"""The Inspect tab in headless chromium against the real app (bundled model, CPU).

It opens on a sink cache with a 32-token window; the first Step prefills the prompt (longer than the window)
in chunks, two Step ×10 clicks go on past the window, and the token strip shows the 4 sinks, the evicted
middle and the 28 most recent tokens, the layer table says 32 held of 32, and the code shows this step's
positions. A screenshot goes to artifacts/.

No wall-clock time is asserted; waits only guard against a hung run.
"""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)

STEP_TIMEOUT_MS = 600_000
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "inspect-sink.png"

STRIP_JS = """() => {
  const rows = [...document.querySelectorAll('#kvi-strip .kv-strip-row')];
  return rows.map(row => ({
    layers: row.dataset.layers,
    sink: row.querySelectorAll('.kv-st-sink').length,
    evicted: row.querySelectorAll('.kv-st-evicted').length,
    held: row.querySelectorAll('.kv-st-held').length,
  }));
}"""


def wait_for_step(page, index: int) -> None:
    """Wait until the page shows the token with 0-based `index` (as Compare and the CLI count)."""
    page.wait_for_function(
        f"document.querySelector('#kvi-step-info').innerText.includes('Token {index} ')", timeout=STEP_TIMEOUT_MS)


def test_inspect_steps_a_sink_cache_past_its_window_and_shows_eviction(page):
    page.get_by_role("tab", name="Inspect").click()
    page.locator("#kvi-step").wait_for(state="visible")
    assert page.locator("#kvi-strategy input").input_value() == "sink"
    assert page.locator("#kvi-knob-0 input").input_value() == "32"

    page.click("#kvi-step")
    wait_for_step(page, 0)
    assert "forward 1 of" in page.locator("#kvi-step-info").inner_text()  # the prompt streams in chunks
    for index in (10, 20):
        page.click("#kvi-step10")
        wait_for_step(page, index)

    rows = page.evaluate(STRIP_JS)
    assert [row["layers"] for row in rows] == ["0-29"]  # 30 identical layers collapse into one row
    (row,) = rows
    assert row["sink"] == 4 and row["held"] == 28 and row["evicted"] > 20
    info = page.locator("#kvi-step-info").inner_text()
    assert re.search(r"`?position_ids`? \[\[32\]\]", info), info
    table = page.locator("#kvi-layers").inner_text()
    assert "SinkLayer" in table and "32 / 32" in table and "0–29 (×30)" in table
    top = page.locator("#kvi-top").inner_text()
    assert "dynamic: p" in top
    code = page.locator("#kvi-code").inner_text()
    assert "prefill_in_chunks" in code and "# ← [[32]]" in code
    assert "20 of 48 steps" in page.locator("#kvi-status").inner_text() or \
        "21 of 48 steps" in page.locator("#kvi-status").inner_text()

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    page.locator("#kvi-max-new input").fill("0")
    page.click("#kvi-step")
    page.wait_for_function("document.querySelector('#kvi-status').innerText.includes('new tokens must be')",
                           timeout=STEP_TIMEOUT_MS)
