"""Type markup into every free-text field of every tab of a running kvlab, run or submit, and scan the DOM.

Each field gets its own marker (`M<n>`) inside the payload: raw HTML (an image whose error handler sets a
global, a bold, a form with a password field, a frame), a Markdown image and a `javascript:` link, an entity,
a `</textarea>`, a Markdown heading and table, and a 3,000-character line without spaces. After each submit the
page is scanned for elements carrying a marker, `javascript:` links, images/requests to the hostile address,
headings/tables/bold made from the text, and horizontal overflow of the page (layout broken by the long line).

Usage: python breakit/page_markup_probe.py BASE [TAB ...]
"""
import os
import sys
import time

from playwright.sync_api import sync_playwright

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7860"
ONLY = set(sys.argv[2:])
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
HOST = "http://127.0.0.1:9"
SHOTS = os.environ.get("SHOTS", ".")
LONG = "W" * 400


def payload(tag: str, long: bool = True) -> str:
    text = (f'<img src="{HOST}/{tag}.png" data-bk="{tag}" onerror="window.__bk=\'{tag}\'"><b data-bk="{tag}">B{tag}</b>'
            f'<form data-bk="{tag}"><input type="password"></form><iframe data-bk="{tag}" src="{HOST}/{tag}.html"></iframe>'
            f' [L{tag}](javascript:alert(1)) ![I{tag}]({HOST}/{tag}-md.png) &lt;{tag}&amp; </textarea>'
            f'\n# H{tag}\n\n| T{tag} | b |\n|---|---|\n| 1 | 2 |\n**S{tag}**')
    return text + ("\n" + LONG if long else "")


SCAN = """(tags) => {
  const out = [];
  for (const el of document.querySelectorAll('[data-bk]')) out.push('element ' + el.tagName + ' ' + el.getAttribute('data-bk'));
  for (const el of document.querySelectorAll('a[href^="javascript"]')) out.push('jslink ' + el.outerHTML.slice(0, 100));
  for (const el of document.querySelectorAll('img')) if ((el.src||'').includes('127.0.0.1:9')) out.push('img ' + el.src);
  for (const el of document.querySelectorAll('input[type=password], iframe')) out.push(el.tagName + ' ' + el.outerHTML.slice(0,80));
  for (const el of document.querySelectorAll('h1,h2,h3,h4,h5,h6,table th,table td,b,strong,em,a'))
    for (const t of tags) if ((el.textContent||'').trim().startsWith('H' + t) || (el.textContent||'').trim() === 'T' + t
        || (el.textContent||'').trim() === 'S' + t || (el.textContent||'').trim() === 'L' + t || (el.textContent||'').trim() === 'B' + t)
      out.push('markdown ' + el.tagName + ' ' + el.textContent.slice(0, 30));
  if (window.__bk !== undefined) out.push('SCRIPT RAN ' + window.__bk);
  const w = document.documentElement.scrollWidth;
  if (w > window.innerWidth + 4) out.push('page overflows horizontally: ' + w + 'px');
  return out;
}"""


class Probe:
    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.set_default_timeout(30_000)
        self.requests = []
        self.page.on("request", lambda r: self.requests.append(r.url) if r.url.startswith(HOST) else None)
        self.page.on("dialog", lambda d: (self.requests.append("DIALOG " + d.message), d.dismiss()))
        self.page.goto(BASE, timeout=120_000)
        self.page.wait_for_selector("#kv-run", timeout=60_000)
        self.n = 0

    def tab(self, name):
        self.page.get_by_role("tab", name=name, exact=True).first.click()
        time.sleep(1)

    def tag(self):
        self.n += 1
        return f"M{self.n}"

    def fill(self, selector, value, enter=False):
        box = self.page.locator(selector).first
        box.fill(value)
        if enter:
            box.press("Enter")

    def scan(self, what, tags, wait=3.0, status=None):
        time.sleep(wait)
        found = sorted(set(self.page.evaluate(SCAN, tags)))
        line = ""
        if status:
            try:
                line = " ".join(self.page.locator(status).first.inner_text().split())[:220]
            except Exception as err:  # noqa: BLE001
                line = f"({type(err).__name__})"
        print(f"[{what}] tags={tags} hits={found} requests={sorted(set(self.requests))[:4]}\n    status: {line}")
        self.requests.clear()

    def wait_text(self, selector, pattern, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                t = self.page.locator(selector).first.inner_text()
                if pattern(t):
                    return t
            except Exception:  # noqa: BLE001
                pass
            time.sleep(1)
        return None


def main():
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        from tabs_probe import TABS
        for name, fn in TABS.items():
            if ONLY and name not in ONLY:
                continue
            probe = Probe(browser)
            try:
                fn(probe)
            except Exception as err:  # noqa: BLE001
                print(f"[{name}] probe error: {type(err).__name__}: {str(err)[:200]}")
            probe.page.screenshot(path=f"{SHOTS}/{name}.png", full_page=True)
            probe.page.close()
        browser.close()


if __name__ == "__main__":
    sys.path.insert(0, "breakit")
    main()
