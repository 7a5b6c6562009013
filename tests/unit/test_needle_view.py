"""The Needle tab's view model, its column parsing with sweeps, the tab's stream on the tiny model, presets."""

from html import unescape
from pathlib import Path

import gradio as gr
import pytest

from kvlab.needle.grid import expand_sweeps, parse_grid
from kvlab.needle.preset import list_needle_presets, load_needle_preset
from kvlab.needle.runner import run_needle
from kvlab.compare.preset import PresetError, list_presets
from kvlab.ui.needle.tab import NeedleTab, column_specs
from kvlab.ui.needle.view import GATED, HEATMAP_FIELDS, MIB as MIB_BYTES, MISS, OUTCOME_COLORS, NeedleView, pareto_front


def test_sweeps_expand_into_columns_and_bad_items_stay_in_their_place():
    assert expand_sweeps(["sink:window_length=64|128:num_sink_tokens=0|4", "dynamic"]) == [
        "sink:window_length=64:num_sink_tokens=0", "sink:window_length=64:num_sink_tokens=4",
        "sink:window_length=128:num_sink_tokens=0", "sink:window_length=128:num_sink_tokens=4", "dynamic"]
    columns = column_specs("dynamic, sink:window_length=64|128, nope")
    assert [c.describe() for c in columns[:3]] == ["dynamic", "sink 4+60", "sink 4+124"]
    assert columns[3].strategy is None and "unknown strategy" in columns[3].rejected
    with pytest.raises(ValueError, match="at most 8 columns"):
        column_specs("sink:window_length=16|32|48|64|80|96|112|128|144")


def test_pareto_front_keeps_points_no_other_beats():
    assert pareto_front([(10, 1.0), (5, 1.0), (5, 0.5), (1, 0.2)]) == [False, True, False, True]


def test_view_fills_heatmaps_with_one_outcome_scale_and_puts_every_column_on_the_pareto_plot(tiny):
    view = NeedleView()
    grid = parse_grid("120", "0,1", "0", 2)
    for event in run_needle(tiny, [{"strategy": "dynamic"}, {"strategy": "sink", "window_length": 64}], grid):
        view.apply(event)
    frame = view.heatmap_frame(1)
    assert list(frame.columns) == list(HEATMAP_FIELDS) and set(frame["outcome"]) == set(OUTCOME_COLORS)
    drawn = frame.dropna(subset=["depth"])
    assert len(drawn) == 2 and len(frame) == 2 + len(OUTCOME_COLORS) - len(set(drawn["outcome"]))
    frame = drawn
    dense = {r.cell: r.hit for r in view.records if r.column == 0}
    assert all(o == (GATED if not dense[(120, d, 0)] else o) for d, o in zip(frame["depth"], frame["outcome"]))
    assert set(frame["outcome"]) <= {GATED, MISS, "hit"}
    pareto = view.pareto_frame().dropna(subset=["hit_rate"])
    assert list(pareto["column"]) == [c for c, row in zip(view.columns, view.summary()) if row["scored"]]
    assert "4 of 4 cells done" in view.status_text() and "finished in" in view.status_text()


