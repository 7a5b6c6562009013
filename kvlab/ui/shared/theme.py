"""Colours, CSS and the small HTML pieces every tab shows (status lines, a column's status badge).

Pure strings: no gradio, no model. `app.py` passes `CSS` to `launch()`.
"""

from __future__ import annotations

from urllib.parse import quote

from .markup import html_text

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
"""One colour per column slot (matplotlib's tab10 without grey and olive), the same in every plot."""

PERPLEXITY_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
"""Perplexity curves in order: dense blue, window red, sink green (as in the StreamingLLM figure), then the rest."""


def status_html(title: str, status: str, readout: str = "", message: str = "", keeps: str = "") -> str:
    """A column's status block: title, what its cache keeps (on a hybrid model), a coloured status badge, the
    live readout and any message."""
    parts = [f'<div class="kv-status kv-s-{html_text(status)}">',
             f'<div class="kv-title">{html_text(title)}</div>']
    if keeps:
        parts.append(f'<div class="kv-keeps">{html_text(keeps)}</div>')
    parts.append(f'<span class="kv-badge">{html_text(status)}</span>')
    if readout:
        parts.append(f'<span class="kv-readout">{html_text(readout)}</span>')
    if message:
        parts.append(f'<div class="kv-msg">{html_text(message)}</div>')
    parts.append("</div>")
    return "".join(parts)


def line_html(text: str, kind: str = "info") -> str:
    """The run or model status line. kind: info, busy, ok, error."""
    return f'<div class="kv-line kv-line-{html_text(kind)}">{html_text(text)}</div>'


def share_html(run_id: str, kept: str, param: str = "run") -> str:
    """The link that opens a result again in any browser (`?run=<run_id>` on this page's address; the id
    percent-encoded, so whatever it holds stays one query value), with `kept`, how long the server keeps it
    (`kvlab.ui.compare.kept_runs.policy_text`)."""
    link = html_text(f"?{quote(param, safe='')}={quote(run_id, safe='')}")
    return (f'<div class="kv-share">🔗 <a href="{link}" target="_blank" id="kv-share-link">link to this result</a> '
            f'<span class="kv-small" id="kv-share-kept">(copy it to share; {html_text(kept)})</span></div>')


