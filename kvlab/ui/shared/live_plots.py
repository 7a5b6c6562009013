"""Compare's live plots: gradio's native `gr.LinePlot`s, drawn in the browser, with an on-demand PNG export.

`LivePlots().build()` lays out, inside the caller's layout, four line plots (cache bytes per generated token,
per-token latency, process memory, and on a hybrid model cache bytes by layer type), each series in its
column's colour with the prediction in a lighter shade, tooltips giving the value with its unit. The column
plots share one legend above them (`legend_html`, an HTML row that wraps, every series named in full): vega's
own legend is a single row under each plot and is cut off once six columns run. Below the plots
an "Export PNG" button that renders the matplotlib figure (`kvlab.ui.shared.figures.render_figure`) of the last run
only when clicked, never while columns decode. `updates(view)` gives the {component: update} that refreshes
every plot from a `RunView`; `cleared()` hides them for a new run. The data comes from `kvlab.ui.shared.plot_frames`.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from . import plot_frames as frames
from .figures import figure_png, render_figure
from .exports import fresh_export_folder
from .markup import html_text, md_text

PLOT_HEIGHT_PX = 300
BUTTONS = ["fullscreen", "export"]
NO_COLOR = "#888888"
"""Colour of a series missing from the colour map given."""
NOT_RECORDED = "process memory not recorded: this record has no samples (records written before they kept them)"
"""The memory plot's caption for a finished run (a replayed CLI record) with no memory samples."""
SHARED_LEGEND = "kv-shared-legend"
"""Class of the plots whose series the shared HTML legend names; the theme hides their own vega legend (one
row under the plot, cut off from six columns on)."""


def line_plot(spec: frames.PlotSpec, elem_id: str, visible: bool = True, color_map: dict | None = None,
              **more) -> gr.LinePlot:
    """A `gr.LinePlot` for a `plot_frames.PlotSpec`: series by colour, the series name and the value with its
    unit in the tooltip."""
    more.setdefault("caption", spec.caption or None)
    return gr.LinePlot(None, x=spec.x, y=spec.y, color="series", title=spec.title, x_title=spec.x_title,
                       y_title=spec.y_title, color_title="", tooltip=["series", "value"], height=PLOT_HEIGHT_PX,
                       color_map=color_map, buttons=BUTTONS, elem_id=elem_id, visible=visible, **more)


def plot_update(frame, colors: dict[str, str], domain: list[str] | None = None, **more) -> dict:
    """`gr.update` of a native plot to `frame`, robust to how gradio's LinePlot redraws.

    The plot builds its vega spec (axis types from the frame's dtypes, the colour domain from its series)
    on its first value and again only when a prop such as `color_map` changes, and then from the value it
    held before this update's; a new value alone only swaps the data. So an empty first frame (object dtypes:
    nominal axes, no lines) or a series that appears later (outside the colour domain: drawn in no colour)
    stayed broken for the rest of a run. Here an empty frame is sent as None, and `color_map` holds exactly
    the series of `domain` (default: `frame`'s), so that passing the series of the previously sent frame
    rebuilds the spec, from that frame, one update after the series changed (`LivePlots.settle` sends the
    last one)."""
    if frame is None or frame.empty:
        return gr.update(value=None, color_map={}, **more)
    names = domain if domain is not None else series_of(frame)
    return gr.update(value=frame, color_map={name: colors.get(name, NO_COLOR) for name in names}, **more)


def roster_colors(colors: dict[str, str], roster: list[str], primer: bool = False) -> dict[str, str]:
    """The colour map `roster_update` sends: exactly the roster's series, in upper-case hex (lower case for a
    primer, so the map differs by case alone between a run's primer and its frames)."""
    return {name: (str.lower if primer else str.upper)(colors.get(name, NO_COLOR)) for name in roster}


def roster_update(frame, spec: frames.PlotSpec, colors: dict[str, str], roster: list[str], primer: bool = False,
                  **more) -> dict:
    """`gr.update` of the native plot of `spec` to `frame`, drawing every series of `roster` (all the series
    the plot will show in this run, known before its first point) in its colour from the first frame on.

    The plot fixes its vega colour domain to the series present in the frame it builds its spec from (see
    `plot_update`), so a series whose first point comes after that frame would never be drawn. Here each
    series of `roster` without a point yet gets one empty row (y missing, x the frame's first x: vega draws
    nothing for it, but it is in the domain), and `color_map` is the whole roster from the first update of the run to the
    last, so the spec never changes mid-run. An empty roster clears the plot.

    A plot that showed another roster before (a second run) rebuilds its spec when the colour map changes,
    but from the value it held before that update: so a run starts with a `primer` (no points, every series,
    the colours in lower case) and its frames then carry the same colours in upper case, whose change
    rebuilds the spec from the primer, which holds the whole roster."""
    if not roster:
        return plot_update(None, colors, **more)
    if primer:
        frame = None
    present = set(series_of(frame))
    missing = [name for name in roster if name not in present]
    if missing:
        nan = [float("nan")] * len(missing)
        first_x = frame[spec.x].iloc[0] if frame is not None and not frame.empty else float("nan")
        blank = pd.DataFrame({spec.x: [first_x] * len(missing), spec.y: nan, "series": missing,
                              "value": [""] * len(missing)})
        frame = blank if frame is None or frame.empty else pd.concat([frame, blank], ignore_index=True)
    return gr.update(value=frame, color_map=roster_colors(colors, roster, primer), **more)