def test_tab_streams_live_updates_and_reports_bad_input_in_its_status(tiny_pool):
    with gr.Blocks():
        tab = NeedleTab(tiny_pool).build()
    bad = list(tab.stream({}, "bundled", "", "120", "0", "0", 2))
    assert "name at least one column" in bad[-1][tab.status]
    bad = list(tab.stream({}, "bundled", "dynamic", "120", "7", "0", 2))
    assert "the grid is empty" in bad[-1][tab.status]
    updates = list(tab.stream({}, "bundled", "dynamic, sink:window_length=64|128", "120", "0, 2", "0", 2))
    assert "depth 2 is outside [0, 1]" in unescape(updates[-1][tab.status])
    frames = [u[tab.heatmaps[0]]["value"] for u in updates[1:] if u[tab.heatmaps[0]].get("value") is not None]
    filled = [len(frame.dropna(subset=["depth"])) for frame in frames]
    assert filled[0] == 0 and filled[-1] == 1 and len(updates) >= 5
    assert all(set(frame["outcome"]) == set(OUTCOME_COLORS) for frame in frames)  # every colour from the primer on
    maps = [u[tab.heatmaps[0]]["color_map"] for u in updates[1:] if "color_map" in u[tab.heatmaps[0]]]
    upper, lower = ({k: case(v) for k, v in OUTCOME_COLORS.items()} for case in (str.upper, str.lower))
    assert maps[0] == lower and maps[-2] == upper and maps[-1] == lower  # the last frame rebuilds the spec
    assert len({str(m) for m in maps}) == 2
    first_upper = maps.index(upper)
    assert filled[first_upper] == 0 and filled[first_upper + 1] == 1  # the spec settles before the first point
    assert updates[-1][tab.heatmaps[3]]["visible"] is False
    assert [Path(p).suffix for p in updates[-2][tab.download]] == [".json", ".csv"]


def test_a_column_that_never_ran_has_no_heatmap_and_its_reason_wraps_in_the_table(tiny_pool):
    with gr.Blocks():
        tab = NeedleTab(tiny_pool).build()
    assert tab.table.wrap is True
    updates = list(tab.stream({}, "bundled", "dynamic, nope, sink:window_length=0", "120", "0", "0", 2))
    last = updates[-1]
    assert last[tab.heatmaps[0]]["visible"] is True
    assert last[tab.heatmaps[1]]["visible"] is False and last[tab.heatmaps[2]]["visible"] is False
    notes = list(last[tab.table]["note"])
    assert notes[0] == "" and "unknown strategy" in notes[1] and notes[2]
    assert set(last[tab.pareto]["value"]["column"]) == {"dynamic"}


def test_redraw_puts_every_scored_column_on_the_pareto_plot_in_its_colour(tiny_pool):
    from kvlab.needle.record import CellRecord
    from kvlab.needle.runner import NeedleCell, NeedlePlan
    from kvlab.protocol import RunStarted

    with gr.Blocks():
        tab = NeedleTab(tiny_pool).build()
    view = NeedleView()
    view.apply(RunStarted(("dynamic", "sink 4+60"), NeedlePlan([(100, 0.0, 0), (100, 1.0, 0)], [0], [])))
    primer = tab.redraw(view, primer=True)
    assert list(primer[tab.pareto]["value"]["column"]) == view.columns  # every column known before its point
    assert primer[tab.pareto]["value"]["hit_rate"].isna().all()
    assert all(c == c.lower() for c in primer[tab.pareto]["color_map"].values())
    assert set(primer[tab.heatmaps[1]]["value"]["outcome"]) == set(OUTCOME_COLORS)
    for column, depth, hit, size in ((0, 0.0, True, 400), (1, 0.0, False, 100), (0, 1.0, True, 400),
                                     (1, 1.0, True, 100)):
        view.apply(NeedleCell(CellRecord(column, view.columns[column], 100, 100, depth, 0, "12345", 10, "t", [1],
                                         hit=hit, key_logprob=-1.0, cache_bytes=size)))
    pareto = tab.redraw(view)[tab.pareto]
    assert list(pareto["value"]["column"]) == ["dynamic", "sink 4+60"]
    assert list(pareto["value"]["pareto"]) == ["front", "front"] and set(pareto["color_map"]) == set(view.columns)
    assert "4 of 4 cells done" in tab.redraw(view)[tab.status]


def test_needle_presets_validate_and_stay_out_of_compares_list(tmp_path):
    assert "needle_passkey" in list_needle_presets() and "needle_passkey" not in list_presets()
    preset = load_needle_preset("needle_passkey")
    assert preset.grid.lengths[-1] == "2k" and len(preset.grid.depths) >= 5
    strategies = [c["strategy"] for c in preset.columns]
    assert strategies[0] == "dynamic" and {"sink", "quantized"} <= set(strategies)
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: needle\nname: x\ngrid: {lengths: [512], new_tokens: 99}\ncolumns: [{strategy: nope}]\n")
    with pytest.raises(PresetError, match="grid.new_tokens") as err:
        load_needle_preset(bad)
    assert "unknown strategy" in str(err.value)


