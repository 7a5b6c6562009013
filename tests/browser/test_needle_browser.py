"""The Needle tab in headless chromium: heatmaps fill while cells finish (each finished cell a coloured mark,
every outcome in the legend from the start), the Pareto plot shows every column."""

import re
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
COLUMNS = ("dynamic", "sink 4+60", "quantized quanto int4 r128")
MARKS = "g.mark-symbol.role-mark path"
"""Vega's drawn points (a blank row of the frame draws none); legend swatches are `.role-legend-symbol`."""


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_needle_heatmaps_fill_live_and_the_pareto_plot_shows_every_column(page):
    page.get_by_role("tab", name="Needle").click()
    page.locator("#needle-columns textarea").fill("dynamic, sink:window_length=64, quantized:backend=quanto:nbits=4")
    page.locator("#needle-lengths textarea").fill("160, 256")
    page.locator("#needle-depths textarea").fill("0, 0.5, 1")
    page.locator("#needle-run").click()
    status = page.locator("#needle-status")
    status.filter(has_text=re.compile(r"[1-9]\d* of 18 cells done")).wait_for(timeout=600_000)
    assert "finished" not in status.inner_text()  # seen while the grid still runs
    page.locator(f"#needle-heatmap-0 {MARKS}").first.wait_for(state="attached", timeout=30_000)  # a finished cell is drawn live
    page.locator(f"#needle-pareto {MARKS}").first.wait_for(state="attached", timeout=30_000)
    assert page.locator("#needle-heatmap-0 .role-legend-symbol path").count() == 4  # every outcome's swatch
    status.filter(has_text="finished in").wait_for(timeout=900_000)
    assert "18 of 18 cells done" in status.inner_text()
    for i in range(len(COLUMNS)):
        page.locator(f"#needle-heatmap-{i} svg.marks").wait_for(state="visible")
        page.wait_for_function(f"document.querySelectorAll('#needle-heatmap-{i} {MARKS}').length === 6")
    assert not page.locator("#needle-heatmap-3").is_visible()
    page.wait_for_function(f"document.querySelectorAll('#needle-pareto {MARKS}').length === {len(COLUMNS)}")
    table = page.locator("#needle-table").inner_text()
    for name in COLUMNS:
        assert name in table
    pareto = page.locator("#needle-pareto").inner_text()
    for name in COLUMNS:
        assert name in pareto  # the plot's legend names every column
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "needle.png"), full_page=True)


def test_stop_ends_a_needle_run_after_the_cell_in_progress_and_keeps_its_records(page):
    page.get_by_role("tab", name="Needle").click()
    page.locator("#needle-columns textarea").fill("dynamic")
    page.locator("#needle-lengths textarea").fill("128")
    page.locator("#needle-depths textarea").fill(", ".join(f"{d / 10:g}" for d in range(11)))
    page.locator("#needle-run").click()
    status = page.locator("#needle-status")
    status.filter(has_text=re.compile(r"[1-9]\d* of 11 cells done")).wait_for(timeout=600_000)
    page.locator("#needle-stop").click()
    status.filter(has_text="stopped after").wait_for(timeout=120_000)
    done = int(re.search(r"(\d+) of 11 cells done", status.inner_text()).group(1))
    assert 1 <= done < 11
    page.wait_for_function(f"document.querySelectorAll('#needle-heatmap-0 {MARKS}').length === {done}")
    record = page.locator("#needle-record").inner_text()
    assert "needle" in record and ".json" in record and ".csv" in record
