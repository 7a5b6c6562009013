"""A record holding a lone surrogate (JSON "\\ud800", valid JSON) replayed in Compare breaks the page's event
stream (gradio cannot encode it), and its share link is kept: open the link in a browser and see what a visitor
who follows it gets; then press Run on that page and see whether the page still works.

Usage: python breakit/surrogate_share.py BASE SHARE_ID
"""
import sys
import time

from playwright.sync_api import sync_playwright

BASE, SHARE = sys.argv[1], sys.argv[2]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{BASE}/?run={SHARE}")
    time.sleep(15)
    text = page.evaluate("() => document.body.innerText")
    print("page mentions 'replayed':", "replayed" in text, "| 'error':", [l for l in text.splitlines() if "rror" in l][:5])
    print("console errors:", errors[:5])
    page.screenshot(path="/tmp/breakit/surrogate_share.png", full_page=False)
    browser.close()
