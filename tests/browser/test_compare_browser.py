"""The Compare tab in headless chromium against the real app (bundled model, CPU).

- Picking a preset fills the form; Run streams text into at least three columns
  while the run is still going (sampled several times, so text dumped at the end
  would fail), then the summary table appears before the fidelity figures (its teacher-forced cells
  say "scoring…"), which fill in afterwards, and the native plots; at 1400 px wide the summary fits
  without an inner horizontal scroll. A screenshot of the
  finished page goes to artifacts/.
- On a long run (1500 tokens, EOS ignored) another tab's Run waits for its turn
  and shows its position and wait; Stop halts every column, and the next Run works; a Stop during that run's
  fidelity pass keeps its summary and says which figures were not scored.

No wall-clock time is asserted; waits only guard against a hung run.
"""

import time
from pathlib import Path

from pagekit import wait_until

QUICKSTART_PROMPT = "Explain in three sentences why the sky is blue."
SAMPLING_PROMPT = "Give me three creative names for a coffee shop run by cats."
QUICKSTART_STRATEGIES = ["dynamic", "static", "quantized", "quantized", "sink", "no_cache", "(none)", "(none)"]
RUNNING_COLUMNS = range(6)  # every quickstart column runs on a CPU
RUN_TIMEOUT_S = 900
MODEL_TIMEOUT_MS = 600_000
"""The page's model is ready after its load and the opening columns' one-time warm-up: minutes on a busy machine."""
POLL_S = 0.3
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "compare-quickstart.png"

SNAPSHOT_JS = """() => {
  const q = (sel) => document.querySelector(sel);
  const slots = [...Array(8).keys()];
  return {
    status: (q('#kv-run-status') || {}).innerText || '',
    texts: slots.map(i => { const t = q(`#kv-col-${i}-text textarea`); return t ? t.value : null; }),
    badges: slots.map(i => { const b = q(`#kv-col-${i}-status .kv-badge`); return b ? b.innerText.trim() : null; }),
  };
}"""


def snapshot(page) -> dict:
    return page.evaluate(SNAPSHOT_JS)


SUMMARY_WIDTH_PX = 1400
INNER_SCROLLS = """() => [...document.querySelectorAll('#kv-summary, #kv-summary *')]
    .filter(e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.tagName}.${String(e.className).split(' ').join('.')}: ${e.scrollWidth} > ${e.clientWidth} px`)"""
"""Every element of the summary table that scrolls sideways (content wider than its box)."""

ENDLESS_ANIMATIONS = """() => document.getAnimations()
    .filter(a => a.playState === 'running' && a.effect && a.effect.getComputedTiming().iterations === Infinity)
    .map(a => (a.animationName || 'animation') + ' on .' + String((a.effect.target || {}).className || '?').split(' ').join('.'))"""


def wait_for_model(page) -> None:
    page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')",
                           timeout=MODEL_TIMEOUT_MS)


def pick_preset(page, name: str) -> None:
    page.locator("#kv-preset input").click()
    page.get_by_role("option", name=name, exact=True).click()


def strategies(page) -> list[str]:
    """The strategy picked in each column (the dropdown shows its label, e.g. `offloaded  ⊘ unavailable here`)."""
    return [page.locator(f"#kv-col-{i}-strategy input").input_value().split("  ")[0] for i in range(8)]


