"""The data behind the native plots (`gr.LinePlot`): pandas DataFrames in long form, one row per point.

Every frame has the x column, the y column, `series` (the legend entry: one per column, in the column's
colour; a prediction is its own series, `… predicted`, in a lighter shade of the same colour) and `value`
(the point's value with its unit, e.g. `3.87 MiB`, shown in the tooltip). `PlotSpec` says which columns a
plot reads and how its axes are titled (units included), so the tab builds its `gr.LinePlot`s from it.

- Compare: `cache_frame`, `latency_frame`, `memory_frame`, `layer_type_frame` (hybrid models) from a
  `kvlab.ui.compare.view.RunView`; `compare_colors` maps every series to its colour.
- Chat: `turns_ttft_frame`, `turns_tokens_frame` from `kvlab.chat.session.TurnStats`s.
- Perplexity: `perplexity_frames` from the view's per-cache NLL and cache bytes.

Pure: pandas only, no gradio; a series longer than MAX_POINTS is thinned evenly (its last point kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvlab.quality.perplexity import moving_log_ppl

from .theme import COLORS, PERPLEXITY_COLORS

MIB = 1024 * 1024
MAX_POINTS = 600
"""Points sent per series at most (a long series is thinned evenly; the browser draws every point sent)."""
PREDICTED = "predicted"
MEMORY_COLORS = {"process RSS": "#444444", "CUDA allocated": "#d62728"}
TURN_COLORS = {"with reuse": "#1f77b4", "without reuse": "#ff7f0e", "reused": "#2ca02c", "prefilled": "#9467bd"}
LAYER_TYPE_SHORT = {"full_attention": "full", "sliding_attention": "sliding"}


@dataclass(frozen=True)
class PlotSpec:
    """One native plot: the frame's x and y columns, the axis titles (with units), a title short enough for a
    third of a 1400 px page, and the caption under the plot ('' for none)."""

    x: str
    y: str
    x_title: str
    y_title: str
    title: str
    caption: str = ""


CACHE = PlotSpec("token", "MiB", "generated tokens", "KV cache tensors (MiB)", "KV cache",
                 "measured, over the dense prediction (lighter, '… predicted')")
LATENCY = PlotSpec("token", "ms", "generated tokens", "compute per token (ms)", "per-token latency",
                   "the first token includes prefill")
MEMORY = PlotSpec("time_s", "MiB", "time since run start (s)", "process memory (MiB)", "process memory",
                  "the whole process, not just caches")
BY_LAYER_TYPE = PlotSpec("token", "MiB", "generated tokens", "KV cache tensors (MiB)", "KV cache by layer type",
                         "a line per layer type (full, sliding) in its column's colour, over the prediction "
                         "(lighter); hover names it")
LATENCY_CLIP_QUANTILE = 0.95
LATENCY_CLIP_FACTOR = 1.5
"""The latency axis stops at LATENCY_CLIP_FACTOR × the LATENCY_CLIP_QUANTILE quantile of the decode steps
(rounded up to 1, 2 or 5 × 10ⁿ ms) when a few steps (a prefill, a stall) lie far above it, so one spike does not
flatten every other line; the cut points are named under the plots."""
LATENCY_SPIKE_FACTOR = 3.0
"""The axis is cut only when its highest point is more than this many times that top (a spike, not a trend)."""
LATENCY_OUTLIER_FACTOR = 5.0
"""A column whose median decode step is more than this many times the columns' median (no_cache, which
recomputes the whole sequence every token) does not set the latency axis: it would flatten every other line.
Its points above the axis are named under the plots, as a spike's are."""
TURN_TTFT = PlotSpec("turn", "seconds", "turn", "time to first token (s)", "TTFT per turn, with and without reuse")
TURN_TOKENS = PlotSpec("turn", "tokens", "turn", "input tokens", "input tokens per turn: reused vs prefilled")
PPL = PlotSpec("position", "nats", "position (tokens)", "log-perplexity over the window (nats)",
               "running log-perplexity")
PPL_BYTES = PlotSpec("position", "MiB", "position (tokens)", "cache tensor bytes (MiB)", "cache bytes")


