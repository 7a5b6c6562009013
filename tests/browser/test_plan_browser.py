"""The Plan tab in headless chromium against the real app (no model weights are read for a plan).

- gemma-3-27b-it at 1k-128k tokens with a 24 GB budget: the table lists every strategy card with GiB at each
  context, fits marks and the longest context in budget, the strategies the model cannot use say why, and the
  plot appears. A screenshot goes to artifacts/.
- Bad input (context 0, batch 0, an unknown name, a folder without config.json) gets its message in the status
  line and the last plan stays on the page.
- The bundled model shows "measure it for real", which fills Compare's model and columns and switches to it.

No wall-clock time is asserted.
"""

from pathlib import Path

GEMMA = "google/gemma-3-27b-it"
CONTEXTS_1K_TO_128K = ", ".join(str(1024 << i) for i in range(8))
CARD_STRATEGIES = ["dynamic", "static", "quantized quanto int4 r128", "quantized hqq int4 r128", "sink 4+1020",
                   "sliding_window"]
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
SCREENSHOT = ARTIFACTS / "plan-tab.png"
STATUS = "#plan-status .kv-line"


def open_plan_tab(page) -> None:
    page.get_by_role("tab", name="Plan").click()
    page.locator("#plan-run").wait_for(state="visible")


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def type_model(page, source: str) -> None:
    box = page.locator("#plan-model input")
    box.fill(source)
    box.press("Enter")


def plan_and_wait(page) -> str:
    """Press Plan and wait for the status line to change to a plan or an error (each step here expects a
    different line); returns its text."""
    before = page.locator(STATUS).inner_text()
    page.click("#plan-run")
    page.wait_for_function("([sel, before]) => { const t = document.querySelector(sel).innerText; "
                           "return t !== before && /planned|✖/.test(t); }", arg=[STATUS, before])
    return page.locator(STATUS).inner_text()


def test_gemma_at_1k_to_128k_in_24_gb_then_bad_input(page):
    open_plan_tab(page)
    pick(page, "plan-model", GEMMA)
    page.locator("#plan-contexts textarea").fill(CONTEXTS_1K_TO_128K)
    pick(page, "plan-budget", "24 GB (RTX 3090/4090, L4, A10)")
    status = plan_and_wait(page)
    assert status.startswith("✔ planned 6 strategies × 8 contexts"), status
    assert "cannot serve this model: sink 4+1020: config.layer_types has layers other than full" in status
    assert "quantized quanto int4 r128: " not in status  # its full-attention layers are quantized
    page.locator("#plan-plot img").wait_for(state="visible")
    table = page.locator("#plan-table").inner_text()
    for text in (*CARD_STRATEGIES, "cache GiB at 1k", "cache GiB at 128k", "weights GiB", "total GiB at 128k",
                 "max context in 24 GiB", "10.4\u00a0✖", "51.1", "none: weights alone exceed it",
                 "the sink cache needs every layer to be full attention"):
        assert text in table, text
    assert "Gemma3ForConditionalGeneration" in page.locator("#plan-model-info").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    page.locator("#plan-contexts textarea").fill("0, 1k")
    assert "✖ context must be an integer from 1 to 4,294,967,296, got 0" in plan_and_wait(page)
    page.locator("#plan-contexts textarea").fill("1k")
    page.locator("#plan-batch input").fill("0")
    assert "✖ batch must be an integer from 1 to 1,048,576, got 0" in plan_and_wait(page)
    page.locator("#plan-batch input").fill("1")
    type_model(page, "gemma-27b")
    unknown = plan_and_wait(page)
    assert "✖ unknown model 'gemma-27b'" in unknown
    assert GEMMA in unknown and "meta-llama/Llama-3.1-8B-Instruct" in unknown
    type_model(page, str(ARTIFACTS))
    assert "is not a model folder: it has no config.json" in plan_and_wait(page)
    assert "10.4\u00a0✖" in page.locator("#plan-table").inner_text(), "a bad input wiped the last plan"


def test_the_bundled_model_links_to_compare_with_the_cards(page):
    open_plan_tab(page)
    assert not page.locator("#plan-measure").is_visible()
    pick(page, "plan-model", "bundled (SmolLM2-135M-Instruct, the model Compare loads)")
    page.locator("#plan-measure").wait_for(state="visible")
    page.locator("#plan-col-0-strategy input").click()
    page.get_by_role("option", name="no_cache", exact=True).click()
    page.click("#plan-measure")
    page.locator("#kv-run").wait_for(state="visible")
    shown_model = page.locator("#kv-model input, #kv-model textarea").first.input_value()
    assert shown_model.startswith("bundled — SmolLM2-135M-Instruct"), shown_model  # the picker shows its line
    strategies = [page.locator(f"#kv-col-{i}-strategy input").input_value().split("  ")[0] for i in range(8)]
    assert strategies == ["no_cache", "static", "quantized", "quantized", "sink", "sliding_window", "(none)",
                          "(none)"]
    assert page.locator("#kv-col-4-knob-0 input").input_value() == "1024"
    assert "columns from the Plan tab" in page.locator("#kv-run-status").inner_text()