def wait_for_status(page, *prefixes: str) -> dict:
    """Poll until the run status line starts with one of `prefixes`; returns that snapshot."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        snap = snapshot(page)
        if snap["status"].startswith(prefixes):
            return snap
        time.sleep(POLL_S)
    raise AssertionError(f"the run status never started with {prefixes}; last: {snap['status']!r}")


def test_quickstart_streams_into_columns_then_summarizes(page):
    wait_for_model(page)
    pick_preset(page, "sampling")
    page.wait_for_function(f"document.querySelector('#kv-prompt textarea').value === {SAMPLING_PROMPT!r}")
    pick_preset(page, "quickstart")
    page.wait_for_function(f"document.querySelector('#kv-prompt textarea').value === {QUICKSTART_PROMPT!r}")
    assert strategies(page) == QUICKSTART_STRATEGIES
    assert page.locator("#kv-col-2-knob-2 input").input_value() == "16"  # residual_length from the preset
    page.locator("#kv-max-new input").fill("32")

    page.click("#kv-run")
    running, endless = [], set()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        snap = snapshot(page)
        endless.update(page.evaluate(ENDLESS_ANIMATIONS))
        if snap["status"].startswith("running"):
            running.append(snap["texts"])
        elif snap["status"].startswith(("finished", "stopped", "✖", "columns finished", "summary ready")):
            break
        time.sleep(POLL_S)
    grew = set()
    for column in RUNNING_COLUMNS:
        seen = [texts[column] for texts in running if texts[column]]
        if any(later.startswith(earlier) and len(later) > len(earlier) for earlier in seen for later in seen):
            grew.add(column)
    assert len(grew) >= 3, f"text grew while running in columns {sorted(grew)} only ({len(running)} samples)"

    # Nothing animates forever while the run is timed (gradio's pulse on the streaming status is switched off).
    assert not endless, f"endless animations during the run: {sorted(endless)}"

    # The summary appears before the fidelity pass: its teacher-forced cells say they are being scored.
    snap = wait_for_status(page, "summary ready", "finished", "stopped", "✖")
    assert snap["status"].startswith("summary ready"), snap["status"]
    assert "scoring…" in page.locator("#kv-summary").inner_text()
    snap = wait_for_status(page, "finished", "stopped", "✖")
    assert snap["status"].startswith("finished"), snap["status"]
    assert "scoring…" not in page.locator("#kv-summary").inner_text() and "fidelity: 6 of 6" in snap["status"]
    assert snap["badges"][:6] == ["done"] * 6
    assert all(snap["texts"][i] for i in RUNNING_COLUMNS)
    page.locator("#kv-plot-cache svg.marks").wait_for(state="visible")
    summary = page.locator("#kv-summary")
    summary.wait_for(state="visible")
    table = summary.inner_text()
    for name in ("no_cache", "dynamic", "static", "quantized quanto int4 r16", "quantized hqq int4 r16", "sink 4+28"):
        assert name in table
    assert "★" in table
    assert page.locator("#kv-exports").inner_text().count("kvlab-") >= 2  # record and CSV; the PNG on request

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.set_viewport_size({"width": SUMMARY_WIDTH_PX, "height": 1000})
    page.wait_for_timeout(500)  # the table lays out again at the new width
    assert page.evaluate(INNER_SCROLLS) == [], f"the summary scrolls sideways at {SUMMARY_WIDTH_PX} px"


def test_stop_halts_every_column_a_second_tab_waits_and_the_next_run_works(page, other_page):
    wait_for_model(page)
    assert strategies(page) == QUICKSTART_STRATEGIES  # the page opens on the quickstart preset
    page.locator("#kv-max-new input").fill("1500")
    page.locator("#kv-ignore-eos input[type=checkbox]").check()
    page.click("#kv-run")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        snap = snapshot(page)
        if snap["status"].startswith("running") and sum(bool(snap["texts"][i]) for i in RUNNING_COLUMNS) >= 3:
            break
        time.sleep(POLL_S)

    # Another tab's run waits in line (one model-bound run at a time) and shows its place and wait.
    other_page.click("#kv-run")
    wait_until(other_page, "document.querySelector('#kv-run-status').innerText.startsWith('waiting: position 1, "
               "about ')", 60)  # read from here: a page not in front gets no animation frames or timers
    other_page.click("#kv-stop")

    page.click("#kv-stop")
    snap = wait_for_status(page, "stopped", "finished", "✖")
    assert snap["status"].startswith("stopped"), snap["status"]
    assert snap["badges"][:6] == ["stopped"] * 6
    time.sleep(2)
    assert snapshot(page)["texts"] == snap["texts"], "a column kept generating after Stop"
    wait_until(other_page, "document.querySelector('#kv-run-status').innerText.includes('stopped before the run "
               "started')", 60)

    page.locator("#kv-run:not([disabled])").wait_for()
    page.locator("#kv-max-new input").fill("24")
    page.locator("#kv-ignore-eos input[type=checkbox]").uncheck()
    page.click("#kv-run")
    # Stop during the fidelity pass: the summary shown before it stays, the figures not reached say so.
    snap = wait_for_status(page, "summary ready", "finished", "stopped", "✖")
    assert snap["status"].startswith("summary ready"), snap["status"]
    page.click("#kv-stop")
    snap = wait_for_status(page, "stopped", "finished", "✖")
    assert snap["status"].startswith("stopped") and "(stopped)" in snap["status"], snap["status"]
    assert snap["badges"][:6] == ["done"] * 6
    # The table is re-rendered after the status line (a heavier component): wait for it, then read it.
    wait_until(page, "!document.querySelector('#kv-summary').innerText.includes('scoring…')", RUN_TIMEOUT_S)
    table = page.locator("#kv-summary").inner_text()
    assert all(name in table for name in ("dynamic", "static", "sink 4+28", "no_cache"))
    assert "fidelity not scored: stopped" in page.locator("#kv-summary-notes").inner_html()


def test_the_model_picker_offers_both_bundled_models_and_the_chat_box_follows_the_model(page):
    """The picker lists each bundled model with its one-line description; the Gemma preset picks the base
    model, whose prompt is plain text (the chat box off and locked); the quickstart preset gives it back."""
    wait_for_model(page)
    page.locator("#kv-model input").click()
    for line in ("bundled — SmolLM2-135M-Instruct", "bundled:gemma-3-270m — gemma-3-270m"):
        assert page.get_by_role("option").filter(has_text=line).count() == 1
    page.keyboard.press("Escape")
    pick_preset(page, "hybrid_sliding")
    chat = page.locator("#kv-chat input[type=checkbox]")
    page.wait_for_function("document.querySelector('#kv-chat input[type=checkbox]').disabled")
    assert "gemma-3-270m" in page.locator("#kv-model input").input_value() and not chat.is_checked()
    assert strategies(page)[:5] == ["dynamic", "dynamic", "sliding_window", "static", "no_cache"]
    pick_preset(page, "quickstart")
    page.wait_for_function("!document.querySelector('#kv-chat input[type=checkbox]').disabled")
    assert chat.is_checked()
