"""Helpers the browser tests import by name (a module of its own: every tier has a `conftest`,
and which one `import conftest` finds depends on the order pytest collected them)."""

import time


def open_page(browser, url: str):
    """A new browser context (its own gradio session) with the app loaded; close its `.context` when done."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url)
    page.wait_for_selector("#kv-run")
    return page


def wait_until(page, expression: str, timeout_s: float, poll_s: float = 0.25):
    """Evaluate `expression` (JavaScript) in `page` from here until it is truthy; returns its value. Unlike
    `page.wait_for_function`, whose checks run on the page's own animation frames or timers, this works on a
    page that is not in front (headless chromium pauses those); raises AssertionError with the last value."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = page.evaluate(expression)
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{expression!r} stayed {value!r} for {timeout_s} s")
