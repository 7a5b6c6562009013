"""A strategy registered in the registry alone shows up in every tab with no UI code.

A throwaway subclass of `Dynamic` is registered under a new name (and removed
again in a `finally`); it must appear in Compare's column choices, Chat's
strategy choices and Perplexity's cache choices (Plan's cards offer Compare's
choices), get its knob field generated from its dataclass, and a Compare plan
and a Plan request with it must validate. The README's
"Adding a strategy" section names this test.
"""

from dataclasses import dataclass

from kvlab.strategies import STRATEGIES, register
from kvlab.strategies.dynamic import Dynamic
from kvlab.ui.chat.view import ChatForm, chat_strategy_choices
from kvlab.ui.compare.form import RunRequest, plan_run
from kvlab.ui.shared.knobs import card_form, max_knobs, strategy_choices
from kvlab.ui.perplexity.view import PerplexityRequest, perplexity_choices
from kvlab.ui.plan.view import PlanForm, plan_request

NAME = "throwaway_dynamic"


@dataclass
class ThrowawayDynamic(Dynamic):
    """Knobs: `note` (a label only; the cache is dynamic's)."""

    name = NAME
    summary = "A dynamic cache under another name, registered by a test."
    note: str = "hello"


def test_a_new_strategy_appears_in_compare_chat_and_perplexity():
    register(ThrowawayDynamic)
    try:
        assert NAME in [value for _, value in strategy_choices(None)]
        assert NAME in chat_strategy_choices()
        assert NAME in perplexity_choices()
        fields = card_form(NAME, {}, None, max_knobs())["knobs"]
        assert [(f["label"], f["value"]) for f in fields if f["visible"]] == [("layer_types", "model"),
                                                                              ("note", "hello")]

        plan = plan_run(RunRequest(prompt="Hi", slots=[("dynamic", []), (NAME, ["model", "bye"])]))
        assert plan.slot_errors == {}
        assert [(slot, s.name) for slot, s in plan.columns] == [(0, "dynamic"), (1, NAME)]
        assert plan.columns[1][1].note == "bye"

        assert ChatForm(strategy_name=NAME, knobs=["model", "bye"]).strategy().note == "bye"
        request, _, errors = plan_request(PlanForm(model="meta-llama/Llama-3.1-8B-Instruct", slots=[(NAME, ["model", "bye"])]))
        assert errors == {} and request.strategies == ({"strategy": NAME, "note": "bye"},)
        assert [c.describe() for c in PerplexityRequest(choices=["dynamic", NAME]).columns()] == ["dynamic", NAME]
    finally:
        STRATEGIES.pop(NAME, None)
    assert NAME not in [value for _, value in strategy_choices(None)]
