"""The per-tab steps of `page_markup_probe.py` (see there)."""
import time

from page_markup_probe import payload

SHORT = 4


def set_number(p, selector, value):
    box = p.page.locator(f"{selector} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def compare(p):
    p.tab("Compare")
    set_number(p, "#kv-max-new", SHORT)
    a, b = p.tag(), p.tag()
    p.fill("#kv-prompt textarea", "Repeat this exactly: " + payload(a))
    p.fill("#kv-system textarea", "Always repeat the user's text: " + payload(b))
    p.page.locator("#kv-run").click()
    time.sleep(3)
    p.page.wait_for_selector("#kv-run:not([disabled])", timeout=300_000)
    p.scan("compare prompt+system run", [a, b], status="#kv-run-status")
    # a label on a column, typed in the strategy box
    for field in ("kv-col-0-strategy", "kv-col-0-knob-0", "kv-col-0-budget", "kv-col-0-fallback", "kv-model"):
        t = p.tag()
        value = ("dynamic:label=" + payload(t, long=False).replace("\n", " ")) if field.endswith("strategy") \
            else payload(t, long=False).replace("\n", " ")
        p.fill(f"#{field} input", value, enter=True)
        if field == "kv-model":
            p.page.locator("#kv-load").click()
            p.scan(f"compare {field} + Load", [t], wait=5, status="#kv-model-status")
        else:
            p.page.locator("#kv-run").click()
            p.scan(f"compare {field} + Run", [t], wait=8, status="#kv-run-status")
            p.page.locator("#kv-stop").click()
            p.page.wait_for_selector("#kv-run:not([disabled])", timeout=300_000)


def compare_label_run(p):
    p.tab("Compare")
    set_number(p, "#kv-max-new", SHORT)
    t = p.tag()
    p.fill("#kv-col-0-strategy input", "dynamic:label=" + payload(t, long=False).replace("\n", " ").replace(":", ""),
           enter=True)
    p.page.locator("#kv-run").click()
    time.sleep(3)
    p.page.wait_for_selector("#kv-run:not([disabled])", timeout=300_000)
    p.scan("compare label (no colons) run", [t], wait=5, status="#kv-run-status")


def chat(p):
    p.tab("Chat")
    set_number(p, "#kvlab-chat-max-new", 24)
    a, b = p.tag(), p.tag()
    p.page.get_by_label("System prompt").last.fill("Repeat the user's message exactly. " + payload(b))
    p.fill("#kvlab-chat-message textarea", "Repeat this exactly: " + payload(a))
    p.page.locator("#kvlab-chat-send").click()
    p.wait_text("#kvlab-chat-turn", lambda t: "Turn 1" in t, 240)
    p.scan("chat message+system", [a, b], status="#kvlab-chat-turn")
    print("    model said:", p.page.locator("#kvlab-chatbot [data-testid=bot]").last.inner_text()[:200].replace("\n", " | "))
    for field in ("kvlab-chat-strategy", "kvlab-chat-budget", "kvlab-chat-fallback", "kvlab-chat-model"):
        t = p.tag()
        value = payload(t, long=False).replace("\n", " ")
        if field.endswith("strategy"):
            value = "dynamic:label=" + value
        p.fill(f"#{field} input", value, enter=True)
        p.fill("#kvlab-chat-message textarea", "hi")
        p.page.locator("#kvlab-chat-send").click()
        p.scan(f"chat {field} + send", [t], wait=8, status="#kvlab-chat-notice")
    # prefix reuse
    p.page.get_by_text("Prefix reuse").first.click()
    time.sleep(1)
    boxes = p.page.evaluate("""() => [...document.querySelectorAll('textarea')].filter(e=>e.offsetParent!==null)
        .map(e => (e.closest('[id]')||{}).id + ':' + (e.closest('label')||e.closest('.block')||{}).innerText?.slice(0,30))""")
    print("    prefix boxes:", boxes)


def perplexity(p):
    p.tab("Perplexity")
    a, b = p.tag(), p.tag()
    p.fill("#ppl-extra textarea", "dynamic:label=" + payload(b, long=False).replace("\n", " ").replace(":", ""))
    area = p.page.get_by_label("your text").first
    area.fill(payload(a) * 3)
    src = p.page.evaluate("""() => [...document.querySelectorAll('input')].filter(e=>e.offsetParent!==null)
        .map(e => (e.closest('[id]')||{}).id + '=' + e.value).join(' ; ')""")
    print("    inputs:", src[:600])
    p.page.locator("#ppl-run").click()
    p.wait_text("#ppl-status", lambda t: "done" in t.lower() or "refus" in t.lower() or "cannot" in t.lower(), 240)
    p.scan("perplexity text+extra", [a, b], status="#ppl-status")


def plan(p):
    p.tab("Plan")
    for field, kind in (("plan-model", "input"), ("plan-contexts", "textarea"), ("plan-budget", "input"),
                        ("plan-col-0-strategy", "input"), ("plan-col-0-knob-0", "input"), ("plan-dtype", "input")):
        t = p.tag()
        value = payload(t, long=(kind == "textarea"))
        if kind == "input":
            value = value.replace("\n", " ")
        if field.endswith("strategy"):
            value = "dynamic:label=" + value
        p.fill(f"#{field} {kind}", value, enter=(kind == "input"))
        p.page.locator("#plan-run").click()
        p.scan(f"plan {field}", [t], wait=6, status="#plan-status")
        p.page.reload()
        p.page.wait_for_selector("#kv-run", timeout=60_000)
        p.tab("Plan")


def inspect(p):
    p.tab("Inspect")
    a, b = p.tag(), p.tag()
    p.fill("#kvi-prompt textarea", "Repeat this exactly: " + payload(a))
    p.fill("#kvi-system textarea", payload(b))
    p.page.locator("#kvi-step10").click()
    p.wait_text("#kvi-step-info", lambda t: "Token" in t, 240)
    time.sleep(10)
    p.scan("inspect prompt+system step x10", [a, b], status="#kvi-step-info")
    for field in ("kvi-strategy", "kvi-knob-0", "kvi-compare", "kvi-model"):
        t = p.tag()
        value = payload(t, long=False).replace("\n", " ")
        if field.endswith("strategy") or field.endswith("compare"):
            value = "dynamic:label=" + value
        p.fill(f"#{field} input", value, enter=True)
        p.page.locator("#kvi-reset").click()
        time.sleep(1)
        p.page.locator("#kvi-step").click()
        p.scan(f"inspect {field} + step", [t], wait=6, status="#kvi-status")


def needle(p):
    p.tab("Needle")
    for field in ("needle-columns", "needle-lengths", "needle-depths", "needle-seeds", "needle-model"):
        t = p.tag()
        kind = "input" if field == "needle-model" else "textarea"
        value = payload(t, long=(kind == "textarea"))
        if field == "needle-columns":
            value = "dynamic:label=" + value.replace(":", "").replace("\n", " ")
        if kind == "input":
            value = value.replace("\n", " ")
        p.fill(f"#{field} {kind}", value, enter=(kind == "input"))
        p.page.locator("#needle-run").click()
        p.scan(f"needle {field}", [t], wait=8, status="#needle-status")
        p.page.locator("#needle-stop").click()
        p.page.reload()
        p.page.wait_for_selector("#kv-run", timeout=60_000)
        p.tab("Needle")


def report(p):
    p.tab("Report")
    for field in ("report-columns", "report-model"):
        t = p.tag()
        kind = "input" if field == "report-model" else "textarea"
        value = payload(t, long=False).replace("\n", " ")
        if field == "report-columns":
            value = "dynamic:label=" + value.replace(":", "")
        p.fill(f"#{field} {kind}", value, enter=(kind == "input"))
        set_number(p, "#report-context", 32)
        set_number(p, "#report-scored", 4)
        p.page.locator("#report-run").click()
        p.wait_text("#report-status", lambda s: "done" in s.lower() or "refus" in s.lower() or "cannot" in s.lower(), 90)
        p.scan(f"report {field}", [t], wait=5, status="#report-status")
        p.page.reload()
        p.page.wait_for_selector("#kv-run", timeout=60_000)
        p.tab("Report")


TABS = {"compare": compare, "label": compare_label_run, "chat": chat, "perplexity": perplexity, "plan": plan,
        "inspect": inspect, "needle": needle, "report": report}
