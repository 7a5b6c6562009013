"""The Report tab: the field's quality figures for every picked cache, streamed in as the text is scored.

Inputs: the model, the text (the shipped long text or the user's own), the columns in compare syntax and the
split (context tokens prefilled through each cache as Compare does it, then scored tokens fed one per forward
beside the dense reference). Outputs: the table (llama.cpp's `--kl-divergence` figures per column: PPL ratio,
ΔPPL ± SE, mean / p99 / max KL, top-1 agreement with its 95 % interval, exact cache bytes and relative to
dense, decode tok/s; a column that cannot run has its own row with the reason) filling in every few tokens, a
quality-vs-bytes scatter plot (gradio's native `gr.ScatterPlot`: mean KL or ΔPPL against cache MiB, the
Pareto front named in its caption and hover, every figure in the hover), the JSON record and CSV to download,
and a file input that rebuilds the table and plot from saved report, Compare and Needle records (merged).
This module lays out and wires; the view model is `kvlab.ui.report.view`'s, the run
`kvlab.quality.report.run_report`'s. Per-session state (the stop event, the rows shown) lives in `gr.State`.
"""

from __future__ import annotations

import json
import logging
import threading

import gradio as gr

from kvlab.protocol import RunDone
from kvlab.quality.report import ReportProgress, run_report
from kvlab.quality.table import rows_to_csv
from kvlab.measure.record_json import cap_text
from kvlab.sharing.cost import RunCost

from ..hosting import zerogpu
from ..hosting.costs import stream_cost
from ..shared.exports import fresh_export_folder
from ..shared.live_plots import plot_update, roster_colors
from ..shared.markup import md_text
from ..shared.model_picker import model_dropdown
from ..shared.redraw import Redraw
from ..shared.runs import PRIVATE, load_and_plan, session_stop, wire_run
from ..shared.theme import COLORS
from .view import (BUILT_IN, CLI_COLUMN_COUNT, DEFAULT_COLUMNS, DEFAULT_CONTEXT_TOKENS, DEFAULT_SCORED_TOKENS,
                   HOVER_FIELDS, MAX_CONTEXT_TOKENS, MAX_SCORED_TOKENS, PASTED, Y_CHOICES, Y_TITLES, ReportRequest,
                   ReportView, plan_report, plot_caption, plot_frame, plot_limits, replay_status, rows_from_files,
                   series_names, table_frame)

logger = logging.getLogger(__name__)
EXPLAIN = (
    "How much does each cache change the model's predictions, and what does it save? The text's first "
    "**context tokens** are prefilled through each column's cache (an eviction method compresses them there, "
    "as Compare does), then each **scored token** is fed one per forward, every column in turn beside a dense "
    "`dynamic` reference. Per column, as `llama-perplexity --kl-divergence` reports them: PPL ratio and ΔPPL "
    "± SE, mean / p99 / max KL(dense ‖ column), top-1 agreement with its Wilson 95 % interval, the cache's exact "
    "bytes (mean over the scored tokens) and relative to dense, decode tok/s.")
COLUMNS_INFO = ("compare syntax, comma-separated; this tab starts with three. `kvlab report` (the command line) "
                f"runs the full default set of {CLI_COLUMN_COUNT}: sink and window at two sizes, quanto and hqq "
                "int2/int4, fp8 and the seven eviction methods (docs/report.md)")
PLOT_HEIGHT_PX = 340


