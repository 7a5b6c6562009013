"""The Perplexity tab in headless chromium: a short stream draws the curves and the segment table."""

import re
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_perplexity_streams_dense_window_and_sink(page):
    page.get_by_role("tab", name="Perplexity").click()
    set_slider(page, "ppl-tokens", 128)
    set_slider(page, "ppl-window", 32)
    page.locator("#ppl-run").click()
    status = page.locator("#ppl-status")
    status.filter(has_text=re.compile(r"done: \d+ tokens per cache")).wait_for(timeout=600_000)
    assert "127 tokens per cache" in status.inner_text()
    page.locator("#ppl-plot-ppl svg.marks").wait_for(state="visible")
    page.locator("#ppl-plot-bytes svg.marks").wait_for(state="visible")
    table = page.locator("#ppl-table").inner_text()
    for name in ("dynamic", "window 32", "sink 4+28"):
        assert name in table
    page.screenshot(path=str(ARTIFACTS / "perplexity-tab.png"), full_page=True)
