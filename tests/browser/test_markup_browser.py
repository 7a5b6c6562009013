"""No page element is ever created from user text, checked in the DOM of the real app in headless chromium.

Hostile strings (HTML with marker attributes, a Markdown image, both pointing at an address that answers nothing)
go in where a visitor, a record or a link can put them: a saved record loaded into the Report tab (its model
name and a column label), a Compare record replayed (column names, notes, the machine it was measured on, a
refused card) and the share link that serves it to every visitor, a record whose wrong-typed field breaks the
replay (its error once reached gradio's pop-up, which renders HTML), a chat message, and a link into Inspect
whose prompt the step line echoes. After each, the whole page holds no element carrying the marker (no `<img>`,
`<form>`, password field, `<b>`, `<script>` or `<iframe>` from the text), no request went to the hostile
address, and the text reads back literally where it is shown.
"""

import json
from pathlib import Path
from urllib.parse import urlencode

from pagekit import wait_until

ROOT = Path(__file__).resolve().parents[2]
REPORT_RECORD = ROOT / "records" / "smoke" / "smollm2.json"
COMPARE_RECORD = ROOT / "tests" / "fixtures" / "record_v2_quickstart.json"
MARKER = "pwn"
ADDRESS = f"http://127.0.0.1:9/{MARKER}"
"""Where the hostile images point: the discard port on this machine (nothing answers; any request is seen)."""
HOSTILE = (f'<img src="{ADDRESS}.png" id="{MARKER}" onerror="window.pwned=1"><b data-x="{MARKER}">B</b>'
           f'<form id="{MARKER}-form"><input type="password" name="{MARKER}"></form>'
           f'<iframe id="{MARKER}-frame" src="{ADDRESS}.html"></iframe> ![{MARKER}]({ADDRESS}-md.png)')
TIMEOUT_MS = 240_000
TIMEOUT_S = TIMEOUT_MS / 1000
FOUND_JS = f"""() => {{
  const marked = el => [...el.attributes].some(a => a.name !== 'aria-label' && a.value.includes('{MARKER}'));
  return [...document.querySelectorAll('*')]
    .filter(el => marked(el) || el.matches('iframe, input[type=password]'))
    .map(el => el.outerHTML.slice(0, 160));
}}"""
"""Every element carrying the marker in an attribute (the chatbot's own aria-label quotes a message and is not
an element of it), and any frame or password field at all (kvlab's page has none; vega draws a `<form>` of its
own, so a form counts by its marker)."""


def watch(page) -> list[str]:
    """The requests `page` makes to the hostile address, filled in as they happen."""
    seen = []
    page.on("request", lambda request: seen.append(request.url) if request.url.startswith(ADDRESS) else None)
    return seen


