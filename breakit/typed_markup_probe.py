"""Markup a visitor types (share ids in the address, the model box, a column spec, the chat box, the Plan
model box) in headless Chromium; scans the DOM after each for elements made from the text.

Usage: python breakit/typed_markup_probe.py BASE
"""
import sys
import time
from urllib.parse import quote

from playwright.sync_api import sync_playwright

sys.path.insert(0, "breakit")
from dom_markup_probe import SCAN  # noqa: E402

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
EVIL = ('<img src="http://example.invalid/t.png" data-bk="T" onerror="window.__bk=1"><b data-bk="T">BT</b>'
        '[LT](javascript:alert(1)) ![IT](http://example.invalid/m.png) **ST**')


def scan(page, what):
    time.sleep(4)
    hits = sorted(set(h for h in page.evaluate(SCAN) if "vega-bindings" not in h))
    lines = [l for l in page.evaluate("() => document.body.innerText").splitlines() if "BT" in l or "example.invalid" in l]
    print(f"{what}: DOM hits {hits}; lines {[l[:140] for l in lines[:3]]}")


with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    for run in (EVIL, "../../../etc/passwd", "run-" + "0" * 32, "run-" + "a" * 5000, "run-../../x", "%00"):
        page = browser.new_page()
        page.goto(f"{BASE}/?run={quote(run)}")
        page.wait_for_selector("text=Run", timeout=60000)
        scan(page, f"?run={run[:30]!r}")
        page.close()
    page = browser.new_page()
    page.goto(BASE)
    page.wait_for_selector("text=Run", timeout=60000)
    box = page.get_by_label("Model").first
    box.fill(EVIL)
    box.press("Enter")
    page.get_by_role("button", name="Load").first.click()
    scan(page, "Compare model box + Load")
    page.get_by_role("tab", name="Chat").click()
    time.sleep(2)
    msg = page.get_by_role("textbox", name="Message").first
    msg.fill(EVIL)
    msg.press("Enter")
    time.sleep(20)
    scan(page, "Chat message")
    page.get_by_role("tab", name="Plan").click()
    time.sleep(2)
    pbox = page.get_by_label("Model").nth(2) if page.get_by_label("Model").count() > 2 else page.get_by_label("Model").last
    try:
        pbox.fill(EVIL)
        pbox.press("Enter")
        page.get_by_role("button", name="Plan").first.click()
        scan(page, "Plan model box")
    except Exception as err:  # noqa: BLE001
        print("plan box:", type(err).__name__, str(err)[:100])
    page.screenshot(path="/tmp/breakit/typed.png", full_page=True)
    browser.close()
