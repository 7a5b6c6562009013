"""Upload hostile records (breakit/hostile_record.py) into every upload box of a running kvlab, and type
hostile text into the prompt boxes, then scan the DOM for elements created from the text.

Usage: python breakit/dom_markup_probe.py http://127.0.0.1:7911/ /tmp/breakit/records
Prints every element carrying data-bk, every javascript: link, every image from example.invalid, every
password input, and every request the page made to example.invalid; and the status lines.
"""
import json
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911/"
RECS = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/breakit/records")
SCAN = """() => {
  const out = [];
  for (const el of document.querySelectorAll('[data-bk]')) out.push('data-bk ' + el.tagName + ' ' + el.getAttribute('data-bk'));
  for (const el of document.querySelectorAll('a[href^="javascript"]')) out.push('jslink ' + el.outerHTML.slice(0, 120));
  for (const el of document.querySelectorAll('img')) if ((el.src||'').includes('example.invalid')) out.push('img ' + el.src);
  for (const el of document.querySelectorAll('input[type=password]')) out.push('password input');
  for (const el of document.querySelectorAll('form')) out.push('form ' + el.outerHTML.slice(0, 80));
  for (const el of document.querySelectorAll('b, strong')) if (/^[BS]\\d+$/.test(el.textContent)) out.push('bold ' + el.textContent);
  for (const el of document.querySelectorAll('.katex')) if (/x/.test(el.textContent)) out.push('katex ' + el.textContent.slice(0, 30));
  if (window.__bk !== undefined) out.push('SCRIPT RAN ' + window.__bk);
  return out;
}"""


def upload_boxes(page):
    return page.evaluate("""() => Array.from(document.querySelectorAll('input[type=file]')).map((el, i) => {
        const b = el.closest('.block'); return [i, b ? b.innerText.slice(0, 60).replace(/\\n/g, ' ') : ''];})""")


def main():
    fields = json.loads((RECS / "fields.json").read_text())
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--headless", "--no-sandbox", "--disable-gpu",
                                           "--disable-background-networking"])
        page = browser.new_page()
        hits = []
        page.on("request", lambda req: hits.append(req.url) if "example.invalid" in req.url else None)
        page.goto(URL)
        page.wait_for_selector("text=Run", timeout=60000)
        time.sleep(3)
        page.get_by_text("Replay a recorded run").first.click()
        time.sleep(2)
        boxes = upload_boxes(page)
        print("upload boxes (compare):", boxes)
        files = [RECS / "hostile_compare.json", RECS / "hostile_needle.json"] + \
            [p for p in RECS.iterdir() if p.name.startswith("<img")]
        for index, label in boxes + [("report", "")]:
            if index == "report":
                page.get_by_role("tab", name="Report").click()
                time.sleep(3)
                more = upload_boxes(page)
                print("upload boxes now:", more)
                index = more[-1][0]
                label = more[-1][1]
            for f in files:
                tab_text = label
                # show the tab holding the box
                page.evaluate("""(i) => { const el = document.querySelectorAll('input[type=file]')[i];
                    let n = el; while (n && !(n.getAttribute && n.getAttribute('role') === 'tabpanel')) n = n.parentElement;
                    if (n) { const id = n.getAttribute('aria-labelledby') || n.id; }
                }""", index)
                try:
                    page.locator("input[type=file]").nth(index).set_input_files(str(f))
                except Exception as err:  # noqa: BLE001
                    print("upload failed", index, f.name, type(err).__name__)
                    continue
                time.sleep(6)
                found = page.evaluate(SCAN)
                print(f"box {index} ({tab_text[:30]!r}) file {f.name[:30]!r}: {len(found)} hits")
                for item in sorted(set(found)):
                    marker = item.split()[-1]
                    print("   ", item, "<-", fields.get(marker, ""))
        print("requests to example.invalid:", sorted(set(hits))[:20])
        page.screenshot(path="/tmp/breakit/after_uploads.png", full_page=True)
        print("status-like text:")
        for line in page.evaluate("() => document.body.innerText").splitlines():
            if any(w in line.lower() for w in ("record", "refus", "error", "not a", "loaded")):
                print("   ", line[:200])
        browser.close()


if __name__ == "__main__":
    main()