CSS = """
.kv-header h1 { margin-bottom: 0; }
/* table headers wrap between words, never inside one ("agreeme|nt") */
#kv-summary th, #kv-summary th *, #plan-table th, #plan-table th *, #report-table th, #report-table th * {
  word-break: normal !important;
  overflow-wrap: normal !important; hyphens: none; }
/* the summary's 15 columns in a smaller type, so more header words fit the widths gradio gives them at 1400 px */
#kv-summary th *, #kv-summary td * { font-size: 12px !important; }
#report-table th *, #report-table td * { font-size: 12px !important; }
.kv-more summary { cursor: pointer; }
/* the chatbot's label and icons sit in a bar of their own above the scrolling messages, never over a bubble */
#kvlab-chatbot .wrapper { padding-top: 28px; }
#kvlab-chatbot .bubble-wrap { border-top: 1px solid var(--border-color-primary); }
/* messages are literal text (no Markdown): keep their spaces and line breaks, so code keeps its indentation */
#kvlab-chatbot .message-content { white-space: pre-wrap; }
/* gradio pulses the border of a streaming output for as long as it streams (an endless opacity animation: the
   browser draws a frame 60 times a second, on the cores a same-machine run is timed on); the border stays, still */
.wrap.generating { animation: none !important; }
.kv-intro p { margin: 0; color: var(--body-text-color-subdued); }
.kv-small, .kv-small p { font-size: 0.9em; color: var(--body-text-color-subdued); }
.kv-keeps { font-size: 0.85em; color: var(--body-text-color-subdued); margin-bottom: 2px; }
.kv-line { padding: 6px 10px; border-radius: 6px; font-size: 0.95em; }
.kv-line-info { background: var(--background-fill-secondary); }
.kv-line-busy { background: #eef4ff; color: #1d4ed8; }
.kv-line-ok { background: #ecfdf3; color: #067647; }
.kv-line-error { background: #fef3f2; color: #b42318; font-weight: 600; }
.kv-runbar { align-items: center; }
.kv-modelbar { align-items: flex-end; }
#kv-load { margin-bottom: 4px; }
.kv-card { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px !important;
           background: var(--background-fill-primary); gap: 6px !important; }
.kv-about, .kv-about p { font-size: 0.8em; line-height: 1.35; color: var(--body-text-color-subdued); margin: 0; }
.kv-knobs { gap: 4px !important; }
.kv-knobs label span { font-size: 0.75em; white-space: normal !important; overflow-wrap: anywhere;
                       text-overflow: clip !important; overflow: visible !important; }
.kv-status { font-size: 0.85em; line-height: 1.5; }
.kv-title { font-weight: 600; font-size: 1.05em; }
.kv-badge { display: inline-block; padding: 0 8px; border-radius: 999px; font-size: 0.85em; font-weight: 600;
            background: #e5e7eb; color: #374151; margin-right: 6px; }
.kv-s-running .kv-badge { background: #dbeafe; color: #1d4ed8; }
.kv-s-done .kv-badge { background: #dcfce7; color: #15803d; }
.kv-s-stopped .kv-badge { background: #fef9c3; color: #854d0e; }
.kv-s-error .kv-badge { background: #fee2e2; color: #b91c1c; }
.kv-s-unavailable .kv-badge { background: #f3f4f6; color: #6b7280; }
.kv-s-unavailable { opacity: 0.75; }
.kv-readout { font-variant-numeric: tabular-nums; }
.kv-msg { color: #b42318; font-size: 0.9em; }
.kv-s-unavailable .kv-msg, .kv-s-stopped .kv-msg, .kv-s-done .kv-msg { color: var(--body-text-color-subdued); }
.kv-text textarea { font-size: 0.85em !important; line-height: 1.4 !important; }
.kv-strip { font-size: 0.85em; }
.kv-strip-row { display: flex; align-items: flex-start; gap: 8px; margin-bottom: 6px; }
.kv-strip-label { flex: 0 0 150px; color: var(--body-text-color-subdued); line-height: 1.25; }
.kv-strip-cells { display: flex; flex-wrap: wrap; gap: 1px; }
.kv-tok { display: inline-block; width: 8px; height: 18px; border-radius: 1px; }
.kv-st-sink { background: #9333ea; }
.kv-st-held { background: #2563eb; }
.kv-st-quantized { background: #0d9488; }
.kv-st-residual { background: #f59e0b; }
.kv-st-evicted { background: #d1d5db; }
.kv-st-unused { background: transparent; outline: 1px dashed #9ca3af; outline-offset: -1px; }
.kv-st-none { background: transparent; }
.kv-strip-legend { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 4px; color: var(--body-text-color-subdued); }
.kv-strip-legend .kv-tok { margin-right: 4px; vertical-align: middle; }
.kv-shared-legend .role-legend { display: none; }
.kv-legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 0.85em; padding: 2px 4px; }
.kv-leg { white-space: nowrap; display: inline-flex; align-items: center; gap: 5px; }
.kv-sw, .kv-sw-pred { display: inline-block; width: 18px; height: 4px; border-radius: 2px; background: var(--c); }
.kv-sw-pred { height: 2px; border: 1px solid var(--c); background: transparent; }
.kv-strip-empty { color: var(--body-text-color-subdued); font-style: italic; }
""" + "".join(f".kv-slot-{i} {{ border-top: 4px solid {color} !important; }}\n" for i, color in enumerate(COLORS))
"""The app's style sheet: the Compare cards and status lines, reused by the Chat card; the Inspect tab's token
strip (one colour per `kvlab.inspect.inspector.STRIP_STATES` state)."""
