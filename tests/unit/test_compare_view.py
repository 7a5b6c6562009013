"""kvlab.ui.compare.view with fake runner events: column texts, statuses, readouts, phases, the summary
table's best marks; the plots (kvlab.ui.shared.figures), the reproduce-it snippets (kvlab.ui.shared.code) and the
column form helpers (kvlab.ui.shared.knobs). No model, no gradio."""

import dataclasses

import pytest
from matplotlib.figure import Figure

from kvlab.compare.events import (
    ColumnDone,
    ColumnResult,
    ColumnStarted,
    FidelityScored,
    MemorySample,
    StepMetrics,
    SummaryReady,
    TokenEvent,
)
from kvlab.compare.summary import SUMMARY_COLUMNS
from kvlab.protocol import ColumnFailed, RunDone
from kvlab.generation import GenerationSettings
from kvlab.strategies import STRATEGIES, make_strategy
from kvlab.ui.shared.code import code_snippet
from kvlab.ui.compare.view import BEST_MARK, DISPLAY_COLUMNS, HEADERS, MISSING, PENDING, RunView, format_value
from kvlab.ui.shared.figures import MIB, figure_png, render_figure
from kvlab.ui.shared.knobs import NO_STRATEGY, column_spec, knob_defaults, knob_text, max_knobs, parse_knob, plan_columns


def result(index, name, strategy, status="ok", **fields):
    r = ColumnResult(index=index, name=name, strategy=strategy, knobs={}, status=status,
                     use_cache=strategy != "no_cache", **fields)
    r.finish_decode_stats()
    return r


def stream_tokens(view, column, pieces, step_s=0.1, bytes_per_token=1000):
    for step, piece in enumerate(pieces):
        view.apply(TokenEvent(column, step, 100 + step, piece))
        view.apply(StepMetrics(column, step, step_s, bytes_per_token * (10 + step), bytes_per_token * (10 + step),
                               10 + step))


