"""The chat tab in headless Chromium against the real app (the browser tier's one app, started by conftest):
two browser sessions chatting at once never see each other's history, bad input is refused where the user
looks, every control works while a reply streams, the chatbot's label and icons cover no message (its trash icon
clears the session as Clear does), and closing a tab frees its chat cache.

Debian's /usr/bin/chromium is driven by Playwright; no browser is downloaded.
"""

import re
import time

import pytest

TURN_TIMEOUT_MS = 180_000
PAGE_TIMEOUT_S = 60
NEW_TOKENS = "12"


def open_chat(browser, url):
    """A new browser context (its own cookies, its own Gradio session) on the chat tab."""
    context = browser.new_context()
    page = context.new_page()
    page.goto(url)
    box = page.locator("#kvlab-chat-message textarea")
    tab = page.get_by_role("tab", name="Chat", exact=True)
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while not box.is_visible() and time.monotonic() < deadline:
        if tab.count():
            tab.click()
        page.wait_for_timeout(250)
    box.wait_for(timeout=1_000)
    budget = page.locator("#kvlab-chat-max-new input[type=number]")
    budget.fill(NEW_TOKENS)
    budget.press("Enter")
    return context, page


def send(page, text: str) -> None:
    page.locator("#kvlab-chat-message textarea").fill(text)
    page.locator("#kvlab-chat-send").click()


def wait_for_turn(page, turn: int) -> str:
    page.locator("#kvlab-chat-turn").get_by_text(f"Turn {turn}").wait_for(timeout=TURN_TIMEOUT_MS)
    return page.locator("#kvlab-chat-turn").inner_text()


def conversation(page) -> str:
    return page.locator("#kvlab-chatbot").inner_text()


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_two_sessions_chatting_at_once_never_see_each_others_history(app_url, browser):
    (context_a, a), (context_b, b) = open_chat(browser, app_url), open_chat(browser, app_url)
    try:
        send(a, "My code word is PELICAN-SEVEN.")
        send(b, "My code word is WALRUS-THREE.")
        wait_for_turn(a, 1)
        wait_for_turn(b, 1)
        send(a, "What was my code word?")
        send(b, "Please repeat my code word.")
        info_a, info_b = wait_for_turn(a, 2), wait_for_turn(b, 2)
        text_a, text_b = conversation(a), conversation(b)
        assert "PELICAN-SEVEN" in text_a and "What was my code word?" in text_a
        assert "WALRUS" not in text_a and "repeat my code word" not in text_a
        assert "WALRUS-THREE" in text_b and "Please repeat my code word." in text_b
        assert "PELICAN" not in text_b and "What was my code word?" not in text_b
        for info in (info_a, info_b):
            reused = re.search(r"(\d+) reused from the cache", info)
            assert reused and int(reused.group(1)) > 0, info
    finally:
        context_a.close()
        context_b.close()


CHATBOT_BAR_JS = """() => {
  const rect = (sel) => document.querySelector(sel).getBoundingClientRect();
  const messages = rect('#kvlab-chatbot .bubble-wrap');
  return ['#kvlab-chatbot label', '#kvlab-chatbot .top-panel']
    .map(sel => [sel, rect(sel).bottom, messages.top]).filter(([, bottom, top]) => bottom > top + 0.5);
}"""


def test_the_chatbots_label_and_icons_cover_no_message_and_its_trash_icon_clears_the_session(app_url, browser):
    """The label and icon bar sit above the scrolling messages (a bubble scrolled to the top is never under
    them); gradio's own trash icon forgets the conversation as Clear does, so the next turn starts fresh."""
    context, page = open_chat(browser, app_url)
    try:
        send(page, "Remember the word OSPREY.")
        wait_for_turn(page, 1)
        assert page.evaluate(CHATBOT_BAR_JS) == []
        page.locator("#kvlab-chatbot .top-panel").get_by_role("button", name="Clear").click()
        page.wait_for_function("!document.querySelector('#kvlab-chatbot').innerText.includes('OSPREY')")
        send(page, "What word did I ask you to remember?")
        info = wait_for_turn(page, 1)
        assert "fresh" in info and "OSPREY" not in conversation(page)
    finally:
        context.close()


def test_an_empty_message_is_refused_with_a_clear_message(app_url, browser):
    context, page = open_chat(browser, app_url)
    try:
        send(page, "   ")
        page.locator("#kvlab-chat-notice").get_by_text("the message is empty").wait_for(timeout=30_000)
        assert "Turn" not in page.locator("#kvlab-chat-turn").inner_text()
    finally:
        context.close()


