"""The native plots' data (kvlab.ui.shared.plot_frames): long DataFrames with one series per column in its colour,
the prediction as its own lighter series, the value with its unit for the tooltip, thinning of long series."""

import gradio as gr
import pandas as pd
import pytest

from kvlab.compare.events import ColumnStarted, FallbackSwitched, MemorySample, StepMetrics, TokenEvent
from kvlab.ui.shared import plot_frames as frames
from kvlab.ui.compare.view import RunView
from kvlab.ui.shared.theme import COLORS

MIB = frames.MIB


def two_columns() -> RunView:
    view = RunView(["dynamic", "static"], slots=[0, 3])
    for column in (0, 1):
        view.apply(ColumnStarted(column, view.columns[column].title, 5))
        for step in range(3):
            view.apply(TokenEvent(column, step, 100 + step, " x"))
            view.apply(StepMetrics(column, step, 0.02 * (step + 1), MIB * (step + 1), MIB * (step + 2), 5 + step))
    view.apply(MemorySample(0.0, 100 * MIB, 0, 0))
    view.apply(MemorySample(0.5, 110 * MIB, 0, 0))
    return view


def test_cache_frame_has_a_measured_and_a_predicted_series_per_column():
    frame = frames.cache_frame(two_columns())
    assert list(frame.columns) == ["token", "MiB", "series", "value"]
    # predictions first: vega draws each measured line over its lighter prediction, not under it
    assert list(frame["series"].unique()) == ["1: dynamic predicted", "4: static predicted", "1: dynamic", "4: static"]
    dynamic = frame[frame["series"] == "1: dynamic"]
    assert list(dynamic["token"]) == [1, 2, 3] and list(dynamic["MiB"]) == [1.0, 2.0, 3.0]
    assert list(dynamic["value"]) == ["1.00 MiB", "2.00 MiB", "3.00 MiB"]
    assert list(frame[frame["series"] == "4: static predicted"]["MiB"]) == [2.0, 3.0, 4.0]


def test_latency_and_memory_frames_carry_their_units():
    view = two_columns()
    latency = frames.latency_frame(view)
    assert list(latency[latency["series"] == "4: static"]["ms"]) == pytest.approx([20.0, 40.0, 60.0])
    assert latency["value"].iloc[0] == "20.0 ms"
    memory = frames.memory_frame(view.memory)
    assert list(memory["series"]) == ["process RSS"] * 2 and list(memory["time_s"]) == [0.0, 0.5]
    assert list(memory["value"]) == ["100.00 MiB", "110.00 MiB"]
    view.apply(MemorySample(1.0, 120 * MIB, 5 * MIB, 5 * MIB))
    assert "CUDA allocated" in set(frames.memory_frame(view.memory)["series"])


def test_colours_follow_the_column_slot_and_a_prediction_is_lighter():
    colors = frames.compare_colors(two_columns())
    assert colors["1: dynamic"] == COLORS[0] and colors["4: static"] == COLORS[3]
    assert colors["4: static predicted"] == frames.lighter(COLORS[3]) != COLORS[3]
    assert frames.lighter("#000000", 0.5) == "#808080" and frames.lighter("#1f77b4", 0) == "#1f77b4"
    assert colors["process RSS"] == frames.MEMORY_COLORS["process RSS"]


def test_by_layer_type_frame_only_on_a_hybrid_model():
    assert frames.layer_type_frame(two_columns()).empty
    view = RunView(["dynamic"])
    view.apply(ColumnStarted(0, "dynamic", 5))
    for step in range(2):
        by_type = {"full_attention": MIB * (step + 1), "sliding_attention": MIB}
        view.apply(StepMetrics(0, step, 0.01, sum(by_type.values()), sum(by_type.values()), 5 + step, by_type, by_type))
    frame = frames.layer_type_frame(view)
    assert set(frame["series"]) == {"1: dynamic · full", "1: dynamic · full predicted", "1: dynamic · sliding",
                                    "1: dynamic · sliding predicted"}
    assert set(frame["series"]) <= set(frames.compare_colors(view))


def test_a_fallback_switch_is_named_under_the_plot():
    view = two_columns()
    assert frames.switch_notes(view) == ""
    view.apply(FallbackSwitched(1, {"at_token": 2, "to": "quantized hqq int4", "reason": "over budget"}))
    assert frames.switch_notes(view) == "column 4 switched to quantized hqq int4 at token 2"


