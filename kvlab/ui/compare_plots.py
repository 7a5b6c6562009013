"""Compare's live plots: gradio's native `gr.LinePlot`s, drawn in the browser, with an on-demand PNG export.

`LivePlots().build()` lays out, inside the caller's layout, four line plots (cache bytes per generated token,
per-token latency, process memory, and on a hybrid model cache bytes by layer type), each series in its
column's colour with the prediction in a lighter shade, tooltips giving the value with its unit. The column
plots share one legend above them (`legend_html`, an HTML row that wraps, every series named in full): vega's
own legend is a single row under each plot and is cut off once six columns run. Below the plots
an "Export PNG" button that renders the matplotlib figure (`kvlab.ui.figures.render_figure`) of the last run
only when clicked, never while columns decode. `updates(view)` gives the {component: update} that refreshes
every plot from a `RunView`; `cleared()` hides them for a new run. The data comes from `kvlab.ui.plot_frames`.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

import gradio as gr

from . import plot_frames as frames
from .figures import figure_png, render_figure
from .records import EXPORTS_DIR

PLOT_HEIGHT_PX = 300
BUTTONS = ["fullscreen", "export"]
NO_LEGEND: list = []
"""`colors_in_legend=[]`: gradio draws no vega legend for the plot (the shared HTML legend names its series)."""


def line_plot(spec: frames.PlotSpec, elem_id: str, visible: bool = True, color_map: dict | None = None,
              **more) -> gr.LinePlot:
    """A `gr.LinePlot` for a `plot_frames.PlotSpec`: series by colour, the series name and the value with its
    unit in the tooltip."""
    return gr.LinePlot(None, x=spec.x, y=spec.y, color="series", title=spec.title, x_title=spec.x_title,
                       y_title=spec.y_title, color_title="", tooltip=["series", "value"], height=PLOT_HEIGHT_PX,
                       color_map=color_map, buttons=BUTTONS, elem_id=elem_id, visible=visible, **more)


def legend_html(frames_: list, colors: dict[str, str]) -> str:
    """One wrapping row of legend entries (a colour swatch and the full series name) for every series in
    `frames_` (DataFrames with a `series` column), in order of first appearance; '' when there is none.
    A prediction's swatch is its lighter colour, drawn hollow."""
    names = list(dict.fromkeys(name for frame in frames_ if frame is not None and not frame.empty
                               for name in frame["series"]))
    entries = []
    for name in names:
        color = colors.get(name, "#888888")
        kind = "kv-sw-pred" if name.endswith(" " + frames.PREDICTED) else "kv-sw"
        entries.append(f'<span class="kv-leg"><i class="{kind}" style="--c:{color}"></i>{html.escape(name)}</span>')
    return f'<div class="kv-legend">{"".join(entries)}</div>' if entries else ""


class LivePlots:
    """The Compare tab's plots and their PNG export (see the module docstring)."""

    def build(self) -> "LivePlots":
        with gr.Column(visible=False, elem_id="kv-plots") as self.box:
            self.legend = gr.HTML("", elem_id="kv-plot-legend")
            with gr.Row(equal_height=True):
                self.cache = line_plot(frames.CACHE, "kv-plot-cache", colors_in_legend=NO_LEGEND)
                self.latency = line_plot(frames.LATENCY, "kv-plot-latency", colors_in_legend=NO_LEGEND)
                self.memory = line_plot(frames.MEMORY, "kv-plot-memory", color_map=frames.MEMORY_COLORS)
            self.by_type = line_plot(frames.BY_LAYER_TYPE, "kv-plot-by-type", visible=False,
                                     colors_in_legend=NO_LEGEND)
            with gr.Row(equal_height=True):
                self.notes = gr.Markdown("", elem_classes=["kv-small"], elem_id="kv-plot-notes")
                self.png_button = gr.Button("Export PNG", size="sm", scale=0, min_width=140, elem_id="kv-export-png")
                self.png = gr.File(label="plots PNG (matplotlib)", interactive=False, visible=False, scale=1,
                                   elem_id="kv-png")
        return self

    @property
    def outputs(self) -> list:
        """Every component `updates` and `cleared` may change."""
        return [self.box, self.legend, self.cache, self.latency, self.memory, self.by_type, self.notes, self.png]

    def cleared(self) -> dict:
        """Shown and emptied, for a run that starts."""
        return {self.box: gr.update(visible=True), self.legend: "", self.cache: None, self.latency: None,
                self.memory: None,
                self.by_type: gr.update(value=None, visible=False), self.notes: "",
                self.png: gr.update(value=None, visible=False)}

    def updates(self, view) -> dict:
        """Every plot redrawn from `view` (a `kvlab.ui.compare_view.RunView`), each series in its colour."""
        colors = frames.compare_colors(view)
        cache, latency, by_type = frames.cache_frame(view), frames.latency_frame(view), frames.layer_type_frame(view)
        return {
            self.box: gr.update(visible=True),
            self.legend: legend_html([cache, latency, by_type], colors),
            self.cache: gr.update(value=cache, color_map=colors),
            self.latency: gr.update(value=latency, color_map=colors),
            self.memory: frames.memory_frame(view.memory),
            self.by_type: gr.update(value=by_type, color_map=colors, visible=not by_type.empty),
            self.notes: frames.switch_notes(view),
        }

    def export(self, view) -> dict:
        """The "Export PNG" click: the matplotlib figure of `view` as a PNG file (None: nothing to draw yet)."""
        if view is None:
            return {self.png: gr.update(value=None, visible=False),
                    self.notes: "nothing to export yet: run (or replay) first"}
        return {self.png: gr.update(value=write_png(view), visible=True)}


def write_png(view) -> str:
    """The path of a fresh PNG of `view`'s matplotlib figure under EXPORTS_DIR."""
    EXPORTS_DIR.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="png-", dir=EXPORTS_DIR))
    path = folder / "kvlab-plots.png"
    path.write_bytes(figure_png(render_figure(view)))
    return str(path)