def test_a_static_cache_too_small_is_refused_with_a_way_on(app_url, browser):
    context, page = open_chat(browser, app_url)
    try:
        page.get_by_label("Cache strategy").click()
        page.get_by_role("option", name="static", exact=True).click()
        size = page.locator("#kvlab-chat-knob-0 input")
        # The card shows static's knob fields, generated from its dataclass. The first field is already there
        # for dynamic (layer_types), so wait for static's own (max_cache_len): a value typed before the card's
        # update lands is replaced by the update.
        page.locator("#kvlab-chat-knob-0").get_by_text("max_cache_len", exact=True).wait_for()
        size.fill("16")
        size.press("Enter")
        send(page, "What is the capital of France?")
        notice = page.locator("#kvlab-chat-notice")
        notice.get_by_text("max_cache_len=16").wait_for(timeout=TURN_TIMEOUT_MS)
        assert "switch to the dynamic strategy" in notice.inner_text()
        assert page.locator("#kvlab-chat-message textarea").input_value() == "What is the capital of France?"
        page.get_by_role("button", name="Rebuild the static cache larger").click()
        notice.get_by_text("will be rebuilt").wait_for(timeout=30_000)
        assert int(size.input_value()) > 16
        page.locator("#kvlab-chat-send").click()
        assert "static" in wait_for_turn(page, 1)
    finally:
        context.close()


@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_the_prefix_panel_reports_the_saving(app_url, browser):
    context, page = open_chat(browser, app_url)
    try:
        page.get_by_text("Prefix reuse: prefill").click()
        page.locator("#kvlab-prefix-run").click()
        info = page.locator("#kvlab-prefix-info")
        info.get_by_text("prefilled once").wait_for(timeout=TURN_TIMEOUT_MS)
        assert "4 prompts" in info.inner_text() and "saved" in info.inner_text()
    finally:
        context.close()


def test_every_control_works_while_a_reply_streams(app_url, browser):
    context, page = open_chat(browser, app_url)
    try:
        budget = page.locator("#kvlab-chat-max-new input[type=number]")
        budget.fill("300")
        budget.press("Enter")
        send(page, "Write a long story about a lighthouse keeper and the sea.")
        box = page.locator("#kvlab-chat-message textarea")
        page.locator("#kvlab-chatbot").get_by_text("lighthouse keeper").wait_for(timeout=TURN_TIMEOUT_MS)
        page.locator("#kvlab-chat-turn").get_by_text("generating").wait_for(timeout=TURN_TIMEOUT_MS)
        box.fill("typed while the reply streams")
        page.wait_for_timeout(2_000)
        assert box.input_value() == "typed while the reply streams"
        status_before = page.locator("#kvlab-chat-turn").inner_text()
        page.locator("#kvlab-chat-clear").click()
        notice = page.locator("#kvlab-chat-notice")
        try:
            notice.get_by_text("stopped the reply that was running, then cleared").wait_for(timeout=60_000)
        except Exception as err:  # noqa: BLE001 - say what the page showed instead
            raise AssertionError(f"no 'stopped ... then cleared' notice; turn before Clear: {status_before!r}, "
                                 f"notice now: {notice.inner_text()!r}, turn now: "
                                 f"{page.locator('#kvlab-chat-turn').inner_text()!r}") from err
        assert "lighthouse" not in conversation(page)
        assert box.input_value() == "typed while the reply streams"
        budget.fill(NEW_TOKENS)
        budget.press("Enter")
        assert "Turn" not in page.locator("#kvlab-chat-turn").inner_text()
        page.locator("#kvlab-chat-send").click()
        info = wait_for_turn(page, 1)
        assert "typed while the reply streams" in conversation(page) and "fresh" in info
    finally:
        context.close()


def test_closing_a_tab_frees_its_chat_cache(app, browser):
    context, page = open_chat(browser, app.url)
    send(page, "Remember the word KESTREL.")
    wait_for_turn(page, 1)
    before = app.log.read_text().count("chat session closed: its cache was released")
    context.close()
    deadline = time.monotonic() + 60
    while app.log.read_text().count("chat session closed: its cache was released") == before:
        assert time.monotonic() < deadline, "closing the tab did not release its chat cache"
        time.sleep(0.5)