class ReportTab:
    """The Report tab's components and handlers; `pool` is the app's shared ModelPool."""

    def __init__(self, pool):
        self.pool = pool

    def build(self) -> "ReportTab":
        gr.Markdown(EXPLAIN)
        with gr.Row():
            self.source = model_dropdown("bundled", scale=2, elem_id="report-model")
            self.text_choice = gr.Radio([BUILT_IN, PASTED], value=BUILT_IN, label="text", scale=2,
                                        elem_id="report-text")
        self.columns = gr.Textbox(DEFAULT_COLUMNS, label="columns", info=COLUMNS_INFO, elem_id="report-columns")
        with gr.Row():
            self.context = gr.Slider(1, MAX_CONTEXT_TOKENS, value=DEFAULT_CONTEXT_TOKENS, step=1,
                                     label="context tokens (prefilled)", elem_id="report-context")
            self.scored = gr.Slider(1, MAX_SCORED_TOKENS, value=DEFAULT_SCORED_TOKENS, step=1,
                                    label="scored tokens (one per forward)", elem_id="report-scored")
        self.pasted = gr.Textbox(label="your text: at least context + scored tokens long", lines=3, visible=False,
                                 elem_id="report-pasted")
        with gr.Row():
            self.run_button = gr.Button("Run report", variant="primary", elem_id="report-run")
            self.stop_button = gr.Button("Stop", elem_id="report-stop")
        self.status = gr.Markdown("", elem_id="report-status")
        self.table = gr.Dataframe(label="quality report", interactive=False, wrap=True, elem_id="report-table")
        self.y_choice = gr.Radio(list(Y_CHOICES), value="mean KL", label="plot against cache bytes",
                                 elem_id="report-y")
        self.plot = gr.ScatterPlot(None, x="cache_MiB", y="y", color="series", title="quality vs cache bytes",
                                   x_title="KV cache MiB (mean over the scored tokens)", y_title=Y_TITLES["kld_mean"],
                                   color_title="", tooltip=HOVER_FIELDS, height=PLOT_HEIGHT_PX,
                                   buttons=["fullscreen", "export"], elem_id="report-plot")
        self.front = gr.Markdown("", elem_classes=["kv-small"], elem_id="report-front")
        with gr.Row(equal_height=True):
            self.download = gr.File(label="record (JSON) and table (CSV)", file_count="multiple", interactive=False,
                                    elem_id="report-download", scale=1)
            self.saved = gr.File(label="load saved records (report, Compare, Needle JSON; several merge into one "
                                       f"table): each {cap_text()}", file_count="multiple",
                                 file_types=[".json"], type="filepath",
                                 elem_id="report-saved", scale=1)
        self.session = gr.State({})
        self._wire()
        return self

    def _wire(self) -> None:
        self.run_inputs = [self.session, self.source, self.text_choice, self.pasted, self.columns, self.context,
                           self.scored, self.y_choice]
        wire_run(self.run_button, self.stop_button, self.session, self.status, zerogpu.gpu(self._on_run, self.gpu_s),
                 self.run_inputs, [self.status, self.table, self.plot, self.front, self.download], self.cost)
        self.text_choice.change(lambda choice: gr.update(visible=choice == PASTED), self.text_choice, self.pasted,
                                **PRIVATE)
        self.y_choice.change(self.switch_y, [self.session, self.y_choice], [self.plot, self.front], **PRIVATE)
        self.saved.upload(self.replay, [self.session, self.saved, self.y_choice],
                          [self.status, self.table, self.plot, self.front, self.download], **PRIVATE)

    def gpu_s(self, session, source, text_choice, pasted, columns, context, scored, y_label) -> int:
        """ZeroGPU seconds a run asks for: its columns (and the reference) × scored tokens."""
        return zerogpu.estimate_s(len([c for c in (columns or "").split(",") if c.strip()]) + 1, int(scored or 1))

    @staticmethod
    def cost(session, source, text_choice, pasted, columns, context, scored, y_label) -> RunCost:
        """What a run costs before it is queued: its columns and the reference, each scoring `scored` tokens
        after `context` (`costs.stream_cost`)."""
        return stream_cost(len([c for c in (columns or "").split(",") if c.strip()]) + 1, scored, context)

    def _on_run(self, session, source, text_choice, pasted, columns, context, scored, y_label):
        request = ReportRequest(source=source, text_choice=text_choice, pasted=pasted, columns=columns,
                                context_tokens=context, scored_tokens=scored)
        session["y"] = Y_CHOICES.get(y_label, "kld_mean")
        yield from self.stream(request, session_stop(session), session)

    def redraw(self, rows: list[dict], roster: list[str], y: str, primer: bool = False, blank: bool = False) -> dict:
        """The plot from `rows`, every series of `roster` in its colour from the first frame on (blank rows), and
        the line under it naming the Pareto front: one frame of `kvlab.ui.shared.redraw.Redraw`'s protocol, the
        colours in lower-case hex for a `primer` (upper case otherwise), no point drawn when `blank`."""
        if not roster:
            return {self.plot: plot_update(None, {}), self.front: ""}
        colors = roster_colors(dict(zip(roster, COLORS * (len(roster) // len(COLORS) + 1))), roster, primer)
        frame = plot_frame([] if blank else rows, y, roster)
        return {self.plot: gr.update(value=frame, color_map=colors, x_lim=plot_limits(frame), y_title=Y_TITLES[y]),
                self.front: plot_caption(rows, y)}

    def show(self, view: ReportView, y: str, primer: bool = False) -> dict:
        """Status, table and plot from the run's `view`."""
        rows = view.rows()
        return {self.status: view.status_text(), self.table: table_frame(rows),
                **self.redraw(rows, view.roster(), y, primer)}

    def record_files(self, record: dict, rows: list[dict]) -> list[str]:
        """The run's JSON record and its table as CSV, in a fresh export folder."""
        folder = fresh_export_folder("report-")
        (folder / "report.json").write_text(json.dumps(record, indent=1))
        (folder / "report.csv").write_text(rows_to_csv(rows))
        return [str(folder / "report.json"), str(folder / "report.csv")]

    def stream(self, request: ReportRequest, stop: threading.Event, session: dict | None = None):
        """Load, check and run the report, yielding {component: update}; bad input ends with one status line and
        leaves the table and plot as they were. The plot's figure is the session's `y` (the radio's, which may
        change while the run goes on; mean KL by default)."""
        session = session if session is not None else {}
        ready = yield from load_and_plan(self.pool, request.source, self.status, lambda m: plan_report(request, m))
        if ready is None:
            return
        loaded, plan = ready
        view, y = ReportView(loaded.info()["name"]), session.get("y", "kld_mean")
        redraw = Redraw(lambda primer=False: self.show(view, y, primer))  # the figure `y` as it is when drawn
        yield {self.status: "warming up the caches and prefilling the context…", self.download: None}
        try:
            for event in run_report(loaded, plan.input_ids, request.columns, scored_tokens=plan.split.scored_tokens,
                                    context_tokens=plan.split.context_tokens, stop=stop,
                                    progress_every=plan.progress_every, text_info=plan.text_info):
                if isinstance(event, (ReportProgress, RunDone)):
                    yield from redraw.ahead(view.has_points())
                view.apply(event)
                session["rows"], y = view.rows(), session.get("y", "kld_mean")
                if isinstance(event, RunDone):
                    yield from redraw.finish({self.download: self.record_files(event.record, view.rows())})
                elif not isinstance(event, ReportProgress) or view.round_complete():  # RunStarted: a primer, no point yet
                    yield redraw.live(view.has_points())
        except Exception as err:  # the page says what failed and keeps what was scored
            logger.exception("report run failed")
            kept = self.show(view, y) if view.split is not None else {}
            yield {**kept, self.status: f"⚠️ the report failed: {type(err).__name__}: {md_text(err)}"}

    def switch_y(self, session: dict, y_label: str):
        """The radio: the plot redrawn from the rows shown against the other figure (`Redraw.switch`: twice, the
        second time as a primer, so the spec is rebuilt from the new frame)."""
        rows = session.get("rows") or []
        y = session["y"] = Y_CHOICES.get(y_label, "kld_mean")
        roster = series_names(rows)
        yield from Redraw(lambda primer=False: self.redraw(rows, roster, y, primer)).switch()

    def replay(self, session: dict, paths, y_label: str):
        """Saved records in: the merged table and plot, and the merged table as CSV. A file that cannot be read
        is one status line; when none can, the table and plot stay as they were."""
        rows, problems = rows_from_files(paths)
        status = replay_status(rows, len(paths) - len(problems), problems)
        if not rows:
            yield {self.status: status}
            return
        session["rows"] = rows
        y, roster = Y_CHOICES.get(y_label, "kld_mean"), series_names(rows)
        session["y"] = y
        folder = fresh_export_folder("report-merged-")
        (folder / "report-merged.csv").write_text(rows_to_csv(rows))
        yield from Redraw(lambda primer=False, blank=False: self.redraw(rows, roster, y, primer, blank)).replay(
            {self.status: status, self.table: table_frame(rows), self.download: [str(folder / "report-merged.csv")]})


def build_report_tab(pool) -> ReportTab:
    """Build the Report tab inside the current `gr.Tab`; returns it."""
    return ReportTab(pool).build()