def lighter(color: str, amount: float = 0.55) -> str:
    """`color` (#rrggbb) mixed with white by `amount` (0: unchanged, 1: white)."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def series_name(slot: int, title: str, predicted: bool = False) -> str:
    """`2: static` (the page's column number, 1-based), `2: static predicted` for its prediction."""
    return f"{slot + 1}: {title}" + (f" {PREDICTED}" if predicted else "")


def _thin(points: list[tuple]) -> list[tuple]:
    """At most MAX_POINTS of `points`, evenly spaced, the last one always kept."""
    if len(points) <= MAX_POINTS:
        return points
    stride = -(-len(points) // MAX_POINTS)
    kept = points[::stride]
    return kept if kept[-1] is points[-1] else kept + [points[-1]]


def _frame(spec: PlotSpec, rows: list[tuple], unit: str, digits: int = 2) -> pd.DataFrame:
    """A long frame from (x, y, series) rows, y rounded to 4 decimals; `value` is y with `unit`."""
    frame = pd.DataFrame(rows, columns=[spec.x, spec.y, "series"])
    frame[spec.y] = frame[spec.y].round(4)
    frame["value"] = [f"{y:,.{digits}f} {unit}" for y in frame[spec.y]]
    return frame


def _steps(series: list[float], scale: float, name: str) -> list[tuple]:
    return _thin([(step, value / scale, name) for step, value in enumerate(series, 1)])


def cache_frame(view) -> pd.DataFrame:
    """Cache tensor MiB per generated token: each column measured, and its dense prediction (when known). The
    predictions come first, so vega draws each measured line over its prediction."""
    predicted, measured = [], []
    for column, slot in zip(view.columns, view.slots):
        measured += _steps(column.cache_bytes, MIB, series_name(slot, column.title))
        if any(column.predicted_cache_bytes):
            predicted += _steps(column.predicted_cache_bytes, MIB, series_name(slot, column.title, True))
    return _frame(CACHE, predicted + measured, "MiB")


def latency_frame(view) -> pd.DataFrame:
    """Milliseconds of compute per generated token (the first includes prefill), per column."""
    rows = []
    for column, slot in zip(view.columns, view.slots):
        rows += _steps(column.per_token_s, 1e-3, series_name(slot, column.title))
    return _frame(LATENCY, rows, "ms", 1)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10ⁿ at or above `value` (> 0)."""
    scale = 10 ** math.floor(math.log10(value))
    return next(step * scale for step in (1, 2, 5, 10) if step * scale >= value)


def latency_limit(frame: pd.DataFrame) -> float | None:
    """The top of the latency axis (ms) when a few points (a prefill, a stall) or a whole far slower column lie
    far above the rest (see LATENCY_CLIP_FACTOR, LATENCY_SPIKE_FACTOR and LATENCY_OUTLIER_FACTOR), else None
    (the axis fits every point)."""
    if frame is None or frame.empty:
        return None
    decode = frame.loc[frame[LATENCY.x] > 1].dropna(subset=[LATENCY.y])
    medians = decode.groupby("series", sort=False)[LATENCY.y].median()
    slow = set(medians[medians > LATENCY_OUTLIER_FACTOR * float(medians.median())].index) if len(medians) > 2 else set()
    kept = decode.loc[~decode["series"].isin(slow), LATENCY.y]
    if len(kept) < 4:
        return None
    top = nice_ceiling(max(LATENCY_CLIP_FACTOR * float(kept.quantile(LATENCY_CLIP_QUANTILE)), 1e-3))
    return top if float(frame[LATENCY.y].max()) > LATENCY_SPIKE_FACTOR * top else None


def overlap_note(frame: pd.DataFrame) -> str:
    """`columns 3, 4 and 5 hold the same bytes at every token: one line shows them all` for each group of
    measured series of a cache frame that coincide point for point (eviction methods at one ratio keep the same
    number of positions, so their lines lie on top of each other); '' when none do."""
    if frame is None or frame.empty:
        return ""
    groups: dict[tuple, list[str]] = {}
    for name, part in frame.groupby("series", sort=False):
        if not str(name).endswith(" " + PREDICTED):
            groups.setdefault(tuple(zip(part[CACHE.x], part[CACHE.y])), []).append(str(name).split(":")[0])
    notes = [f"columns {', '.join(names[:-1])} and {names[-1]} hold the same bytes at every token: one line shows "
             "them all" for names in groups.values() if len(names) > 1]
    return "; ".join(notes)


def clipped_note(frame: pd.DataFrame, top: float | None) -> str:
    """`latency axis cut at 200 ms: 3 points above it (1: no_cache, …)`; '' when `top` is None."""
    if top is None:
        return ""
    above = frame[frame[LATENCY.y] > top]
    series = ", ".join(dict.fromkeys(above["series"]))
    return (f"latency axis cut at {top:g} ms: {len(above)} point{'s' if len(above) > 1 else ''} above it "
            f"({series}; up to {above[LATENCY.y].max():,.0f} ms; the JSON has every value)")


def memory_frame(memory) -> pd.DataFrame:
    """Process RSS (and CUDA allocated, when any) in MiB against seconds since the run started."""
    rows = _thin([(t, b / MIB, "process RSS") for t, b in zip(memory.elapsed_s, memory.rss_bytes)])
    if any(memory.cuda_allocated_bytes):
        rows += _thin([(t, b / MIB, "CUDA allocated") for t, b in zip(memory.elapsed_s, memory.cuda_allocated_bytes)])
    return _frame(MEMORY, rows, "MiB")


def layer_type_frame(view) -> pd.DataFrame:
    """Cache MiB per layer type and column, measured and predicted (empty unless a column measured several
    layer types: a hybrid model); predictions first, so each measured line is drawn over its prediction."""
    rows, measured = [], []
    for column, slot in zip(view.columns, view.slots):
        if len(column.cache_bytes_by_layer_type) < 2:
            continue
        for kind, values in sorted(column.cache_bytes_by_layer_type.items()):
            name = f"{column.title} · {LAYER_TYPE_SHORT.get(kind, kind)}"
            measured += _steps(values, MIB, series_name(slot, name))
            predicted = column.predicted_cache_bytes_by_layer_type.get(kind, [])
            if any(predicted):
                rows += _steps(predicted, MIB, series_name(slot, name, True))
    return _frame(BY_LAYER_TYPE, rows + measured, "MiB")


def compare_colors(view) -> dict[str, str]:
    """Series name -> colour for every series the Compare frames can hold: a column's slot colour, its
    predictions lighter, memory in grey/red."""
    colors = dict(MEMORY_COLORS)
    for column, slot in zip(view.columns, view.slots):
        color = COLORS[slot % len(COLORS)]
        names = [column.title] + [f"{column.title} · {LAYER_TYPE_SHORT.get(k, k)}"
                                  for k in column.cache_bytes_by_layer_type]
        for name in names:
            colors[series_name(slot, name)] = color
            colors[series_name(slot, name, True)] = lighter(color)
    return colors


def switch_notes(view) -> str:
    """One line per fallback switch of a budgeted column (`column 2 switched to … at token 40`), for the
    caption under the cache plot; '' when none."""
    return "; ".join(f"column {slot + 1} switched to {switch['to']} at token {switch['at_token']}"
                     for column, slot in zip(view.columns, view.slots) for switch in column.switches)


TURN_TTFT_SERIES = ["with reuse", "without reuse"]
TURN_TOKENS_SERIES = ["reused", "prefilled"]
"""Every series a per-turn plot can show, known before the first turn (`compare_plots.roster_update`)."""


def turn_labels(turns) -> list[str]:
    """The turn numbers as the per-turn plots' x categories (`"1"`, `"2"`, …): whole turns, never `1.5`."""
    return [str(t.turn) for t in turns]


def turns_ttft_frame(turns) -> pd.DataFrame:
    """Per turn (x: the turn number as a category, `turn_labels`): TTFT with reuse and, when measured, without
    reuse (seconds)."""
    rows = [(str(t.turn), t.ttft_s, "with reuse") for t in turns]
    rows += [(str(t.turn), t.no_reuse_ttft_s, "without reuse") for t in turns if t.no_reuse_ttft_s is not None]
    return _frame(TURN_TTFT, rows, "s", 3)


def turns_tokens_frame(turns) -> pd.DataFrame:
    """Per turn (x as in `turns_ttft_frame`): input tokens taken from the kept cache (`reused`) and prefilled."""
    rows = [(str(t.turn), t.reused_tokens, "reused") for t in turns]
    rows += [(str(t.turn), t.prefilled_tokens, "prefilled") for t in turns]
    return _frame(TURN_TOKENS, rows, "tokens", 0)


def perplexity_colors(labels) -> dict[str, str]:
    """Cache label -> colour, in order (dense blue, window red, sink green, …)."""
    return {label: PERPLEXITY_COLORS[i % len(PERPLEXITY_COLORS)] for i, label in enumerate(labels)}


def perplexity_frames(nll: dict[str, list[float]], cache_bytes: dict[str, list[int]],
                      window: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(running log-PPL in nats over the last `window` tokens, cache MiB) against position, per cache label.

    Args:
        nll: cache label -> per-token NLL (nats), in position order.
        cache_bytes: cache label -> bytes the cache held at each of those positions.
    """
    ppl_rows, byte_rows = [], []
    for name, values in nll.items():
        ppl_rows += _thin([(p, v, name) for p, v in enumerate(moving_log_ppl(values, window), 1)])
        byte_rows += _steps(cache_bytes.get(name, []), MIB, name)
    return _frame(PPL, ppl_rows, "nats", 3), _frame(PPL_BYTES, byte_rows, "MiB")