def test_tokens_build_text_status_and_readout():
    view = RunView(["dynamic", "static"])
    assert [c.status for c in view.columns] == ["waiting", "waiting"]
    assert view.apply(ColumnStarted(0, "dynamic", 10)) == {0}
    stream_tokens(view, 0, ["The", " sky", "", " is"], step_s=0.25, bytes_per_token=MIB // 4)
    column = view.columns[0]
    assert column.status == "running"
    assert column.text == "The sky is"
    assert column.tokens == 4
    assert column.tok_s() == pytest.approx(4.0)  # 3 decode tokens in 0.75 s; the first (prefill) is left out
    assert column.readout() == "4 tokens · 4.0 tok/s · cache 3.25 MiB"
    assert view.columns[1].text == "" and view.columns[1].status == "waiting"


def test_one_token_has_no_rate_yet():
    view = RunView(["dynamic"])
    view.apply(ColumnStarted(0, "dynamic", 10))
    stream_tokens(view, 0, ["Hi"])
    assert view.columns[0].tok_s() is None
    assert view.columns[0].readout() == "1 token · cache 0.01 MiB"


def test_done_stopped_error_and_unavailable_statuses():
    view = RunView(["a", "b", "c", "d"])
    for i in range(4):
        view.apply(ColumnStarted(i, f"col{i}", 5))
    stream_tokens(view, 0, ["x", "y"])
    view.apply(ColumnDone(0, result(0, "col0", "dynamic", text="xy final")))
    view.apply(ColumnDone(1, result(1, "col1", "dynamic", stopped=True, message="stopped after 3 tokens")))
    view.apply(ColumnFailed(2, "col2", "error", "static cache too small: raise max_cache_len",
                           result(2, "col2", "static", status="error")))
    view.apply(ColumnFailed(3, "col3", "unavailable", "needs a CUDA GPU",
                            result(3, "col3", "offloaded", status="unavailable")))
    statuses = [(c.status, c.message) for c in view.columns]
    assert statuses == [("done", ""), ("stopped", "stopped after 3 tokens"),
                        ("error", "static cache too small: raise max_cache_len"), ("unavailable", "needs a CUDA GPU")]
    assert view.columns[0].text == "xy final"  # the result's text is authoritative
    assert view.columns[3].readout() == ""
    assert view.columns[3].status_text() == "unavailable: needs a CUDA GPU"
    assert view.columns[0].status_text() == "done"


def test_phases_and_progress_text():
    view = RunView(["dynamic", "static"])
    view.apply(ColumnStarted(0, "dynamic", 5))
    view.apply(ColumnStarted(1, "static", 5))
    stream_tokens(view, 0, ["a", "b"])
    assert view.phase() == "running"
    assert view.progress_text() == "running: 2 of 2 columns generating, 2 tokens so far"
    results = [result(0, "dynamic", "dynamic"), result(1, "static", "static")]
    view.apply(ColumnDone(0, results[0]))
    view.apply(ColumnDone(1, results[1]))
    assert view.phase() == "finishing" and view.summary() == ([], {})
    assert view.apply(SummaryReady(results, 3.25, {}, to_score=2)) == {0, 1}
    assert view.phase() == "scoring"
    assert view.progress_text().startswith("summary ready after 3.2 s (2 tokens); fidelity: 0 of 2 columns scored")
    view.apply(FidelityScored(0, results[0], 1, 2))
    assert "fidelity: 1 of 2 columns scored" in view.progress_text()
    view.stop_requested = True
    assert view.phase() == "stopping"
    fidelity = {"state": "stopped", "scored": 1, "to_score": 2}
    done = RunDone({"fidelity": fidelity, "summary_s": 3.25}, wall_s=12.5, stopped=True, results=results)
    assert view.apply(done) == {0, 1}
    assert view.phase() == "stopped"
    assert view.progress_text() == ("stopped in 12.5 s: 2 tokens (2 done) · summary after 3.2 s · "
                                    "fidelity: 1 of 2 columns scored (stopped)")


def test_the_summary_shows_before_fidelity_and_fills_in_as_columns_are_scored():
    view = RunView(["dynamic", "quantized"])
    results = [result(0, "dynamic", "dynamic", token_ids=[1, 2], agreement=1.0, is_baseline=True),
               result(1, "quantized", "quantized", token_ids=[1, 3], agreement=0.5, first_divergence=1, lossy=True)]
    for i in range(2):
        view.apply(ColumnStarted(i, results[i].name, 5))
        view.apply(ColumnDone(i, results[i]))
    view.apply(SummaryReady(results, 2.0, {}, to_score=2))
    headers, table = view.summary_table()
    cell = {name: headers.index(HEADERS[name]) for name in ("agreement", "top1_agreement", "mean_kl")}
    assert [row[cell["agreement"]] for row in table] == ["100.0%" + BEST_MARK, "50.0%"]  # text: with the summary
    assert {row[cell["top1_agreement"]] for row in table} == {PENDING}
    results[0].top1_agreement, results[0].mean_kl, results[0].fidelity_status = 1.0, 0.0, "scored"
    view.apply(FidelityScored(0, results[0], 1, 2))
    _, table = view.summary_table()
    assert table[0][cell["top1_agreement"]].startswith("100.0%") and table[1][cell["mean_kl"]] == PENDING
    results[1].fidelity_status = "not scored: stopped"
    view.apply(RunDone({"fidelity": {"state": "stopped", "scored": 1, "to_score": 2}, "summary_s": 2.0}, 9.0, True,
                       results))
    _, table = view.summary_table()
    assert len(table) == 2 and table[1][cell["mean_kl"]] == MISSING  # the stop kept the summary
    assert "fidelity not scored: stopped" in view.summary()[0][1]["note"]


def test_fidelity_scores_reach_the_readout():
    view = RunView(["dynamic", "quantized"])
    for i in range(2):
        view.apply(ColumnStarted(i, view.columns[i].title, 5))
        stream_tokens(view, i, ["a", "b"])
    scored = result(1, "quantized", "quantized", top1_agreement=0.75, mean_kl=0.1)
    base = result(0, "dynamic", "dynamic", is_baseline=True)
    view.apply(FidelityScored(1, scored))
    view.apply(FidelityScored(0, base))
    assert view.columns[1].readout().endswith("top-1 75%")
    assert view.columns[0].readout().endswith("baseline")


def test_memory_samples_are_kept_in_order():
    view = RunView(["dynamic"])
    assert view.apply(MemorySample(0.0, 100, 0, 0)) == set()
    view.apply(MemorySample(0.25, 200, 7, 9))
    assert view.memory.elapsed_s == [0.0, 0.25]
    assert view.memory.rss_bytes == [100, 200]
    assert view.memory.cuda_allocated_bytes == [0, 7]


def test_apply_refuses_what_is_not_an_event():
    with pytest.raises(TypeError):
        RunView(["x"]).apply("token")


def finished_view():
    rows = [
        result(0, "no_cache", "no_cache", ttft_s=0.5, per_token_s=[0.5, 0.3, 0.3], cache_bytes=[0, 0, 0],
               agreement=1.0, top1_agreement=1.0, mean_kl=0.0),
        result(1, "dynamic", "dynamic", ttft_s=0.2, per_token_s=[0.2, 0.1, 0.1], cache_bytes=[10, 20, 30],
               predicted_cache_bytes=[10, 20, 30], agreement=1.0, top1_agreement=1.0, mean_kl=0.0,
               is_baseline=True),
        result(2, "quantized quanto int4 r16", "quantized", ttft_s=0.3, per_token_s=[0.3, 0.05, 0.05],
               cache_bytes=[5, 8, 12], predicted_cache_bytes=[10, 20, 30], agreement=0.5, first_divergence=1,
               top1_agreement=0.8, mean_kl=0.05, lossy=True),
        result(3, "offloaded", "offloaded", status="unavailable", message="needs a CUDA GPU"),
    ]
    view = RunView([r.name for r in rows])
    view.apply(RunDone({}, wall_s=3.0, stopped=False, results=rows))
    return view


def test_summary_table_formats_and_marks_the_best():
    headers, table = finished_view().summary_table()
    assert headers == [HEADERS[key] for key, _ in DISPLAY_COLUMNS]
    by_name = {row[0]: dict(zip(headers, row)) for row in table}
    assert by_name["dynamic"]["TTFT (s)"] == "0.200" + BEST_MARK
    assert by_name["quantized quanto int4 r16"]["decode tok/s"] == "20.0" + BEST_MARK
    assert by_name["quantized quanto int4 r16"]["peak cache (MiB)"] == "0.00" + BEST_MARK
    assert by_name["no_cache"]["peak cache (MiB)"] == "0.00"  # holding nothing is not "best cache"
    # no_cache and dynamic tie for the best agreement: both are marked.
    assert by_name["no_cache"]["agreement"] == "100.0%" + BEST_MARK
    assert by_name["dynamic"]["agreement"] == "100.0%" + BEST_MARK
    assert by_name["quantized quanto int4 r16"]["agreement"] == "50.0%"
    assert by_name["quantized quanto int4 r16"]["vs baseline"] == "0.40×"
    assert by_name["offloaded"]["status"] == "unavailable"
    assert by_name["offloaded"]["TTFT (s)"] == MISSING
    assert "needs a CUDA GPU" in by_name["offloaded"]["note"]


def test_a_column_stopped_before_its_first_token_and_a_lone_value_are_never_best():
    rows = [result(0, "dynamic", "dynamic", ttft_s=0.2, per_token_s=[0.2, 0.1], cache_bytes=[10, 20]),
            result(1, "static", "static", message="stopped after 0 tokens")]
    view = RunView(["dynamic", "static"])
    view.apply(RunDone({}, 1.0, True, rows))
    headers, table = view.summary_table()
    by_name = {row[0]: dict(zip(headers, row)) for row in table}
    assert by_name["static"]["peak cache (MiB)"] == MISSING
    assert not any(BEST_MARK in cell for row in table for cell in row)


def test_no_mark_when_every_column_ties():
    rows = [result(i, name, name, ttft_s=0.1, per_token_s=[0.1, 0.1], agreement=1.0) for i, name in
            enumerate(["dynamic", "static"])]
    view = RunView(["dynamic", "static"])
    view.apply(RunDone({}, 1.0, False, rows))
    _, table = view.summary_table()
    assert not any(BEST_MARK in cell for row in table for cell in row)


def test_summary_is_empty_before_the_run_ends():
    view = RunView(["dynamic"])
    assert view.summary() == ([], {})
    assert view.summary_table()[1] == []


def test_display_columns_cover_the_report():
    assert [key for key, _ in DISPLAY_COLUMNS] == SUMMARY_COLUMNS
    assert set(HEADERS) >= set(SUMMARY_COLUMNS)


@pytest.mark.parametrize("value, kind, text", [
    (None, "seconds", MISSING), (0.12345, "seconds", "0.123"), (12.34, "rate", "12.3"), (3 * MIB, "mib", "3.00"),
    (0.5, "ratio", "0.50×"), (0.789, "percent", "78.9%"), (0.012345, "kl", "0.0123"), (7, "int", "7"),
])
def test_format_value(value, kind, text):
    assert format_value(value, kind) == text


def test_render_figure_draws_three_panels():
    view = RunView(["dynamic", "static", "offloaded"], slots=[0, 2, 5])
    for i in range(2):
        view.apply(ColumnStarted(i, view.columns[i].title, 5))
        stream_tokens(view, i, ["a", "b", "c"])
    view.apply(MemorySample(0.0, 100 * MIB, 0, 0))
    view.apply(MemorySample(0.5, 110 * MIB, 0, 0))
    fig = render_figure(view)
    assert isinstance(fig, Figure)
    cache_ax, latency_ax, memory_ax = fig.axes
    assert len(cache_ax.lines) == 4  # measured + dashed prediction for the two columns with tokens
    assert sorted(line.get_linestyle() for line in cache_ax.lines) == ["-", "-", "--", "--"]
    assert len(latency_ax.lines) == 2
    assert [line.get_label() for line in memory_ax.lines] == ["process RSS"]
    assert figure_png(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_hybrid_model_gets_a_panel_of_bytes_by_layer_type_beside_the_prediction():
    view = RunView(["dynamic", "dynamic all-full"])
    for i in range(2):
        view.apply(ColumnStarted(i, view.columns[i].title, 5, keeps="2 sliding layers keep their last 15" if i == 0 else ""))
        for step in range(3):
            sliding = 100 * min(step + 5, 6) + (16 if i == 0 else 0)
            by_type = {"full_attention": 100 * (step + 5), "sliding_attention": sliding}
            predicted = {"full_attention": 100 * (step + 5), "sliding_attention": sliding - (16 if i == 0 else 0)}
            view.apply(StepMetrics(i, step, 0.01, sum(by_type.values()), sum(predicted.values()), 5 + step,
                                   by_type, predicted))
    assert view.columns[0].keeps.startswith("2 sliding layers")
    assert view.columns[0].cache_bytes_by_layer_type["sliding_attention"] == [516, 616, 616]
    fig = render_figure(view)
    cache_ax, by_type_ax, latency_ax, memory_ax = fig.axes
    assert by_type_ax.get_title().startswith("KV cache by layer type")
    assert sorted({line.get_linestyle() for line in by_type_ax.lines}) == ["-", ":"]
    assert len(by_type_ax.lines) == 8  # 2 columns x 2 layer types x (measured + prediction band)
    assert [text.get_text() for text in by_type_ax.get_legend().get_texts()] == [
        "full layers", "sliding layers", "prediction"]
    assert format_value({"full_attention": 3 * MIB, "sliding_attention": MIB // 2}, "by_type") == "full=3.00 sliding=0.50"


def test_render_figure_before_any_token():
    fig = render_figure(RunView(["dynamic"]))
    assert len(fig.axes) == 3
    assert figure_png(fig)[:4] == b"\x89PNG"


def constructible_strategies():
    for name in STRATEGIES:
        try:
            yield make_strategy({"strategy": name})
        except ValueError:
            continue


@pytest.mark.parametrize("strategy", list(constructible_strategies()), ids=lambda s: s.name)
def test_code_snippet_compiles_for_every_strategy(strategy):
    code = code_snippet(strategy, GenerationSettings(max_new_tokens=32), "Why is the sky blue?", "Be brief.")
    compile(code, "<snippet>", "exec")
    assert "model.generate(" in code
    assert "max_new_tokens = 32" in code
    assert strategy.generate_kwargs_code() in code
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in code
    assert '"role": "system"' in code


def test_code_snippet_details():
    static = make_strategy({"strategy": "static", "max_cache_len": 256})
    sampled = GenerationSettings(max_new_tokens=8, do_sample=True, temperature=0.7, top_p=0.9, top_k=20, seed=3,
                                 repetition_penalty=1.2, stop_at_eos=False)
    code = code_snippet(static, sampled, "hello", chat=False, model_source="/models/llama", dtype="bfloat16")
    compile(code, "<snippet>", "exec")
    assert "StaticCache(config=model.config, max_cache_len=256)" in code
    assert "from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache" in code
    assert "model_id = '/models/llama'" in code and "torch.bfloat16" in code
    assert 'inputs = tokenizer("hello", return_tensors="pt")' in code
    for piece in ("torch.manual_seed(3)", "do_sample=True", "temperature=0.7", "top_p=0.9", "top_k=20",
                  "repetition_penalty=1.2", "eos_token_id=None", "cache=cache"):
        assert piece in code
    no_cache = code_snippet(make_strategy({"strategy": "no_cache"}), GenerationSettings(), "hi")
    assert "use_cache=False" in no_cache and "cache = " not in no_cache


def test_knob_helpers():
    assert knob_defaults("static") == {"max_cache_len": None, "compile": False}
    assert list(knob_defaults("quantized"))[:3] == ["backend", "nbits", "residual_length"]
    assert knob_defaults("dynamic") == {"layer_types": "model"}
    assert knob_defaults("no_cache") == {}
    assert max_knobs() >= len(knob_defaults("quantized"))
    assert [knob_text(v) for v in (None, True, False, 4, "hqq")] == ["", "true", "false", "4", "hqq"]
    assert parse_knob("", 128) == 128
    assert parse_knob("  ", None) is None
    assert parse_knob("16", 128) == 16
    assert parse_knob("true", False) is True
    assert parse_knob("hqq", "quanto") == "hqq"
    assert column_spec("quantized", ["hqq", "4", "16", "64", "0", "0"]) == {
        "strategy": "quantized", "backend": "hqq", "nbits": 4, "residual_length": 16}
    assert column_spec("static", ["", "false"]) == {"strategy": "static"}


def test_plan_columns_keeps_good_slots_and_explains_bad_ones():
    columns, errors = plan_columns([
        ("dynamic", []),
        (NO_STRATEGY, ["", ""]),
        ("quantized", ["quanto", "5"]),
        ("static", ["12", "false"]),
        ("nonsense", []),
        ("static", ["-3", ""]),
    ])
    assert [(slot, s.name) for slot, s in columns] == [(0, "dynamic"), (3, "static")]
    assert columns[1][1].max_cache_len == 12
    assert set(errors) == {2, 4, 5}
    assert "nbits=5" in errors[2] and "[2, 4]" in errors[2]
    assert "unknown strategy 'nonsense'" in errors[4]
    assert "max_cache_len" in errors[5]


def test_plan_columns_with_nothing_picked():
    assert plan_columns([(NO_STRATEGY, []), ("", [])]) == ([], {})


def test_column_result_fields_the_view_reads_exist():
    names = {f.name for f in dataclasses.fields(ColumnResult)}
    assert {"text", "stopped", "message", "top1_agreement", "is_baseline"} <= names


def test_a_preset_columns_own_generation_settings_reach_its_slot_until_the_user_changes_it():
    """hybrid_sliding gives its no_cache column 8 tokens whatever the run's max; a slot changed by hand runs with
    the run's settings."""
    from kvlab.compare.preset import list_presets, load_preset
    from kvlab.ui.compare.form import RunRequest, carried_overrides, plan_run, slot_specs

    preset = load_preset(list_presets()["hybrid_sliding"])
    slots = [(name, [str(knobs[key]) if key in knobs else "" for key in sorted(knobs)])
             for name, knobs in slot_specs(preset.columns)]
    no_cache = next(slot for slot, (name, _) in enumerate(slots) if name == "no_cache")
    request = RunRequest(prompt="Once upon a time", max_new_tokens=16, preset="hybrid_sliding", slots=slots,
                         preset_overrides=carried_overrides(preset.columns))
    columns = plan_run(request).run_columns()
    by_name = {column.strategy.name: column for column in columns}
    assert by_name["no_cache"].overrides == {"max_new_tokens": 8}
    assert by_name["dynamic"].overrides == {}
    changed = list(slots)
    changed[no_cache] = ("dynamic", [])
    assert all(column.overrides == {} for column in plan_run(dataclasses.replace(request, slots=changed)).run_columns())
    carried_nothing = dataclasses.replace(request, preset_overrides={})
    assert all(column.overrides == {} for column in plan_run(carried_nothing).run_columns())