def test_a_long_series_is_thinned_but_keeps_its_last_point():
    points = [(i, float(i), "s") for i in range(1, 2001)]
    thinned = frames._thin(points)
    assert len(thinned) <= frames.MAX_POINTS + 1 and thinned[0] == points[0] and thinned[-1] == points[-1]
    assert frames._thin(points[:10]) == points[:10]


def test_empty_views_give_empty_frames_with_their_columns():
    view = RunView(["dynamic"])
    assert frames.cache_frame(view).empty and list(frames.cache_frame(view).columns) == ["token", "MiB", "series",
                                                                                         "value"]
    assert frames.latency_frame(view).empty and frames.memory_frame(view.memory).empty


def test_one_wrapping_legend_names_every_column_in_full_in_its_colour():
    from kvlab.ui.shared import live_plots as compare_plots

    titles = [f"quantized (quanto, nbits=4, q_group_size={32 * (i + 1)})" for i in range(8)]
    view = RunView(titles, slots=list(range(8)))
    for column in range(8):
        view.apply(ColumnStarted(column, view.columns[column].title, 5))
        view.apply(StepMetrics(column, 0, 0.02, MIB, MIB, 5))
    frame = frames.cache_frame(view)
    assert frame["series"].nunique() == 16  # measured and predicted per column
    colors = frames.compare_colors(view)
    legend = compare_plots.legend_html([frame, frames.latency_frame(view)], colors)
    assert legend.count('class="kv-leg"') == 8  # one entry per column: its line and its prediction
    assert legend.count("kv-leg kv-leg-key") == 1 and "lighter: the dense prediction" in legend
    assert "8: quantized (quanto, nbits=4, q_group_size=256)</span>" in legend and " predicted" not in legend
    assert f'class="kv-sw" style="--c:{COLORS[7]}"' in legend
    assert f'class="kv-sw-pred" style="--c:{frames.lighter(COLORS[7])}"' in legend
    assert legend.index("1: quantized") < legend.index("2: quantized")
    assert compare_plots.legend_html([frames.cache_frame(RunView(["dynamic"]))], colors) == ""
    odd = pd.DataFrame({"series": ["1: a<b>"]})
    assert "1: a&lt;b&gt;" in compare_plots.legend_html([odd], {}) and "#888888" in compare_plots.legend_html([odd], {})
    plot = compare_plots.line_plot(frames.CACHE, "kv-test", elem_classes=[compare_plots.SHARED_LEGEND])
    assert compare_plots.SHARED_LEGEND in plot.elem_classes
    from kvlab.ui.shared.theme import CSS
    assert f".{compare_plots.SHARED_LEGEND} .role-legend {{ display: none; }}" in CSS  # vega's own row is hidden
    assert plot.tooltip == ["series", "value"]  # a legend-shortened name reads in full on hover


def test_a_plot_update_never_sends_an_empty_frame_and_its_colours_name_only_the_series_sent():
    """gradio's LinePlot builds its spec from the value it held when a prop changed: an empty first frame
    gave nominal axes and a later series no colour for the rest of the run (seen in the browser)."""
    from kvlab.ui.shared import live_plots as compare_plots

    colors = {"1: dynamic": "#111111", "2: static": "#222222", "3: sink": "#333333"}
    empty = frames.cache_frame(RunView(["dynamic"]))
    assert compare_plots.plot_update(empty, colors) == {"__type__": "update", "value": None, "color_map": {}}
    view = two_columns()
    frame = frames.latency_frame(view)
    update = compare_plots.plot_update(frame, {**colors, "1: dynamic": "#aa0000"})
    assert update["value"] is frame and list(update["color_map"]) == compare_plots.series_of(frame)
    assert update["color_map"]["1: dynamic"] == "#aa0000"
    lagging = compare_plots.plot_update(frame, colors, domain=["1: dynamic"])  # the series sent last time
    assert lagging["color_map"] == {"1: dynamic": "#111111"}
    assert compare_plots.series_of(None) == [] and compare_plots.series_of(empty) == []


