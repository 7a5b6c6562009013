"""A Compare run on the page of a kvlab whose runs folder (KVLAB_RUNS_DIR) is full or read-only: prints the run's
status line, whether the summary and share link were shown, and any error pop-up.

Usage: python breakit/full_runs_page.py BASE
"""
import sys
import time

from playwright.sync_api import sync_playwright

BASE = sys.argv[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(BASE, timeout=120_000)
    page.wait_for_selector("#kv-run", timeout=60_000)
    box = page.locator("#kv-max-new input[type=number]").first
    box.fill("2")
    box.press("Enter")
    page.locator("#kv-run").click()
    time.sleep(3)
    page.wait_for_selector("#kv-run:not([disabled])", timeout=300_000)
    time.sleep(2)
    print("status:", " ".join(page.locator("#kv-run-status").inner_text().split())[:300])
    print("share link:", page.locator("#kv-share-link").count(), "summary visible:",
          page.locator("#kv-summary-notes").count() and page.locator("#kv-summary-notes").first.is_visible())
    print("pop-ups:", [" ".join(t.split())[:200] for t in page.locator(".toast-body").all_inner_texts()])
    browser.close()
