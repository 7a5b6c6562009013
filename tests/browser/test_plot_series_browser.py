"""Every series of a run is drawn, in headless chromium against the real app (class 1 of the first-visit review).

Perplexity streams its caches in turns, so the first frame it sends holds one cache only; gradio's native plot
fixes its colour domain from the frame it builds its spec from, and a cache that appears later was never
drawn. Two runs in one page (their caches differ: window 16, then window 32), each stopped after a few tokens, must each draw a line and a
legend entry for every cache, in the cache's colour. No wall-clock time is asserted.
"""

import re
import time

from test_perplexity_browser import set_slider

from kvlab.ui.shared.plot_frames import perplexity_colors

RUN_TIMEOUT_S = 600
DRAWN_JS = """(plot) => ({
  strokes: [...document.querySelectorAll(`#${plot} svg.marks .mark-line path`)]
             .filter(p => p.getAttribute('stroke') && (p.getAttribute('d') || '').length > 20)
             .map(p => p.getAttribute('stroke').toLowerCase()),
  legend: [...document.querySelectorAll(`#${plot} svg.marks .role-legend-label text`)].map(t => t.textContent),
})"""


def drawn(page, plot: str, expected: dict[str, str]) -> dict:
    """The plot's drawn line colours and legend labels, once they hold every expected series (or at the
    deadline, for the assertion to show)."""
    deadline = time.monotonic() + 30
    while True:
        seen = page.evaluate(DRAWN_JS, plot)
        if (set(seen["strokes"]) >= set(expected.values()) and set(seen["legend"]) >= set(expected)) \
                or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def run_perplexity(page, window: int) -> list[str]:
    """One run with `window`, stopped once every cache has scored a few tokens (the series are all there by
    then; the rest of the text adds points, not series)."""
    set_slider(page, "ppl-window", window)
    page.locator("#ppl-run").click()
    status = page.locator("#ppl-status")
    status.filter(has_text=re.compile(r"token ([3-9]|\d\d+) of")).wait_for(timeout=RUN_TIMEOUT_S * 1000)
    page.locator("#ppl-stop").click()
    status.filter(has_text=re.compile(r"(done|stopped): \d+ tokens per cache")).wait_for(timeout=RUN_TIMEOUT_S * 1000)
    table = page.locator("#ppl-table").inner_text()
    labels = ["dynamic", f"window {window}", f"sink 4+{window - 4}"]
    assert all(label in table for label in labels), table
    return labels


def test_perplexity_draws_every_cache_of_each_run(page):
    page.get_by_role("tab", name="Perplexity").click()
    set_slider(page, "ppl-tokens", 64)
    for window in (16, 32):
        labels = run_perplexity(page, window)
        colors = perplexity_colors(labels)
        for plot in ("ppl-plot-ppl", "ppl-plot-bytes"):
            seen = drawn(page, plot, colors)
            assert sorted(set(seen["strokes"])) == sorted(colors.values()), (window, plot, seen)
            assert sorted(seen["legend"]) == sorted(labels), (window, plot, seen)