def test_live_plot_updates_rebuild_one_update_after_a_series_appears_and_settle_names_every_series():
    from kvlab.ui.shared import live_plots as compare_plots

    with gr.Blocks():
        plots = compare_plots.LivePlots().build()
    view = RunView(["dynamic", "static"], slots=[0, 1])
    view.apply(ColumnStarted(0, view.columns[0].title, 5))
    view.apply(StepMetrics(0, 0, 0.02, MIB, MIB, 5))
    first = plots.updates(view)
    assert list(first[plots.latency]["color_map"]) == ["1: dynamic"]
    view.apply(ColumnStarted(1, view.columns[1].title, 5))
    view.apply(StepMetrics(1, 0, 0.02, MIB, MIB, 5))
    second = plots.updates(view)
    assert list(second[plots.latency]["color_map"]) == ["1: dynamic"]  # the domain of the frame sent before
    assert set(second[plots.latency]["value"]["series"]) == {"1: dynamic", "2: static"}
    settled = plots.settle(view)
    assert list(settled[plots.latency]["color_map"]) == ["1: dynamic", "2: static"]
    assert plots.legend not in settled and plots.cache in settled


def test_a_hybrid_run_s_legend_has_one_entry_per_column_not_one_per_line():
    from kvlab.ui.shared import live_plots as compare_plots

    names = [f"{i + 1}: col{i}" + suffix for i in range(8)
             for suffix in ("", " predicted", " · full", " · sliding", " · full predicted", " · sliding predicted")]
    legend = compare_plots.legend_html([pd.DataFrame({"series": names})], {})
    assert len(names) == 48 and legend.count('class="kv-leg"') == 8


def test_columns_that_hold_the_same_bytes_are_named_as_one_line():
    view = RunView(["dynamic", "snapkv 0.5", "tova 0.5", "knorm 0.5"], slots=[0, 1, 2, 3])
    for column, per_token in enumerate((2.0, 1.0, 1.0, 1.0)):
        view.apply(ColumnStarted(column, view.columns[column].title, 5))
        for step in range(4):
            view.apply(StepMetrics(column, step, 0.02, int(per_token * MIB * (step + 1)), int(2 * MIB * (step + 1)), 5))
    note = frames.overlap_note(frames.cache_frame(view))
    assert note == "columns 2, 3 and 4 hold the same bytes at every token: one line shows them all"
    assert frames.overlap_note(frames.cache_frame(two_columns())).startswith("columns 1 and 4 hold")  # dynamic, static
    view.columns[3].cache_bytes[-1] += MIB  # a MiB apart at one token: two lines
    assert frames.overlap_note(frames.cache_frame(view)) == ("columns 2 and 3 hold the same bytes at every token: one "
                                                             "line shows them all")


def test_a_far_slower_column_does_not_set_the_latency_axis_and_is_named():
    titles = ["no_cache", "dynamic", "static", "quanto", "sink", "snapkv"]
    view = RunView(titles, slots=list(range(6)))
    for column, title in enumerate(titles):
        steps = [0.3 + 0.4 * i for i in range(30)] if title == "no_cache" else [0.02 + 0.001 * (i % 3) for i in range(30)]
        view.columns[column].per_token_s = steps
    latency = frames.latency_frame(view)
    top = frames.latency_limit(latency)
    assert top is not None and top <= 50  # the five fast columns fill the plot
    assert "1: no_cache" in frames.clipped_note(latency, top) and "2: dynamic" not in frames.clipped_note(latency, top)


def test_one_latency_spike_does_not_flatten_the_axis_and_is_named():
    view = two_columns()
    view.columns[0].per_token_s = [0.5] + [0.020] * 30 + [12.0]  # a prefill and a 12 s stall among 20 ms steps
    latency = frames.latency_frame(view)
    top = frames.latency_limit(latency)
    assert top == 100  # 1.5 × the decode steps' 95th percentile (60 ms), rounded up to 1, 2 or 5 × 10ⁿ
    note = frames.clipped_note(latency, top)
    assert note.startswith("latency axis cut at 100 ms: 2 points above it (1: dynamic; up to 12,000 ms")
    view.columns[0].per_token_s = [0.020] * 31
    assert frames.latency_limit(frames.latency_frame(view)) is None and frames.clipped_note(latency, None) == ""
