"""The Report tab in headless chromium: the plot names every column from its first frame, the figures fill in
while tokens are scored, the exported JSON record replays the table in another session, and Stop keeps what
was scored. SmolLM2, three columns, 256 context tokens and 48 scored."""

import re
from pathlib import Path

from pagekit import wait_until

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
COLUMNS_SPEC = "sink:window_length=64, quantized:backend=quanto:nbits=4, knorm:compression_ratio=0.5"
COLUMNS = ("sink 4+60", "quantized quanto int4 r128", "knorm 0.5")
SCORED = 48
MARKS = "#report-plot g.mark-symbol.role-mark path"
"""Vega's drawn points (a blank row of the frame draws none)."""
LEGEND = "#report-plot .role-legend-symbol path"
WAIT_MS = 300_000
WAIT_S = WAIT_MS / 1000
"""How long a plot may take to draw what the page already says (the shared machines run far behind at times)."""
COUNTS_JS = f"""() => [document.querySelectorAll('{LEGEND}').length, document.querySelectorAll('{MARKS}').length]"""


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def open_report(page, scored: int = SCORED) -> None:
    page.get_by_role("tab", name="Report").click()
    page.locator("#report-columns textarea").fill(COLUMNS_SPEC)
    set_slider(page, "report-context", 256)
    set_slider(page, "report-scored", scored)


def scored_now(status_text: str) -> tuple[int, int]:
    """The tokens scored per column the status line gives: (least, most)."""
    found = re.search(r"(\d+)(?:–(\d+))? of \d+ tokens", status_text)
    return int(found.group(1)), int(found.group(2) or found.group(1))


def table_cells(page, name: str) -> list[str]:
    """The cells of column `name`'s row of the table (its name first)."""
    lines = [line.strip() for line in page.locator("#report-table").inner_text().splitlines() if line.strip()]
    start = lines.index(name)
    return lines[start:start + 5]


def test_report_fills_live_replays_from_its_record_and_stop_keeps_what_was_scored(page, other_page, tmp_path):
    open_report(page)
    page.locator("#report-run").click()
    status = page.locator("#report-status")
    # 1. The first frame: every column in the plot's legend before any token is scored.
    status.filter(has_text=f"0 of {SCORED} tokens scored").wait_for(timeout=600_000)
    wait_until(page, f"document.querySelectorAll('{LEGEND}').length === {len(COLUMNS)}", WAIT_S)
    # 2. Live: the table's figures and the plot's points appear and grow while the run goes on.
    status.filter(has_text=re.compile(rf"\b[1-9]\d* of {SCORED} tokens scored")).wait_for(timeout=600_000)
    first = scored_now(status.inner_text())[1]
    assert "done in" not in status.inner_text() and "scoring" in page.locator("#report-table").inner_text()
    wait_until(page, f"document.querySelectorAll('{MARKS}').length === {len(COLUMNS)}", WAIT_S)
    assert page.evaluate(COUNTS_JS)[0] == len(COLUMNS)
    status.filter(has_text="done in").wait_for(timeout=600_000)
    assert first < SCORED
    table = page.locator("#report-table").inner_text()
    for name in COLUMNS:
        assert name in table
    assert table.count("ok") >= len(COLUMNS) and "Pareto front" in page.locator("#report-front").inner_text()
    assert page.evaluate(COUNTS_JS) == [len(COLUMNS), len(COLUMNS)]
    page.locator("#report-download a[download='report.json']").wait_for(timeout=WAIT_MS)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-tab.png"), full_page=True)
    # 3. Replay: the exported record, uploaded in another session, rebuilds the same table and plot.
    href = page.locator("#report-download a[download='report.json']").get_attribute("href")
    saved = tmp_path / "report.json"
    saved.write_bytes(page.request.get(href if href.startswith("http") else page.url.rstrip("/") + href).body())
    other_page.bring_to_front()  # headless chromium draws a plot only in the page in front
    other_page.get_by_role("tab", name="Report").click()
    other_page.locator("#report-saved input[type=file]").set_input_files(str(saved))
    other_page.locator("#report-status").filter(has_text="from 1 saved record").wait_for(timeout=WAIT_MS)
    wait_until(other_page, f"document.querySelectorAll('{MARKS}').length === {len(COLUMNS)}", WAIT_S)
    replayed = other_page.locator("#report-table").inner_text()
    assert [line for line in replayed.splitlines() if line.strip()] == [
        line for line in table.splitlines() if line.strip()]
    # 4. Stop: a second run stopped after its first figures keeps every token scored.
    page.bring_to_front()
    page.locator("#report-run").click()
    status.filter(has_text=re.compile(rf"\b[1-9]\d* of {SCORED} tokens scored")).wait_for(timeout=600_000)
    page.locator("#report-stop").click()
    status.filter(has_text="stopped after").wait_for(timeout=120_000)
    least, most = scored_now(status.inner_text())
    assert 1 <= least <= most < SCORED
    for name in COLUMNS:
        cells = table_cells(page, name)  # column, status, context, scored, PPL ratio
        assert cells[1] == "stopped" and least <= int(cells[3]) <= most and cells[4] != "-"
    wait_until(page, f"document.querySelectorAll('{MARKS}').length === {len(COLUMNS)}", WAIT_S)
