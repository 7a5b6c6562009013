"""Replay a hostile Compare record in the Compare tab, print what the page says, follow its share link (if one
is given) in a fresh page, and scan both pages' DOM for elements made from the record's text.

Usage: python breakit/replay_share_probe.py http://127.0.0.1:7911/ /tmp/breakit/records/hostile_compare.json
"""
import re
import sys
import time

from playwright.sync_api import sync_playwright

sys.path.insert(0, "breakit")
from dom_markup_probe import SCAN  # noqa: E402

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911/"
REC = sys.argv[2] if len(sys.argv) > 2 else "/tmp/breakit/records/hostile_compare.json"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def main():
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page()
        page.goto(URL)
        page.wait_for_selector("text=Run", timeout=60000)
        page.get_by_text("Replay a recorded run").first.click()
        time.sleep(2)
        page.locator("input[type=file]").first.set_input_files(REC)
        time.sleep(10)
        text = page.evaluate("() => document.body.innerText")
        print("--- compare tab after replay (lines mentioning the record) ---")
        for line in text.splitlines():
            if line.strip() and any(w in line for w in ("record", "B0", "<img", "share", "run-", "replay", "⚠")):
                print("   ", line[:220])
        print("DOM hits:", sorted(set(page.evaluate(SCAN))))
        links = page.evaluate("() => Array.from(document.querySelectorAll('a')).map(a => a.href)")
        share = [l for l in links if "run=" in l] or re.findall(r"https?://\S*\?run=run-[0-9a-f]{32}", text)
        print("share links:", share[:3])
        page.screenshot(path="/tmp/breakit/replay.png", full_page=True)
        if share:
            other = browser.new_page()
            other.goto(share[0])
            time.sleep(12)
            print("shared page DOM hits:", sorted(set(other.evaluate(SCAN))))
            for line in other.evaluate("() => document.body.innerText").splitlines():
                if "<img" in line or "B0" in line:
                    print("   shared:", line[:200])
        browser.close()


if __name__ == "__main__":
    main()
