"""The Needle tab: passkey retrieval per cache strategy, live heatmaps and recall against cache bytes.

Inputs: the model, the columns (compare syntax, knob sweeps as `sink:window_length=64|128|256`), the grid
(lengths such as `512,1k,2k`, depths, seeds) and the greedy tokens per answer. Outputs: one heatmap per
column that runs (context length x depth; hit, miss or beyond the model on one shared colour scale, a hover
with the answer, key, key log-prob and cache MiB) filling in as cells finish, a plot of hit rate against mean
cache MiB with the Pareto front, the summary table (a column that cannot run has no heatmap: its reason is in
the table's wrapping note) and the JSON and CSV records to download. This module lays out and
wires; the view model is `kvlab.ui.needle.view`'s, the run `kvlab.needle.runner`'s.
"""

from __future__ import annotations

import functools
import json

import gradio as gr

from kvlab.columns import MAX_COLUMNS, Column, parse_columns
from kvlab.models.loading import ModelLoadError, ModelSpec
from kvlab.needle.grid import DEFAULT_NEW_TOKENS, MAX_NEW_TOKENS, GridError, expand_sweeps, parse_grid, split_items
from kvlab.needle.preset import list_needle_presets
from kvlab.needle.prompt import key_tokens, min_context_tokens
from kvlab.needle.record import records_to_csv
from kvlab.needle.runner import NeedleCell, max_positions, run_needle
from kvlab.presets import PresetError
from kvlab.protocol import RunDone
from kvlab.sharing.cost import RunCost

from ..hosting.costs import needle_cost
from ..shared.live_plots import plot_update, roster_colors
from ..shared.exports import fresh_export_folder
from ..shared.markup import md_text
from ..shared.model_picker import model_dropdown
from ..shared.redraw import Redraw
from ..shared.runs import PRIVATE, session_stop, wire_run
from .view import NO_PRESET, OUTCOME_COLORS, RATE_LIMITS, NeedleView, preset_fields
from ..shared.theme import COLORS

DEFAULT_COLUMNS = "dynamic, sink:window_length=128, quantized:backend=quanto:nbits=4"
DEFAULT_LENGTHS = "256, 512, 1k"
DEFAULT_DEPTHS = "0, 0.25, 0.5, 0.75, 1"
HEATMAP_HEIGHT_PX = 220
TABLE_WIDTHS = ["14%", "9%", "7%", "11%", "9%", "8%", "42%"]
"""Widths of the summary table's columns (column, hits, gated, log-prob, MiB, vs dense, note): the note wraps
inside the page."""
DEPTH_FORMAT = ".2~f"
"""d3 format of the depth axis: 0, 0.25, 0.5, 1."""
MIB_FORMAT = ".2~f"
"""d3 format of the mean cache MiB axis."""
RATE_FORMAT = ".0%"
"""d3 format of the hit rate axis (a fraction shown as a percentage)."""
EXPLAIN = (
    "Does each cache keep the model right at long context? Every cell hides a 5-digit pass key in filler text "
    "(the passkey prompt of Landmark Attention, Mohtashami & Jaggi 2023, arXiv:2305.16300, as reused by LongLoRA "
    "and Quest; raw text), prefills it through each column's cache and asks for the key. A **hit** is the key in "
    "the greedy answer. A cell the dense column misses is **beyond the model** in every column. Sweep a knob "
    "with `|`, e.g. `sink:window_length=64|128|256`.")


def column_specs(text: str) -> list[Column]:
    """Columns from compare syntax with sweeps expanded; a bad item becomes a rejected column (its message in
    its own place). Raises ValueError when there is none or more than MAX_COLUMNS."""
    return parse_columns(expand_sweeps(split_items((text or "").replace(" ", ""))), MAX_COLUMNS,
                         empty="name at least one column, e.g. dynamic, sink:window_length=128",
                         counted=" (sweeps included)")


