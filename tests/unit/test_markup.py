"""Text that did not come from kvlab is never markup on the page: the escaping helpers
(`kvlab.ui.shared.markup`) and every view function that puts a visitor's, a record's or a model's text into a
Markdown or HTML component, fed hostile strings.

A Markdown output is rendered with markdown-it (CommonMark with raw HTML on, as gradio's Markdown allows it) and
the HTML is read back: no element may come from the hostile text (no `<img>`, `<form>`, `<input>`, `<a>`,
`<script>`, no attribute carrying the marker), and the hostile text reads back literally. The browser check of
the same on the running app is tests/browser/test_markup_browser.py.
"""

import json
import types
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvlab.ui.shared.markup import chat_text, html_text, md_code, md_text

MarkdownIt = pytest.importorskip("markdown_it").MarkdownIt

MARKER = "pwn"
HOSTILE = (f'<img src="https://example.invalid/{MARKER}.png" id="{MARKER}" onerror="alert(1)">'
           f'<b data-x="{MARKER}">B</b><form id="{MARKER}"><input type="password" name="{MARKER}"></form>'
           f'<script id="{MARKER}">alert(1)</script><iframe id="{MARKER}" src="https://example.invalid/"></iframe>')
"""HTML a crafted record, message or model output may hold (the break-it round's examples)."""
HOSTILE_MD = (f"![{MARKER}](https://example.invalid/{MARKER}.png) [click](https://example.invalid/{MARKER}) "
              "**bold** _it_ `code` $$x^2$$ ~~gone~~ https://example.invalid/x www.example.invalid a@example.invalid "
              "| a | b | &lt;b&gt; \\<b>")
"""Markdown syntax in the same places: an image and links to outside addresses, emphasis, LaTeX, entities."""
HOSTILE_LINES = "# heading\n\n    indented\n1. item\n> quote\n---\n<b>x</b>"
"""Text with line breaks that would start blocks of its own."""
ROOT = Path(__file__).resolve().parents[2]
REPORT_RECORD = ROOT / "records" / "smoke" / "smollm2.json"
COMPARE_RECORD = ROOT / "tests" / "fixtures" / "record_v2_quickstart.json"
FORBIDDEN = {"img", "form", "input", "script", "iframe", "a", "b", "h1", "ol", "blockquote", "hr", "table", "pre",
             "del", "s", "em"}
"""Elements the hostile strings above would create if they were markup."""


class Elements(HTMLParser):
    """The start tags (with attributes) and the text of an HTML fragment, character references decoded."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text = ""
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text += data


def rendered(markdown: str) -> Elements:
    """What a Markdown component makes of `markdown` (CommonMark, raw HTML allowed, GFM tables and strikethrough)."""
    return Elements(MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown))


def assert_inert(page: Elements, *literals: str, own: set[str] = frozenset()) -> None:
    """No element but kvlab's own (`own`) and nothing carrying the marker; each literal reads back as typed."""
    made = {tag for tag, _ in page.tags}
    assert not (made - set(own)) & FORBIDDEN, f"markup from user text: {page.tags}"
    assert not [attrs for _, attrs in page.tags if any(MARKER in str(v) for v in attrs.values())], page.tags
    text = " ".join(page.text.split())
    for literal in literals:
        assert " ".join(literal.split()) in text, f"{literal!r} is not shown literally in {text!r}"


# ----- the helpers -----

@pytest.mark.parametrize("value", [HOSTILE, HOSTILE_MD, HOSTILE_LINES, "   four spaces first", "plain words", ""])
def test_md_text_reads_back_literally_and_makes_no_element(value):
    page = rendered(f"before {md_text(value)} after")
    assert [tag for tag, _ in page.tags] == ["p"]
    assert page.text.strip() == " ".join(f"before {value.replace(chr(9), ' ')} after".splitlines()).strip()


def test_md_text_keeps_kvlab_markup_around_it_working():
    page = rendered(f"**label**: {md_text(HOSTILE)}  \n⚠️ {md_text(HOSTILE_MD)}")
    assert [tag for tag, _ in page.tags] == ["p", "strong", "br"]
    assert_inert(page, HOSTILE, HOSTILE_MD, own={"strong"})
    assert rendered(f"**{md_text('(x)')}**").tags[1][0] == "strong"  # bold around punctuation still bolds


@pytest.mark.parametrize("value", [HOSTILE, "a`b", "``` fence", "`edge`", " spaced ", "$$x$$"])
def test_md_code_is_one_code_span_holding_the_text(value):
    page = rendered(f"front: {md_code(value)}.")
    assert [tag for tag, _ in page.tags] == ["p", "code"]
    assert page.text.rstrip("\n") == f"front: {value}."
    assert md_code("") == "" and md_code("sink 4+60") == "`sink 4+60`"


def test_html_text_and_chat_text_are_text_in_html():
    for escape in (html_text, chat_text):
        page = Elements(f"<div>{escape(HOSTILE)}</div>")
        assert page.tags == [("div", {})] and page.text == HOSTILE
    attribute = Elements(f'<i title="{html_text(HOSTILE)}"></i><i title=\'{html_text(HOSTILE)}\'></i>')
    assert [attrs["title"] for _, attrs in attribute.tags] == [HOSTILE, HOSTILE]
    assert chat_text("if a < b && c > d:\n    x = '\"'") == "if a &lt; b &amp;&amp; c &gt; d:\n    x = '\"'"


