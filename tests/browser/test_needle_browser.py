"""The Needle tab in headless chromium: heatmaps fill while cells finish, the Pareto plot shows every column."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
COLUMNS = ("dynamic", "sink 4+60", "quantized quanto int4 r128")


def test_needle_heatmaps_fill_live_and_the_pareto_plot_shows_every_column(page):
    page.get_by_role("tab", name="Needle").click()
    page.locator("#needle-columns textarea").fill("dynamic, sink:window_length=64, quantized:backend=quanto:nbits=4")
    page.locator("#needle-lengths textarea").fill("160, 256")
    page.locator("#needle-depths textarea").fill("0, 0.5, 1")
    page.locator("#needle-run").click()
    status = page.locator("#needle-status")
    status.filter(has_text=re.compile(r"[1-9]\d* of 18 cells done")).wait_for(timeout=600_000)
    assert "finished" not in status.inner_text()  # seen while the grid still runs
    page.locator("#needle-heatmap-0 svg.marks").wait_for(state="visible")
    status.filter(has_text="finished in").wait_for(timeout=900_000)
    assert "18 of 18 cells done" in status.inner_text()
    for i in range(len(COLUMNS)):
        page.locator(f"#needle-heatmap-{i} svg.marks").wait_for(state="visible")
        assert page.locator(f"#needle-heatmap-{i} svg.marks path, #needle-heatmap-{i} svg.marks .mark-symbol").count() > 0
    assert not page.locator("#needle-heatmap-3").is_visible()
    page.locator("#needle-pareto svg.marks").wait_for(state="visible")
    table = page.locator("#needle-table").inner_text()
    for name in COLUMNS:
        assert name in table
    pareto = page.locator("#needle-pareto").inner_text()
    for name in COLUMNS:
        assert name in pareto  # the plot's legend names every column
    page.screenshot(path=str(DOCS / "needle.png"), full_page=True)