def series_of(frame) -> list[str]:
    """The series of `frame` in order of first appearance ([] for None or an empty frame)."""
    return [] if frame is None or frame.empty else list(dict.fromkeys(frame["series"]))


def column_of(name: str) -> str:
    """The column a series belongs to: `3: sink` for `3: sink`, `3: sink predicted` and `3: sink · full`."""
    return name.removesuffix(" " + frames.PREDICTED).split(" · ")[0]


def legend_html(frames_: list, colors: dict[str, str]) -> str:
    """One wrapping row with one entry per column in `frames_` (DataFrames with a `series` column), in order of
    first appearance: its colour swatch and full name, and a hollow lighter swatch beside it when the frames
    hold its prediction; then a key for the hollow swatch. A column's layer-type lines (`… · full`, `… · sliding`)
    and its prediction share its entry, so a hybrid run's legend has one entry per column, not one per line;
    '' when there is no series."""
    names = list(dict.fromkeys(name for frame in frames_ for name in series_of(frame)))
    columns = list(dict.fromkeys(column_of(name) for name in names))
    predicted = {column_of(name) for name in names if name.endswith(" " + frames.PREDICTED)}
    entries = []
    for column in columns:
        color = colors.get(column, NO_COLOR)
        hollow = (f'<i class="kv-sw-pred" style="--c:{colors.get(column + " " + frames.PREDICTED, NO_COLOR)}"></i>'
                  if column in predicted else "")
        entries.append(f'<span class="kv-leg"><i class="kv-sw" style="--c:{color}"></i>{hollow}'
                       f'{html_text(column)}</span>')
    if predicted:
        entries.append('<span class="kv-leg kv-leg-key"><i class="kv-sw-pred" style="--c:#999999"></i>'
                       "lighter: the dense prediction</span>")
    return f'<div class="kv-legend">{"".join(entries)}</div>' if entries else ""


class LivePlots:
    """The Compare tab's plots and their PNG export (see the module docstring)."""

    def build(self) -> "LivePlots":
        with gr.Column(visible=False, elem_id="kv-plots") as self.box:
            self.legend = gr.HTML("", elem_id="kv-plot-legend")
            with gr.Row(equal_height=True):
                self.cache = line_plot(frames.CACHE, "kv-plot-cache", elem_classes=[SHARED_LEGEND])
                self.latency = line_plot(frames.LATENCY, "kv-plot-latency", elem_classes=[SHARED_LEGEND])
                self.memory = line_plot(frames.MEMORY, "kv-plot-memory", color_map=frames.MEMORY_COLORS)
            self.by_type = line_plot(frames.BY_LAYER_TYPE, "kv-plot-by-type", visible=False,
                                     elem_classes=[SHARED_LEGEND])
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
                self.memory: None, self.by_type: gr.update(value=None, visible=False), self.notes: "",
                self.png: gr.update(value=None, visible=False)}

    def updates(self, view) -> dict:
        """Every plot redrawn from `view` (a `kvlab.ui.compare.view.RunView`), each series in its colour; each
        plot's colour domain is the series it was last sent (`plot_update`), kept on `view.plot_series`."""
        colors = frames.compare_colors(view)
        cache, latency, by_type = frames.cache_frame(view), frames.latency_frame(view), frames.layer_type_frame(view)
        memory = frames.memory_frame(view.memory)
        sent = view.plot_series
        view.plot_series = {"cache": series_of(cache), "latency": series_of(latency), "memory": series_of(memory),
                            "by_type": series_of(by_type)}
        top = frames.latency_limit(latency)
        memory_caption = frames.MEMORY.caption
        if memory.empty and view.done is not None:
            memory_caption = NOT_RECORDED
        return {
            self.box: gr.update(visible=True),
            self.legend: legend_html([cache, latency, by_type], colors),
            self.cache: plot_update(cache, colors, sent.get("cache") or None),
            self.latency: plot_update(latency, colors, sent.get("latency") or None,
                                      y_lim=[0, top] if top is not None else None),
            self.memory: plot_update(memory, frames.MEMORY_COLORS, sent.get("memory") or None,
                                     caption=memory_caption),
            self.by_type: plot_update(by_type, colors, sent.get("by_type") or None, visible=not by_type.empty),
            self.notes: md_text(" · ".join(filter(None, [frames.switch_notes(view), frames.overlap_note(cache),
                                                         frames.clipped_note(latency, top),
                                                         NOT_RECORDED if memory_caption == NOT_RECORDED else ""]))),
        }

    def settle(self, view) -> dict:
        """The plots once more after the last `updates`: their colour domains become the series they show."""
        return {plot: update for plot, update in self.updates(view).items()
                if plot in (self.cache, self.latency, self.memory, self.by_type)}

    def export(self, view) -> dict:
        """The "Export PNG" click: the matplotlib figure of `view` as a PNG file (None: nothing to draw yet)."""
        if view is None:
            return {self.png: gr.update(value=None, visible=False),
                    self.notes: "nothing to export yet: run (or replay) first"}
        return {self.png: gr.update(value=write_png(view), visible=True)}


def write_png(view) -> str:
    """The path of a fresh PNG of `view`'s matplotlib figure in a fresh export folder."""
    folder = fresh_export_folder("png-")
    path = folder / "kvlab-plots.png"
    path.write_bytes(figure_png(render_figure(view)))
    return str(path)