@pytest.mark.parametrize("name", sorted(list_needle_presets()))
def test_every_needle_preset_runs_on_the_tiny_model(tiny, name):
    preset = load_needle_preset(name)
    grid = parse_grid(preset.grid.lengths[:1], preset.grid.depths, preset.grid.seeds[:1], 2)
    done = list(run_needle(tiny, preset.columns, grid))[-1]
    assert [c["status"] for c in done.record["columns"]] == ["ok"] * len(preset.columns)
    assert len(done.results) == len(grid.cells) * len(preset.columns)


@pytest.mark.parametrize("name", sorted(list_needle_presets()))
def test_a_preset_fills_the_form_with_what_the_preset_runs(name):
    """The preset picker writes the columns in compare syntax; read back by the tab they are the preset's
    strategies, and the grid fields parse to the preset's grid."""
    from kvlab.columns import Column
    from kvlab.ui.needle.tab import column_specs
    from kvlab.ui.needle.view import NO_PRESET, preset_fields

    assert preset_fields(NO_PRESET) is None
    fields = preset_fields(name)
    preset = load_needle_preset(name)
    parsed = [column.strategy for column in column_specs(fields["columns"])]
    assert parsed == [Column.from_spec(spec).strategy for spec in preset.columns]
    grid = parse_grid(fields["lengths"].split(", "), [float(d) for d in fields["depths"].split(", ")],
                      [int(s) for s in fields["seeds"].split(", ")], fields["new_tokens"])
    expected = parse_grid(preset.grid.lengths, preset.grid.depths, preset.grid.seeds, preset.grid.new_tokens)
    assert grid.cells == expected.cells and fields["description"]


def test_the_tab_fills_the_form_from_a_preset_and_says_why_one_cannot_be_read():
    values = NeedleTab(None).apply_preset("needle_eviction")
    assert values[0].startswith("dynamic, snapkv, pyramidkv, tova") and values[1] == "512, 1k"
    assert unescape(values[5]).startswith("preset **needle_eviction**: The scored eviction methods")
    missing = NeedleTab(None).apply_preset("no_such_preset")
    assert missing[5].startswith("⚠") and "no_such_preset" in unescape(missing[5])


def test_columns_that_share_a_point_are_drawn_apart_with_their_true_rate_on_hover():
    view = NeedleView()
    view.columns = ["dynamic", "snapkv 0.5", "tova 0.5", "knorm 0.5"]
    summary = [{"strategy": name, "hit_rate": rate, "mean_cache_bytes": mib * MIB_BYTES}
               for name, rate, mib in (("dynamic", 1.0, 8.0), ("snapkv 0.5", 0.5, 4.0), ("tova 0.5", 0.5, 4.0),
                                       ("knorm 0.5", 0.5, 4.0))]
    view.summary = lambda: summary
    frame = view.pareto_frame()
    shared = frame[frame["column"] != "dynamic"]
    assert list(shared["hit_rate"]) == [0.5, 0.5, 0.5] and shared["shown_rate"].nunique() == 3
    assert shared["shown_rate"].mean() == pytest.approx(0.5)  # spread around the true rate
    assert frame.loc[frame["column"] == "dynamic", "shown_rate"].item() == 1.0  # alone: drawn where it is
    assert frame.loc[frame["column"] == "tova 0.5", "shares_point_with"].item() == "snapkv 0.5, knorm 0.5"
    x_lim, y_lim = view.pareto_limits()
    assert x_lim[1] > 8.0 and y_lim[0] < 0 and y_lim[1] > 1  # dense (8 MiB, rate 1) is inside, not on the edge
