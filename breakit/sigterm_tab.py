"""SIGTERM to a running public-mode kvlab while one tab's run is under way (driven in headless Chromium), then
check it ended within 5 s and left nothing half-written in its runs folder and ready file.

Usage: python breakit/sigterm_tab.py BASE PID RUNS_DIR READY_FILE TAB   (TAB: compare, needle, report, chat)
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

BASE, PID, RUNS, READY, TAB = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
START = {  # tab, run button, status element, text that shows the run is going
    "compare": ("Compare", "#kv-run", "#kv-run-status", "running"),
    "needle": ("Needle", "#needle-run", "#needle-status", "cell"),
    "report": ("Report", "#report-run", "#report-status", "scor"),
    "chat": ("Chat", "#kvlab-chat-send", "#kvlab-chat-turn", ""),
}


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


with sync_playwright() as pw:
    browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(BASE, timeout=120_000)
    page.wait_for_selector("#kv-run", timeout=60_000)
    tab, button, status, going = START[TAB]
    page.get_by_role("tab", name=tab, exact=True).first.click()
    time.sleep(1)
    if TAB == "chat":
        page.locator("#kvlab-chat-message textarea").fill("Tell me a long story about a cache.")
    page.locator(button).click()
    deadline = time.time() + 180
    text = ""
    while time.time() < deadline:
        text = page.locator(status).first.inner_text() if page.locator(status).count() else ""
        if TAB == "chat":
            if page.locator("#kvlab-chatbot [data-testid=bot]").count():
                break
        elif going in text.lower():
            break
        time.sleep(0.3)
    print("status before the signal:", " ".join(text.split())[:160])
    time.sleep(1.0)
    sent = time.monotonic()
    os.kill(PID, signal.SIGTERM)
    while alive(PID) and time.monotonic() - sent < 10:
        time.sleep(0.05)
    print(f"alive after {time.monotonic() - sent:.2f} s: {alive(PID)}")
    browser.close()

tmp = [str(p) for p in list(RUNS.rglob("*")) + list(READY.parent.glob(".*")) if ".tmp" in p.name]
print("temporaries:", tmp)
for line in READY.read_text().splitlines() if READY.exists() else []:
    json.loads(line)
print("ready file lines:", len(READY.read_text().splitlines()) if READY.exists() else None,
      "ends with newline:", READY.read_text().endswith("\n") if READY.exists() else None)
for record in RUNS.rglob("*.json"):
    json.loads(record.read_text())
print("runs folders:", [(p.name, sorted(c.name for c in p.iterdir())) for p in RUNS.iterdir()] if RUNS.exists() else None)
