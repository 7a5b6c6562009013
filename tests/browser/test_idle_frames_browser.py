"""The page's idle frames (`kvlab.ui.serving.IdleFramesMiddleware`), in headless chromium.

- The served app page, left alone, asks the browser for a few animation frames a second, not gradio's 60
  to 80 (counted at the browser's own `requestAnimationFrame`, below kvlab's script).
- The script itself, on a bare page: callbacks run in order with their frame's timestamp, a cancelled one
  does not run (also when a callback of the same frame cancels it), an error in one does not stop the
  others, a loop that changes the page every frame keeps running at full rate, and once the page is idle a
  waiting callback runs as soon as the page changes or the user's input arrives (with a 60 s idle interval,
  so a pass cannot come from the timer); the wait between idle batches doubles up to its ceiling and starts
  again from the first wait after a change (the delays the script asks `setTimeout` for).

No wall-clock time is asserted: counts over a span, and order.
"""

import time

import pytest

from kvlab.ui.serving import IDLE_FRAME_MS, idle_frame_script

pytestmark = pytest.mark.browser

COUNT_NATIVE_FRAMES = """(() => {
  window.__nativeFrames = 0;
  const raf = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (cb) => { window.__nativeFrames++; return raf(cb); };
})()"""
IDLE_SPAN_S = 3.0


def test_the_idle_app_page_asks_for_a_few_frames_a_second(browser, app_url):
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.add_init_script(COUNT_NATIVE_FRAMES)  # runs before the page's own scripts: counts what reaches the browser
        page.goto(app_url)
        page.wait_for_selector("#kv-run")
        page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')",
                               timeout=240_000)
        time.sleep(2.0)  # the page settles
        before = page.evaluate("window.__nativeFrames")
        time.sleep(IDLE_SPAN_S)
        per_s = (page.evaluate("window.__nativeFrames") - before) / IDLE_SPAN_S
        # gradio alone: 60-80 a second for as long as the page is open; kvlab's script: at most 1000 / IDLE_FRAME_MS,
        # fewer as its wait grows.
        assert per_s <= 2 * 1000 / IDLE_FRAME_MS, f"{per_s:.1f} animation frames a second on an idle page"
        assert page.evaluate("window.__kvlabIdleFrames.slowed") > 0
    finally:
        context.close()


BARE_PAGE = "<!doctype html><html><head><script>{script}</script></head><body><p id='p'>0</p></body></html>"


@pytest.fixture
def bare(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.set_content(BARE_PAGE.format(script=idle_frame_script(idle_frames=5, idle_ms=60_000, idle_max_ms=60_000)))
    try:
        yield page
    finally:
        context.close()


def test_callbacks_keep_their_order_timestamp_cancel_and_errors(bare):
    result = bare.evaluate("""() => new Promise((done) => {
      const seen = [], errors = [];
      window.addEventListener('error', (e) => errors.push(String(e.message)));
      window.requestAnimationFrame((t) => seen.push(['a', typeof t]));
      const dropped = window.requestAnimationFrame(() => seen.push(['cancelled', 0]));
      window.requestAnimationFrame(() => { throw new Error('boom'); });
      window.requestAnimationFrame((t) => seen.push(['b', typeof t]));
      window.cancelAnimationFrame(dropped);
      let later = 0;  // cancelled by a callback of the same frame, before it ran: it must not run
      window.requestAnimationFrame(() => window.cancelAnimationFrame(later));
      later = window.requestAnimationFrame(() => seen.push(['cancelled in the frame', 0]));
      window.requestAnimationFrame(() => window.requestAnimationFrame(() => setTimeout(() => done({seen, errors}), 50)));
    })""")
    assert result["seen"] == [["a", "number"], ["b", "number"]]
    assert any("boom" in e for e in result["errors"])


def test_a_loop_that_changes_the_page_keeps_full_rate_and_an_idle_one_waits_for_a_change(bare):
    # 120 frames that each change the page: with a 60 s idle interval they could not finish if slowed.
    frames = bare.evaluate("""() => new Promise((done) => {
      let n = 0;
      const step = () => { document.getElementById('p').textContent = String(++n);
                           if (n < 120) window.requestAnimationFrame(step); else done(n); };
      window.requestAnimationFrame(step);
    })""")
    assert frames == 120
    # A loop that changes nothing: after idle_frames (5) frames it is slowed to one batch per 60 s.
    bare.evaluate("""() => { window.__idleRuns = 0;
      const spin = () => { window.__idleRuns++; window.requestAnimationFrame(spin); };
      window.requestAnimationFrame(spin); }""")
    bare.wait_for_function("window.__kvlabIdleFrames.slowed > 0", polling=100)
    runs = bare.evaluate("window.__idleRuns")
    time.sleep(1.0)
    assert bare.evaluate("window.__idleRuns") == runs  # waiting for its slowed batch
    # A change to the page runs the waiting callback at once (long before the 60 s), then slows again.
    bare.evaluate("document.getElementById('p').textContent = 'changed'")
    bare.wait_for_function(f"window.__idleRuns > {runs}", polling=100)
    # So does the user's input that changes nothing in the page (here a resize).
    bare.wait_for_function("window.__kvlabIdleFrames.slowed > 1", polling=100)
    runs = bare.evaluate("window.__idleRuns")
    bare.evaluate("window.dispatchEvent(new Event('resize'))")
    bare.wait_for_function(f"window.__idleRuns > {runs}", polling=100)


def test_the_idle_wait_doubles_up_to_its_ceiling_and_starts_again_after_a_change(browser):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        # The delays the script asks for, read at setTimeout (wrapped before the script runs; the waits of
        # Playwright's own polling are left out: the script's callback is the one that asks for a frame).
        spy = "window.__delays = []; const st = window.setTimeout.bind(window);" \
              "window.setTimeout = (cb, ms, ...a) => {" \
              " if (String(cb).includes('nativeRaf')) window.__delays.push(ms); return st(cb, ms, ...a); };"
        page.set_content(BARE_PAGE.format(script=spy + idle_frame_script(idle_frames=3, idle_ms=10, idle_max_ms=80)))
        page.evaluate("""() => { const spin = () => window.requestAnimationFrame(spin); spin(); }""")
        page.wait_for_function("window.__delays.length >= 6", polling=50)
        assert page.evaluate("window.__delays.slice(0, 6)") == [10, 20, 40, 80, 80, 80]
        page.evaluate("window.__delays = []; document.getElementById('p').textContent = 'changed'")
        page.wait_for_function("window.__delays.length >= 3", polling=50)
        assert page.evaluate("window.__delays.slice(0, 3)") == [10, 20, 40]
    finally:
        context.close()


def test_the_bench_waits_for_the_page_to_go_idle_even_with_no_loop_of_its_own(browser):
    """`kvlab.bench.app_browser._wait_until_idle`, used before the CLI run between two browser runs: on a page
    whose script sees no frame requests at all, it asks for frames itself and returns once IDLE_BATCHES more
    slowed batches have passed; on a page without the script it returns at once."""
    from kvlab.bench.app_browser import IDLE_BATCHES, _wait_until_idle

    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        said = []
        page.set_content(BARE_PAGE.format(script=idle_frame_script(idle_frames=3, idle_ms=20, idle_max_ms=40)))
        _wait_until_idle(page, said.append)
        assert page.evaluate("window.__kvlabIdleFrames.slowed") >= IDLE_BATCHES and said == []
        page.set_content(BARE_PAGE.format(script="window.x = 1;"))
        _wait_until_idle(page, said.append)
        assert said == []
    finally:
        context.close()