class NeedleTab:
    """The Needle tab's components and handlers; `pool` is the app's shared ModelPool."""

    def __init__(self, pool):
        self.pool = pool

    def build(self) -> "NeedleTab":
        gr.Markdown(EXPLAIN)
        with gr.Row():
            self.preset = gr.Dropdown([NO_PRESET, *list_needle_presets()], value=NO_PRESET, label="preset",
                                      info="fills the columns and the grid", scale=1, elem_id="needle-preset")
            self.source = model_dropdown("bundled", scale=2, elem_id="needle-model")
            self.columns = gr.Textbox(DEFAULT_COLUMNS, label="columns (compare syntax)", scale=3,
                                      elem_id="needle-columns")
        with gr.Row():
            self.lengths = gr.Textbox(DEFAULT_LENGTHS, label="context lengths (tokens)", elem_id="needle-lengths")
            self.depths = gr.Textbox(DEFAULT_DEPTHS, label="needle depths (0 = first, 1 = last)",
                                     elem_id="needle-depths")
            self.seeds = gr.Textbox("0", label="seeds (keys and filler offsets)", elem_id="needle-seeds")
            self.new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=DEFAULT_NEW_TOKENS, step=1,
                                        label="new tokens per answer", elem_id="needle-new-tokens")
        with gr.Row():
            self.run_button = gr.Button("Run needle", variant="primary", elem_id="needle-run")
            self.stop_button = gr.Button("Stop", elem_id="needle-stop")
        self.status = gr.Markdown("", elem_id="needle-status")
        with gr.Row(elem_id="needle-heatmaps"):
            self.heatmaps = [gr.ScatterPlot(None, x="tokens", y="depth", color="outcome", title=f"column {i + 1}",
                                            x_title="context tokens", y_title="needle depth",
                                            tooltip=["outcome", "answer", "key", "key_logprob", "cache_MiB"],
                                            color_map=OUTCOME_COLORS, height=HEATMAP_HEIGHT_PX, visible=False,
                                            y_axis_format=DEPTH_FORMAT, elem_id=f"needle-heatmap-{i}",
                                            min_width=260)
                             for i in range(MAX_COLUMNS)]
        self.pareto = gr.ScatterPlot(None, x="cache_MiB", y="shown_rate", color="column", title="hit rate vs cache",
                                     x_title="mean cache MiB",
                                     y_title="hit rate (cells not gated; columns sharing a point drawn apart)",
                                     tooltip=["column", "hit_rate", "cache_MiB", "pareto", "shares_point_with"],
                                     elem_id="needle-pareto", y_lim=list(RATE_LIMITS),
                                     x_axis_format=MIB_FORMAT, y_axis_format=RATE_FORMAT, height=300)
        self.table = gr.Dataframe(label="per column", interactive=False, wrap=True,
                                  column_widths=TABLE_WIDTHS, elem_id="needle-table")
        self.download = gr.File(label="record (JSON, CSV)", file_count="multiple", elem_id="needle-record")
        self.session = gr.State({})
        outputs = [self.status, *self.heatmaps, self.pareto, self.table, self.download]
        wire_run(self.run_button, self.stop_button, self.session, self.status, self.stream,
                 [self.session, self.source, self.columns, self.lengths, self.depths, self.seeds, self.new_tokens],
                 outputs, self.cost)
        self.preset.change(self.apply_preset, self.preset,
                           [self.columns, self.lengths, self.depths, self.seeds, self.new_tokens, self.status], **PRIVATE)
        return self

    @staticmethod
    def cost(session, source, columns_text, lengths, depths, seeds, new_tokens) -> RunCost:
        """What a run costs before it is queued: its columns × its grid's cells (`costs.needle_cost`)."""
        return needle_cost(expand_sweeps(split_items((columns_text or "").replace(" ", ""))), lengths, depths, seeds,
                           new_tokens)

    def apply_preset(self, name: str):
        """Fill the form from needle preset `name` (NO_PRESET leaves it); a broken preset says why in the status."""
        try:
            fields = preset_fields(name)
        except PresetError as err:
            return *[gr.update()] * 5, f"⚠ {md_text(err)}"
        if fields is None:
            return *[gr.update()] * 5, ""
        return (fields["columns"], fields["lengths"], fields["depths"], fields["seeds"], fields["new_tokens"],
                f"preset **{md_text(name)}**: {md_text(fields['description'])}")

    def redraw(self, view: NeedleView, primer: bool = False) -> dict:
        """Every heatmap, the Pareto plot, the status and the table, from `view`: one frame of
        `kvlab.ui.shared.redraw.Redraw`'s live-run protocol, the colour maps in lower-case hex for a `primer`
        (upper case otherwise). Every frame holds every series of its plot's roster (every outcome; every
        column that runs, see `NeedleView`), so the colour map is the roster from the first update to the last.
        A column that never ran has no heatmap."""
        updates = {self.status: view.status_text()}
        outcome_colors = roster_colors(OUTCOME_COLORS, list(OUTCOME_COLORS), primer)
        for i, plot in enumerate(self.heatmaps):
            if i < len(view.columns) and view.ran(i):
                title = view.columns[i] + (f" — {view.messages[i]}" if i in view.messages else "")
                updates[plot] = gr.update(value=view.heatmap_frame(i), color_map=outcome_colors, visible=True,
                                          title=title[:90])
            else:
                updates[plot] = gr.update(visible=False, value=None)
        roster = view.pareto_roster()
        colors = roster_colors(dict(zip(view.columns, COLORS)), roster, primer)
        x_lim, y_lim = view.pareto_limits()
        updates[self.pareto] = (gr.update(value=view.pareto_frame(), color_map=colors, x_lim=x_lim, y_lim=y_lim)
                                if roster else plot_update(None, colors))
        updates[self.table] = view.table()
        return updates

    def record_files(self, record: dict, records) -> list[str]:
        """The run's JSON record and its CSV (one row per cell), written to a fresh export folder."""
        folder = fresh_export_folder("needle-")
        (folder / "needle.json").write_text(json.dumps(record, indent=1))
        (folder / "needle.csv").write_text(records_to_csv(records))
        return [str(folder / "needle.json"), str(folder / "needle.csv")]

    def stream(self, session, source, columns_text, lengths, depths, seeds, new_tokens):
        """Load, check and run the grid, yielding {component: update}; bad input ends with a message."""
        stop = session_stop(session)
        yield {self.status: "loading the model…", self.download: None}
        try:
            columns = column_specs(columns_text)
            loaded = self.pool.get(ModelSpec.from_field(source))
            grid = parse_grid(lengths, depths, seeds, int(new_tokens), max_positions=max_positions(loaded),
                              min_tokens=min_context_tokens(loaded.tokenizer),
                              key_tokens=functools.partial(key_tokens, loaded.tokenizer))
        except (ValueError, GridError, ModelLoadError) as err:
            yield {self.status: f"⚠️ {md_text(err)}"}
            return
        view = NeedleView()
        redraw = Redraw(functools.partial(self.redraw, view))
        for event in run_needle(loaded, columns, grid, stop):
            if isinstance(event, (NeedleCell, RunDone)):
                yield from redraw.ahead(bool(view.records))
            view.apply(event)
            if isinstance(event, RunDone):
                yield from redraw.finish({self.download: self.record_files(event.record, event.results)})
            else:
                yield redraw.live(bool(view.records))


def build_needle_tab(pool) -> NeedleTab:
    """Build the Needle tab inside the current `gr.Tab`; returns it."""
    return NeedleTab(pool).build()
