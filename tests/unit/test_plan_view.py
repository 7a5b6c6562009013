"""The Plan tab's pure part (kvlab.ui.plan.view), without gradio: the form -> a checked request (contexts,
budget, batch, cards), bad input -> one clear message, a catalog plan -> table rows in GiB with fits and the
longest context in the budget, the plot's series and budget line, and the columns "measure it for real"
hands to Compare."""

from html import unescape

import pytest
from matplotlib.figure import Figure

from kvlab.plan.catalog import known_models
from kvlab.plan.planner import GIB
from kvlab.ui.shared.knobs import NO_STRATEGY, knob_defaults
from kvlab.ui.plan.view import (
    BUDGET_CARDS,
    PAST_LIMIT_MARK,
    PlanForm,
    PlanRejected,
    budget_choices,
    compare_columns,
    gib_text,
    model_choices,
    parse_budget,
    parse_contexts,
    plan_request,
    run_plan,
    slot_forms,
)

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GEMMA = "google/gemma-3-27b-it"


def card(name: str, **knobs) -> tuple[str, list[str]]:
    """A card as the page sends it: the strategy and its knob fields' texts in field order (empty: default)."""
    if name == NO_STRATEGY:
        return name, []
    return name, ["" if knobs.get(k) is None else str(knobs[k]) for k in knob_defaults(name)]


def form(**fields) -> PlanForm:
    fields.setdefault("slots", [card("dynamic"), card("sink", window_length=1024)])
    return PlanForm(**fields)


def test_contexts_read_k_as_1024_tokens_sorted_once():
    assert parse_contexts("128k, 1k 32k;1024") == (1024, 32768, 131072)
    assert parse_contexts("1m") == (1 << 20,)
    assert parse_contexts("0, -5") == (-5, 0)  # the planner's range check names them
    for bad, message in (("", "no context length"), ("1.5k", "whole numbers"), ("lots", "whole numbers")):
        with pytest.raises(PlanRejected, match=message):
            parse_contexts(bad)


def test_budget_is_a_card_or_gib():
    assert [value for _, value in budget_choices()] == ["none", *BUDGET_CARDS]
    assert list(BUDGET_CARDS) == ["16", "24", "40", "48", "80", "141"]
    assert parse_budget("24") == 24 * GIB
    assert parse_budget("30 GiB") == parse_budget("30GB") == 30 * GIB
    assert parse_budget(BUDGET_CARDS["80"]) == 80 * GIB  # a card's label typed back in
    assert parse_budget("none") is None and parse_budget("") is None and parse_budget(None) is None
    with pytest.raises(PlanRejected, match="above 0"):
        parse_budget("0")
    with pytest.raises(PlanRejected, match="16 GB, 24 GB, 40 GB, 48 GB, 80 GB, 141 GB"):
        parse_budget("plenty")


def test_model_choices_are_bundled_then_the_catalog():
    values = [value for _, value in model_choices()]
    assert values == ["bundled", "bundled:gemma-3-270m", *known_models()]


@pytest.mark.parametrize("fields,message", [
    ({"contexts": "0"}, "context must be an integer from 1 to 4,294,967,296, got 0"),
    ({"contexts": "1k, -1"}, "context must be an integer from 1"),
    ({"batch": 0}, "batch must be an integer from 1 to 1,048,576, got 0"),
    ({"batch": None}, "batch is empty"),
    ({"batch": 1.5}, "batch must be a whole number"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"model": "  "}, "no model given"),
    ({"slots": [(NO_STRATEGY, [])] * 3}, "no strategy picked"),
    ({"slots": [card("quantized", nbits=5)]}, "no card can be planned: card 1: nbits=5 is not supported"),
])
def test_bad_input_is_refused_with_the_reason(fields, message):
    with pytest.raises(PlanRejected, match=message):
        plan_request(form(**fields))


def test_a_bad_card_is_reported_and_the_others_are_planned():
    slots = [card("dynamic"), card("quantized", nbits=5), card(NO_STRATEGY), card("sink", window_length=64)]
    request, planned_slots, errors = plan_request(form(slots=slots))
    assert request.strategies == ({"strategy": "dynamic"}, {"strategy": "sink", "window_length": 64})
    assert planned_slots == [0, 3] and list(errors) == [1] and "nbits=5" in errors[1]


def test_an_unknown_name_lists_the_catalog():
    with pytest.raises(PlanRejected, match="unknown model 'llama-3-8b'") as err:
        run_plan(form(model="llama-3-8b"))
    assert all(hub_id in str(err.value) for hub_id in known_models())


def test_a_folder_without_config_json_is_refused(tmp_path):
    with pytest.raises(PlanRejected, match="is not a model folder: it has no config.json"):
        run_plan(form(model=str(tmp_path)))


