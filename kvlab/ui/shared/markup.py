"""Text that did not come from kvlab made inert where the page renders markup.

A visitor's prompt or chat message, a model's output, an uploaded or shared record's fields (model names, column
labels, notes, the machine it was measured on), a typed model source or column spec echoed in an error: none of it
may become an element of the page. Each helper escapes a fragment for the context it lands in; kvlab's own markup
around the fragment (bold labels, line breaks, links it builds from validated ids) stays markup.

- `md_text` for `gr.Markdown` (and a `gr.Dataframe` cell of datatype "markdown"): the fragment reads as the
  literal text, neither HTML nor Markdown (no tag, link, image, emphasis, heading, list, table, code or LaTeX);
- `md_code` for a name kvlab shows in a Markdown code span (backticks): the span is fenced so that no backtick
  in the name can end it early, and a code span parses nothing inside it;
- `html_text` for `gr.HTML` (text and double-quoted attribute values);
- `chat_text` for a `gr.Chatbot(render_markdown=False)` message: gradio still parses such a message as HTML (and
  its sanitizer keeps `<img>` from outside addresses and `<form>`), so `&`, `<` and `>` are escaped, and the
  text, code and angle brackets included, shows as typed.

Pure functions of a string; no gradio. Not a sanitizer: markup meant to render is kvlab's own, never escaped here.
"""

from __future__ import annotations

import html
import re
import string

_MARKDOWN_LITERAL = {ord(char): f"&#{ord(char)};" for char in string.punctuation}
"""Every ASCII punctuation character -> its numeric character reference. CommonMark (and marked, gradio's
Markdown parser) treats a character reference as literal text, never as syntax, and gradio's LaTeX delimiters
and autolinks are matched on the source, where the references stand."""
_LEADING_SPACES = re.compile(r"^ +")
_BACKTICKS = re.compile(r"`+")


def md_text(value) -> str:
    """`value` (any object, as `str`) as literal text inside Markdown: every ASCII punctuation character written
    as a numeric character reference, line breaks as spaces (a fragment never starts a block of its own) and
    leading spaces as references (never an indented code block)."""
    text = " ".join(str(value).splitlines()).replace("\t", " ")
    text = text.translate(_MARKDOWN_LITERAL)
    return _LEADING_SPACES.sub(lambda found: "&#32;" * len(found.group()), text)


def md_code(value) -> str:
    """`value` as a Markdown code span that holds it literally: fenced by one backtick more than its longest run
    of backticks, padded with a space where it starts or ends with a backtick or a space (CommonMark strips one
    such space on each side); line breaks as spaces. Inside a code span nothing is parsed: HTML shows as typed
    and character references are not decoded (so `md_text` would show them as typed: never combine the two)."""
    text = " ".join(str(value).splitlines())
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def html_text(value) -> str:
    """`value` as literal text inside HTML, in an element or a double- or single-quoted attribute value."""
    return html.escape(str(value), quote=True)


def chat_text(value) -> str:
    """A chat message's text for a `gr.Chatbot` that does not render Markdown: `&`, `<` and `>` escaped, the
    rest as typed (the chatbot's `white-space` keeps its line breaks)."""
    return html.escape(str(value), quote=False)