# ----- the views: Report -----

def crafted_report(tmp_path) -> Path:
    record = json.loads(REPORT_RECORD.read_text())
    record["model"]["name"] = HOSTILE
    record["columns"][0]["name"] = HOSTILE_MD
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(record))
    return path


def test_report_status_and_front_show_a_records_model_and_column_literally(tmp_path):
    from kvlab.ui.report.view import plot_caption, replay_status, rows_from_files

    broken = tmp_path / f"{MARKER}<img src=x id={MARKER}>.json"
    broken.write_text("{")
    rows, problems = rows_from_files([crafted_report(tmp_path), broken])
    assert rows and problems
    status = replay_status(rows, 1, problems)
    assert_inert(rendered(status), f"model: {HOSTILE}", f"<img src=x id={MARKER}>.json", own={"br"})
    assert_inert(rendered(plot_caption(rows, "kld_mean")), own={"strong", "code"})
    assert HOSTILE_MD in rendered(plot_caption([{**row, "kld_mean": 0.0} for row in rows], "kld_mean")).text


# ----- Compare: the summary's notes and cells, the card, the plots' notes -----

def crafted_compare() -> dict:
    record = json.loads(COMPARE_RECORD.read_text())
    record["environment"]["cpu"] = HOSTILE
    record["columns"][1]["name"] = HOSTILE
    record["columns"][1]["message"] = "a note long enough to be cut in its summary cell: " + HOSTILE
    record["columns"][2]["name"] = HOSTILE_MD
    record["columns"][2]["warning"] = HOSTILE_MD + " and more words, so the note is longer than its cell"
    return record


def test_compare_summary_notes_and_cells_show_a_records_text_literally():
    from kvlab.compare.replay import load_record
    from kvlab.ui.compare.replay import view_from_record

    view = view_from_record(load_record(json.dumps(crafted_compare()).encode()))
    notes = view.summary_notes()
    assert_inert(rendered(notes), HOSTILE, HOSTILE_MD, own={"details", "summary", "ul", "li", "strong", "p"})
    view.divergence_links = {1: "?inspect=1&step=2"}
    view.done.results[1].first_divergence = HOSTILE
    view.done.results[2].first_divergence = HOSTILE_MD
    headers, table = view.summary_table()
    column = headers.index("first divergence")
    linked, plain = rendered(table[1][column]), rendered(table[2][column])
    assert_inert(linked, HOSTILE, own={"a"})
    assert_inert(plain, HOSTILE_MD)
    assert [tag for tag, _ in linked.tags] == ["p", "a"] and linked.tags[1][1]["href"] == "?inspect=1&step=2"


def test_a_card_set_to_an_unknown_strategy_names_it_literally():
    from kvlab.ui.shared.knobs import card_form

    about = card_form(HOSTILE, {}, None, 3)["about"]["value"]
    assert_inert(rendered(about), HOSTILE)


def test_compare_plot_notes_show_a_records_fallback_literally():
    gr = pytest.importorskip("gradio")
    from kvlab.compare.replay import load_record
    from kvlab.ui.compare.replay import view_from_record
    from kvlab.ui.shared.live_plots import LivePlots

    record = crafted_compare()
    record["columns"][3]["fallbacks"] = [{"to": HOSTILE, "at_token": 3, "from": "dynamic", "reason": "over budget"}]
    view = view_from_record(load_record(json.dumps(record).encode()))
    with gr.Blocks():
        plots = LivePlots().build()
    notes = plots.updates(view)[plots.notes]
    assert_inert(rendered(notes), f"switched to {HOSTILE} at token 3")


# ----- Inspect -----

def step_record(fed: str, chosen: str):
    forward = types.SimpleNamespace(mask_shape=None, new_tokens=1, kv_length=5, kv_offset=0, past_tokens=4,
                                    cache_position=(4, 4), position_ids=(4, 4))
    return types.SimpleNamespace(index=3, input_shape=(1, 1), fed_text=fed, token_text=chosen, token_id=7,
                                 per_token_s=0.01, forwards=[forward], layers=[types.SimpleNamespace(held_tokens=5)],
                                 kl_nats=None, seen_tokens=5, cache_bytes=2**20)


def test_inspect_step_shows_the_prompt_and_the_models_token_literally():
    from kvlab.ui.inspect.view import step_markdown

    session = types.SimpleNamespace(settings=types.SimpleNamespace(max_new_tokens=8), strategy=None)
    text = step_markdown(step_record("<img src=https://example.invalid/x.png id=pwn>", "<b id=pwn>"), session)
    assert_inert(rendered(text), "<img src=https://example.invalid/x.png id=pwn>", "'<b id=pwn>'",
                 own={"strong", "code", "ul", "li"})


