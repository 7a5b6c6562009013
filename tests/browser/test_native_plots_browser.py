"""Compare's native plots in headless chromium against the real app (bundled model, CPU).

A quickstart run (40 tokens, EOS ignored) draws gradio's native line plots in the browser (vega, SVG): the
cache plot's lines change while the columns decode (sampled during the run), a hover over the finished plot
shows a tooltip with a value and its unit (MiB), "Export PNG" renders the matplotlib PNG on request, and the
exported JSON record uploaded in another session replays into the same summary table. A
screenshot of the plots with the tooltip goes to artifacts/.

No wall-clock time is asserted; waits only guard against a hung run.
"""

import re
import time
from pathlib import Path

import pytest

from test_compare_browser import POLL_S, RUN_TIMEOUT_S, snapshot, wait_for_model, wait_for_status

pytestmark = pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "compare-native-plots.png"
LINES_JS = """() => [...document.querySelectorAll('#kv-plot-cache svg.marks .mark-line path')]
                     .map(p => p.getAttribute('d') || '').join('|')"""


def lines_while_running(page) -> list[str]:
    """The cache plot's line paths, sampled until the run leaves the `running` phase."""
    samples = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        status = snapshot(page)["status"]
        if status.startswith("running"):
            samples.append(page.evaluate(LINES_JS))
        elif status.startswith(("finished", "stopped", "✖", "columns finished", "summary ready")):
            break
        time.sleep(POLL_S)
    return samples


def hover_until_tooltip(page, plot_id: str) -> str:
    """Move the mouse over the plot's data area until vega's tooltip shows; returns its text."""
    frame = page.locator(f"#{plot_id} svg.marks .mark-group.role-frame path, #{plot_id} svg.marks rect").first
    box = frame.bounding_box() or page.locator(f"#{plot_id} svg.marks").bounding_box()
    tooltip = page.locator("#vg-tooltip-element.visible")
    for fx, fy in ((0.9, 0.5), (0.7, 0.3), (0.5, 0.5), (0.3, 0.7), (0.95, 0.2)):
        page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy, steps=8)
        try:
            tooltip.wait_for(state="visible", timeout=3000)
            return tooltip.inner_text()
        except Exception:  # noqa: BLE001 - no point near this spot: try the next one
            continue
    raise AssertionError(f"no tooltip appeared over #{plot_id}")


def newest_record() -> Path:
    """The JSON record of the latest run's export (the app runs on this machine, keeping it under runs_dir())."""
    from kvlab.ui.compare.kept_runs import runs_dir

    return max(runs_dir().glob("run-*/kvlab-run.json"), key=lambda path: path.stat().st_mtime)


def test_native_plots_update_live_and_show_a_value_with_its_unit_on_hover(page, other_page):
    wait_for_model(page)
    page.locator("#kv-max-new input").fill("40")
    page.locator("#kv-ignore-eos input[type=checkbox]").check()
    page.click("#kv-run")
    samples = [s for s in lines_while_running(page) if s]
    assert len(set(samples)) >= 2, f"the cache plot did not change while running ({len(samples)} samples)"
    snap = wait_for_status(page, "finished", "stopped", "✖")
    assert snap["status"].startswith("finished"), snap["status"]
    for plot in ("kv-plot-cache", "kv-plot-latency", "kv-plot-memory"):
        page.locator(f"#{plot} svg.marks").wait_for(state="visible")
    assert page.evaluate(LINES_JS) not in samples[:1]  # the final plot has more than the first live one
    # One legend above the plots names every column once in full (its line and its prediction's hollow
    # swatch), wrapping instead of being cut off, and a key for the prediction.
    legend = page.locator("#kv-plot-legend").inner_text()
    assert "1: dynamic" in legend and "6: no_cache" in legend and "lighter: the dense prediction" in legend
    assert "1: dynamic predicted" not in legend
    assert page.locator("#kv-plot-legend .kv-leg:not(.kv-leg-key)").count() == 6

    page.locator("#kv-plots").scroll_into_view_if_needed()
    text = hover_until_tooltip(page, "kv-plot-cache")
    assert re.search(r"\d[\d,]*\.\d+ MiB", text), text
    assert "KV cache tensors (MiB)" in text and "generated tokens" in text
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#kv-plots").screenshot(path=str(SCREENSHOT))
    latency = hover_until_tooltip(page, "kv-plot-latency")
    assert re.search(r"\d[\d,]*\.\d ms", latency), latency

    page.mouse.move(0, 0)
    page.click("#kv-export-png")
    page.wait_for_function("(document.querySelector('#kv-png') || {innerText: ''}).innerText.includes('kvlab-plots')")
    assert ".png" in page.locator("#kv-png").inner_text()

    # The exported record, uploaded in another session, gives the same summary, labelled as a replay.
    other_page.locator("#kv-replay-box").click()
    other_page.locator("#kv-replay input[type=file]").set_input_files(str(newest_record()))
    other_page.wait_for_function("document.querySelector('#kv-run-status').innerText.startsWith('replayed: measured on')",
                                 polling=250)  # a page not in front gets no animation frames
    other_page.locator("#kv-plot-cache svg.marks").wait_for(state="visible")
    assert other_page.locator("#kv-summary").inner_text() == page.locator("#kv-summary").inner_text()