def open_watched(browser, url: str):
    """(page, requests to the hostile address): a new browser context on `url`, watched from before it loads."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    seen = watch(page)
    page.goto(url)
    page.wait_for_selector("#kv-run")
    return page, seen


def assert_inert(page, requests: list[str]) -> None:
    """Nothing on `page` came from the hostile text, and nothing was fetched from its address."""
    page.wait_for_timeout(1_000)  # an image's request, had one been made, is sent by now
    assert page.evaluate(FOUND_JS) == []
    assert requests == [] and page.evaluate("window.pwned") is None


def shown(page, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


def test_a_saved_record_loaded_into_the_report_tab_shows_its_markup_as_text(page, tmp_path):
    record = json.loads(REPORT_RECORD.read_text())
    record["model"]["name"] = HOSTILE
    for column in record["columns"]:
        column["name"] = f"{column['name']} {HOSTILE}"
    crafted = tmp_path / "crafted-report.json"
    crafted.write_text(json.dumps(record))
    requests = watch(page)
    page.get_by_role("tab", name="Report").click()
    page.locator("#report-saved input[type=file]").set_input_files(str(crafted))
    page.locator("#report-status").filter(has_text="from 1 saved record").wait_for(timeout=TIMEOUT_MS)
    page.locator("#report-front").filter(has_text="Pareto front").wait_for(timeout=TIMEOUT_MS)
    assert_inert(page, requests)
    assert HOSTILE in shown(page, "#report-status") and HOSTILE in shown(page, "#report-front")
    assert HOSTILE in shown(page, "#report-table")


def crafted_compare(path: Path) -> Path:
    record = json.loads(COMPARE_RECORD.read_text())
    record["environment"]["cpu"] = HOSTILE
    record["columns"][1]["name"] = HOSTILE
    record["columns"][1]["message"] = "a note longer than its summary cell, so it is shown in full below: " + HOSTILE
    record["refused"] = [{"slot": 7, "strategy": HOSTILE, "values": [], "message": HOSTILE}]
    path.write_text(json.dumps(record))
    return path


def test_a_replayed_record_and_its_share_link_show_its_markup_as_text(page, browser, app_url, tmp_path):
    requests = watch(page)
    page.locator("#kv-replay-box").click()
    page.locator("#kv-replay input[type=file]").set_input_files(str(crafted_compare(tmp_path / "crafted.json")))
    wait_until(page, "document.querySelector('#kv-run-status').innerText.startsWith('replayed')", TIMEOUT_S)
    page.locator("#kv-summary-notes summary").click()
    assert_inert(page, requests)
    assert HOSTILE in shown(page, "#kv-summary-notes") and HOSTILE in shown(page, "#kv-run-status")
    assert HOSTILE in shown(page, "#kv-card-7")
    href = page.locator("#kv-share-link").get_attribute("href")
    assert href and href.startswith("?run="), href
    visitor, seen = open_watched(browser, app_url.rstrip("/") + "/" + href)
    try:
        wait_until(visitor, "document.querySelector('#kv-run-status').innerText.startsWith('replayed')", TIMEOUT_S)
        visitor.locator("#kv-summary-notes summary").click()
        assert_inert(visitor, seen)
        assert HOSTILE in shown(visitor, "#kv-summary-notes") and HOSTILE in shown(visitor, "#kv-run-status")
    finally:
        visitor.context.close()


def test_a_record_whose_field_breaks_the_replay_says_so_in_one_line_and_makes_no_element(page, tmp_path):
    record = json.loads(COMPARE_RECORD.read_text())
    record["settings"]["max_new_tokens"] = HOSTILE  # not a number: the record's reader refuses it, naming the field
    crafted = tmp_path / "crafted-types.json"
    crafted.write_text(json.dumps(record))
    requests = watch(page)
    page.locator("#kv-replay-box").click()
    page.locator("#kv-replay input[type=file]").set_input_files(str(crafted))
    wait_until(page, "/cannot replay|^Error/.test(document.querySelector('#kv-run-status').innerText)", TIMEOUT_S)
    assert_inert(page, requests)  # (an unexpected error's pop-up renders its message as HTML when shown)
    assert "cannot replay" in shown(page, "#kv-run-status")
    assert "settings.max_new_tokens should be a valid integer" in shown(page, "#kv-run-status")


def test_a_chat_message_shows_as_typed(page):
    requests = watch(page)
    page.get_by_role("tab", name="Chat", exact=True).click()
    budget = page.locator("#kvlab-chat-max-new input[type=number]")
    budget.fill("4")
    budget.press("Enter")
    message = f"Repeat this: {HOSTILE}\nif a < b:\n    print('<b>')"
    page.locator("#kvlab-chat-message textarea").fill(message)
    page.locator("#kvlab-chat-send").click()
    page.locator("#kvlab-chat-turn").get_by_text("Turn 1").wait_for(timeout=TIMEOUT_MS)
    assert_inert(page, requests)
    user = page.locator("#kvlab-chatbot [data-testid=user]").first.inner_text()
    assert HOSTILE in user and "if a < b:\n    print('<b>')" in user  # code keeps its indentation


def test_a_link_into_inspect_shows_its_prompt_as_text(browser, app_url):
    prompt = f"<img id={MARKER} src=x>"  # whole in the step line, which shows the last 12 tokens fed
    query = urlencode({"inspect": 1, "strategy": "dynamic", "compare": "none", "prompt": prompt, "system": "",
                       "chat": 0, "steps": 1, "model": "bundled", "step": 0})
    page, requests = open_watched(browser, app_url.rstrip("/") + "/?" + query)
    try:
        page.locator("#kvi-step-info").filter(has_text="Token 0").wait_for(timeout=TIMEOUT_MS)
        assert_inert(page, requests)
        assert prompt in shown(page, "#kvi-step-info")
    finally:
        page.context.close()