def test_inspect_lockstep_summary_shows_its_message_literally():
    from kvlab.ui.inspect.diverge import diverge_markdown

    assert_inert(rendered(diverge_markdown(None, HOSTILE)), HOSTILE, own={"strong"})


# ----- Chat -----

def test_chat_messages_reach_the_chatbot_escaped_and_the_conversation_keeps_the_text():
    from kvlab.ui.chat.view import shown_messages

    history = [{"role": "user", "content": HOSTILE}, {"role": "assistant", "content": "```\n<b>x</b>\n```"}]
    shown = shown_messages(history)
    assert [m["role"] for m in shown] == ["user", "assistant"] and history[0]["content"] == HOSTILE
    for message, original in zip(shown, history):
        page = Elements(message["content"])
        assert page.tags == [] and page.text == original["content"]


def test_chat_turn_and_prefix_lines_show_their_text_literally():
    from kvlab.ui.chat.view import prefix_markdown, turn_markdown

    stats = types.SimpleNamespace(turn=2, strategy=HOSTILE, action="reused", reused_tokens=3, prefilled_tokens=2,
                                  input_tokens=5, generated_tokens=4, stop_reason="eos", cropped_tokens=0,
                                  ttft_s=0.1, decode_tok_s=9.0, cache_tokens=9, cache_bytes=100,
                                  no_reuse_ttft_s=None, match=None, lossy=False, note=HOSTILE_MD)
    assert_inert(rendered(turn_markdown(stats)), HOSTILE, HOSTILE_MD, own={"strong", "ul", "li", "p"})
    report = types.SimpleNamespace(strategy=HOSTILE, lossy=False, prefix_tokens=3, prefix_prefill_s=0.1,
                                   prefix_cache_tokens=3, prefix_cache_bytes=10, results=[], total_with_s=0.1,
                                   total_without_s=0.2, total_saved_s=0.1)
    assert_inert(rendered(prefix_markdown(report)), HOSTILE, own={"strong", "ul", "li", "p"})


# ----- Needle, Plan -----

def test_needle_status_shows_the_grids_problems_literally():
    from kvlab.ui.needle.view import NeedleView

    view = NeedleView()
    view.problems = [HOSTILE]
    assert_inert(rendered(view.status_text()), HOSTILE, own={"br"})


def test_plan_shows_a_configs_names_and_notes_literally():
    from kvlab.ui.plan.view import PlanForm, run_plan

    view = run_plan(PlanForm(model="meta-llama/Llama-3.1-8B-Instruct", contexts="1k", budget="none",
                             slots=[("dynamic", [""] * 0)]))
    view.plan.model.update(name=HOSTILE, origin="folder", model_class=HOSTILE_MD, notes=[HOSTILE],
                           layer_groups={f"<i id={MARKER}>full</i>": 32})
    view.plan.strategies[0].explanation = f"dynamic: {HOSTILE}"
    view.plan.strategies[0].notes = [HOSTILE_MD]
    assert_inert(rendered(view.model_text()), HOSTILE, HOSTILE_MD, f"<i id={MARKER}>full</i>",
                 own={"strong", "ul", "li", "p"})
    assert_inert(rendered(view.explanations()), HOSTILE, HOSTILE_MD, own={"strong", "ul", "li"})


def test_unescape_reads_md_text_back():
    assert unescape(md_text(HOSTILE)) == HOSTILE


# ----- a typed model source echoed in a tab's status line -----

class RefusingPool:
    """A model pool that loads nothing and says so, naming the source it was given (as a real refusal does)."""

    def get(self, spec):
        from kvlab.models.loading import ModelLoadError

        raise ModelLoadError(f"cannot load the model {spec.source!r}")

    def loaded(self, spec):
        return None


def test_a_tab_echoes_a_refused_model_source_literally():
    import threading

    gr = pytest.importorskip("gradio")
    from kvlab.ui.chat.tab import ChatTab
    from kvlab.ui.chat.view import ChatForm
    from kvlab.ui.needle.tab import NeedleTab
    from kvlab.ui.perplexity.tab import PerplexityTab
    from kvlab.ui.perplexity.view import PerplexityRequest
    from kvlab.ui.report.tab import ReportTab
    from kvlab.ui.report.view import ReportRequest

    pool = RefusingPool()
    with gr.Blocks():
        chat, report = ChatTab(pool).build(), ReportTab(pool).build()
        perplexity, needle = PerplexityTab(pool).build(), NeedleTab(pool).build()
    shown = {
        "chat": list(chat.send("hi", None, ChatForm(source=HOSTILE, max_new_tokens=4)))[-1][chat.notice],
        "report": list(report.stream(ReportRequest(source=HOSTILE), threading.Event(), {}))[-1][report.status],
        "perplexity": list(perplexity.stream(PerplexityRequest(source=HOSTILE), threading.Event()))[-1][
            perplexity.status],
        "needle": list(needle.stream({}, HOSTILE, "dynamic", "120", "0", "0", 2))[-1][needle.status],
    }
    for tab, line in shown.items():
        assert line.startswith("⚠️"), (tab, line)
        assert_inert(rendered(line), f"cannot load the model {HOSTILE!r}")
