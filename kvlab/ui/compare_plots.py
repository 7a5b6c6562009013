"""Compare's live plots: gradio's native `gr.LinePlot`s, drawn in the browser, with an on-demand PNG export.

`LivePlots().build()` lays out, inside the caller's layout, four line plots (cache bytes per generated token,
per-token latency, process memory, and on a hybrid model cache bytes by layer type), each series in its
column's colour with the prediction in a lighter shade, tooltips giving the value with its unit; below them
an "Export PNG" button that renders the matplotlib figure (`kvlab.ui.figures.render_figure`) of the last run
only when clicked, never while columns decode. `updates(view)` gives the {component: update} that refreshes
every plot from a `RunView`; `cleared()` hides them for a new run. The data comes from `kvlab.ui.plot_frames`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from . import plot_frames as frames
from .figures import figure_png, render_figure
from .records import EXPORTS_DIR

PLOT_HEIGHT_PX = 300
LEGEND_ROW_PX = 17
"""Height of one legend entry in vega's default legend; a plot grows so that every entry shows."""
LEGEND_MARGIN_PX = 90
BUTTONS = ["fullscreen", "export"]


def line_plot(spec: frames.PlotSpec, elem_id: str, visible: bool = True, color_map: dict | None = None,
              **more) -> gr.LinePlot:
    """A `gr.LinePlot` for a `plot_frames.PlotSpec`: series by colour, the full series name (the legend may
    shorten a long one) and the value with its unit in the tooltip."""
    return gr.LinePlot(None, x=spec.x, y=spec.y, color="series", title=spec.title, x_title=spec.x_title,
                       y_title=spec.y_title, color_title="", tooltip=["series", "value"], height=PLOT_HEIGHT_PX,
                       color_map=color_map, buttons=BUTTONS, elem_id=elem_id, visible=visible, **more)


def plot_height(frame) -> int:
    """Pixels a plot of `frame` needs so that its legend lists every series (at least PLOT_HEIGHT_PX)."""
    series = 0 if frame is None or frame.empty else frame["series"].nunique()
    return max(PLOT_HEIGHT_PX, LEGEND_MARGIN_PX + LEGEND_ROW_PX * series)


def sized(frame, **more) -> dict:
    """`gr.update` of a plot to `frame`, tall enough for its legend (`plot_height`)."""
    return gr.update(value=frame, height=plot_height(frame), **more)


class LivePlots:
    """The Compare tab's plots and their PNG export (see the module docstring)."""

    def build(self) -> "LivePlots":
        with gr.Column(visible=False, elem_id="kv-plots") as self.box:
            with gr.Row(equal_height=True):
                self.cache = line_plot(frames.CACHE, "kv-plot-cache")
                self.latency = line_plot(frames.LATENCY, "kv-plot-latency")
                self.memory = line_plot(frames.MEMORY, "kv-plot-memory", color_map=frames.MEMORY_COLORS)
            self.by_type = line_plot(frames.BY_LAYER_TYPE, "kv-plot-by-type", visible=False)
            with gr.Row(equal_height=True):
                self.notes = gr.Markdown("", elem_classes=["kv-small"], elem_id="kv-plot-notes")
                self.png_button = gr.Button("Export PNG", size="sm", scale=0, min_width=140, elem_id="kv-export-png")
                self.png = gr.File(label="plots PNG (matplotlib)", interactive=False, visible=False, scale=1,
                                   elem_id="kv-png")
        return self

    @property
    def outputs(self) -> list:
        """Every component `updates` and `cleared` may change."""
        return [self.box, self.cache, self.latency, self.memory, self.by_type, self.notes, self.png]

    def cleared(self) -> dict:
        """Shown and emptied, for a run that starts."""
        return {self.box: gr.update(visible=True), self.cache: None, self.latency: None, self.memory: None,
                self.by_type: gr.update(value=None, visible=False), self.notes: "",
                self.png: gr.update(value=None, visible=False)}

    def updates(self, view) -> dict:
        """Every plot redrawn from `view` (a `kvlab.ui.compare_view.RunView`), each series in its colour."""
        colors = frames.compare_colors(view)
        by_type = frames.layer_type_frame(view)
        return {
            self.box: gr.update(visible=True),
            self.cache: sized(frames.cache_frame(view), color_map=colors),
            self.latency: sized(frames.latency_frame(view), color_map=colors),
            self.memory: frames.memory_frame(view.memory),
            self.by_type: sized(by_type, color_map=colors, visible=not by_type.empty),
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