def test_a_catalog_plan_gives_gib_fits_and_the_longest_context_in_budget():
    steps = []

    def iterate(items):
        for item in items:
            steps.append(type(item).__name__)
            yield item

    view = run_plan(form(model=LLAMA, contexts="1k, 128k", budget="24"), iterate)
    assert steps == ["PlanProgress"] * 3 + ["Plan"]  # probed, then one step per strategy, then the plan
    assert view.headers() == ["strategy", "cache GiB at 1k", "cache GiB at 128k", "weights GiB",
                              "total GiB at 128k", "max context in 24 GiB", "note"]
    dynamic, sink = view.rows()
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB per token.
    assert dynamic[:6] == ["dynamic", "0.125\u00a0✔", "16.0\u00a0✖", "15.0", "31.0", "74,075 tokens"]
    assert sink[0] == "sink 4+1020" and sink[1] == sink[2] == "0.125\u00a0✔" and sink[5] == "unbounded"
    text, kind = view.status()
    assert kind == "ok" and text.startswith("✔ planned 2 strategies × 2 contexts")
    assert "LlamaForCausalLM" in view.model_text() and "15.0 GiB of weights in bfloat16" in view.model_text()
    assert "grow exactly 4,096 B per token" in unescape(view.explanations())


def test_strategies_the_model_cannot_use_say_why_as_compare_does():
    slots = [card("dynamic"), card("quantized", backend="quanto", nbits=4), card("sink", window_length=1024)]
    view = run_plan(form(model=GEMMA, contexts="1k, 128k", budget="24", slots=slots))
    rows = {row[0]: row for row in view.rows()}
    # transformers refuses QuantizedCache on sliding layers; kvlab quantizes the 10 full layers only
    assert rows["quantized quanto int4 r128"][1:3] == ["0.428\u00a0✖", "3.218\u00a0✖"]
    assert "the sink cache needs every layer to be full attention" in rows["sink 4+1020"][-1]
    assert rows["dynamic"][-2] == "none: weights alone exceed it"  # 51 GiB of bf16 weights in 24 GiB
    text, _ = view.status()
    assert "cannot serve this model: sink 4+1020: config.layer_types" in text
    assert [item["label"] for item in view.series()] == ["dynamic", "quantized quanto int4 r128"]


def test_contexts_past_max_position_embeddings_are_marked():
    view = run_plan(form(model=LLAMA, contexts="128k, 256k", budget="none"))
    assert view.headers()[1:3] == ["cache GiB at 128k", "cache GiB at 256k" + PAST_LIMIT_MARK]
    assert "exceed the model's max_position_embeddings" in unescape(view.model_text())
    assert view.rows()[0][1] == "16.0" and view.rows()[0][-2] == "—"  # no budget: no marks, no max context


def test_the_figure_has_log_axes_and_the_budget_line():
    fig = run_plan(form(model=LLAMA, contexts="1k, 16k, 128k", budget="24")).figure()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [line.get_label() for line in ax.get_lines()]
    assert "budget 24 GiB − weights 15.0 GiB = 9.0 GiB for the cache" in labels
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1k", "16k", "128k"]
    over = run_plan(form(model=GEMMA, contexts="1k", budget="24")).figure()
    assert "the weights alone (51.1 GiB) exceed the 24 GiB budget" in over.axes[0].get_title()


def test_measure_it_for_real_carries_the_cards_to_compare():
    slots = [card(name, **knobs) for name, knobs in slot_forms()]
    columns = compare_columns(slots)
    assert len(columns) == 8
    assert columns[:6] == [("dynamic", {}), ("static", {}), ("quantized", {"nbits": 4}),  # quanto: the default
                           ("quantized", {"backend": "hqq", "nbits": 4}), ("sink", {"window_length": 1024}),
                           ("sliding_window", {})]
    assert columns[6:] == [(NO_STRATEGY, {})] * 2


def test_gib_text():
    assert [gib_text(v) for v in (None, 0, GIB // 8, 31 * GIB, 113 * GIB, 1000)] == \
        ["—", "0", "0.125", "31.0", "113", "<0.001"]


def test_a_max_context_past_max_position_embeddings_is_marked_and_the_legend_is_off_the_axes():
    view = run_plan(form(model=LLAMA, contexts="1k, 128k", budget="80"))
    dynamic = view.rows()[0]
    assert dynamic[5].endswith(" tokens" + PAST_LIMIT_MARK)  # 65 GiB of cache room: past the model's 131,072
    fig = view.figure()
    fig.draw_without_rendering()
    ax = fig.axes[0]
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # never over the budget line
