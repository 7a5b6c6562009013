"""Engine columns in the Compare tab, in headless chromium against the real app (bundled model, CPU): the `engines`
preset puts dynamic, quanto int4 and llama.cpp q4_0 (and llama.cpp f16) side by side, a card picks
`engine:llamacpp` from its strategy list and shows its knobs, a bad `type_k` is one line in its own card while
the other columns finish, and the llama.cpp columns stream text and report their cache bytes. A screenshot of the
finished page goes to artifacts/. No wall-clock time is asserted; waits only guard against a hung run."""

from pathlib import Path

from pagekit import wait_until

RUN_TIMEOUT_S = 900
MODEL_TIMEOUT_MS = 240_000
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
STATUS = "document.querySelector('#kv-run-status').innerText"


def badge(page, slot: int) -> str:
    return page.locator(f"#kv-col-{slot}-status .kv-badge").inner_text().strip()


def test_dynamic_quanto_and_llamacpp_q4_0_side_by_side(page):
    page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')",
                           timeout=MODEL_TIMEOUT_MS)
    page.locator("#kv-preset input").click()
    page.get_by_role("option", name="engines", exact=True).click()
    wait_until(page, "(document.querySelector('#kv-col-2-strategy input')?.value || '').startsWith('engine:llamacpp')",
               60)
    assert page.locator("#kv-col-2-knob-0 input").input_value() == "q4_0"
    assert page.locator("#kv-col-2-knob-1 input").input_value() == "q4_0"

    page.locator("#kv-col-4-strategy input").click()
    page.get_by_role("option", name="engine:llamacpp", exact=True).click()
    wait_until(page, "(document.querySelector('#kv-col-4-knob-0')?.innerText || '').includes('type_k')", 60)
    page.locator("#kv-col-4-knob-0 input").fill("q3_k")
    page.locator("#kv-max-new input").fill("12")

    page.click("#kv-run")
    wait_until(page, f"{STATUS}.startsWith('finished') || {STATUS}.startsWith('✖')", RUN_TIMEOUT_S, poll_s=1.0)
    assert page.evaluate(STATUS).startswith("finished"), page.evaluate(STATUS)
    assert [badge(page, slot) for slot in range(4)] == ["done"] * 4
    card = page.locator("#kv-col-4-status").inner_text()
    assert "type_k must be one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, got 'q3_k'" in card
    for slot in (2, 3):
        assert page.locator(f"#kv-col-{slot}-text textarea").input_value().strip()
    assert "Hadamard-rotates K and V" in page.locator("#kv-col-2-status").inner_text()
    table = page.locator("#kv-summary").inner_text()
    for name in ("dynamic", "quantized quanto int4 r16", "engine:llamacpp q4_0", "engine:llamacpp f16"):
        assert name in table
    assert "another engine: llama.cpp" in page.locator("#kv-summary-notes").inner_text() + table
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare-engines.png"), full_page=True)
