"""Hostile input reaches every front as one short line (issue 45, break-it round 6, findings 1, 5 and 7).

- knob values: a YAML alias bomb, text that is not YAML and an over-long value are refused naming the knob, in
  the CLI (exit 2), the plan agent tool and the page's knob fields, and no message echoes a long value whole;
- a lone surrogate in a prompt (agent tool, /compare API, the page's prompt box, the CLI) is refused before
  any model loads, and one in a record (a key, a nested list) is refused by the reader;
- plan budgets of 1e308 or inf are refused in one line on every front instead of `int(inf)`'s OverflowError;
- an agent tool's refusal reads as the message itself, not Python's repr of it.
"""

import pytest

gr = pytest.importorskip("gradio")

from kvlab.cli import main  # noqa: E402
from kvlab.compare.preset import strategies_preset  # noqa: E402
from kvlab.measure import record_json  # noqa: E402
from kvlab.models import loading as models  # noqa: E402
from kvlab.plan.budget_input import MAX_BUDGET_GIB, budget_bytes  # noqa: E402
from kvlab.strategies import make_strategy  # noqa: E402
from kvlab.strategies.base import parse_strategy_list  # noqa: E402
from kvlab.strategies.knob_yaml import MAX_KNOB_VALUE_CHARS, MESSAGE_CHARS, SHOWN_CHARS, shown  # noqa: E402
from kvlab.ui.compare import records  # noqa: E402
from kvlab.ui.compare.form import RunRejected, RunRequest, plan_run  # noqa: E402
from kvlab.ui.hosting.tools import AgentTools, ToolError  # noqa: E402
from kvlab.ui.plan.view import PlanRejected, parse_budget  # noqa: E402
from kvlab.ui.shared.knobs import parse_knob  # noqa: E402

pytestmark = pytest.mark.unit
NOT_YAML = ["\x01", "[[[[", "!!python/object:os.system", "{a: 1", "&anchor 4", "*alias"]
SURROGATE = "hi \ud800 there"


def alias_bomb(levels: int) -> str:
    """A YAML block list whose last item expands to 10**levels ones through anchors and aliases."""
    lines = ["", "- &a0", *["  - 1"] * 10]
    for level in range(1, levels):
        lines += [f"- &a{level}", *[f"  - *a{level - 1}"] * 10]
    return "\n".join(lines)


def one_line(text: str, limit: int = 500) -> bool:
    return "\n" not in text and 0 < len(text) <= limit


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for input that should have been refused first")
    monkeypatch.setattr(models, "load_model", refuse)


@pytest.mark.parametrize("value", [*NOT_YAML, alias_bomb(6), "9" * (MAX_KNOB_VALUE_CHARS + 1)])
def test_a_bad_knob_value_is_one_line_naming_the_knob(value):
    with pytest.raises(ValueError) as refused:
        parse_strategy_list(f"sink:window_length={value}")
    assert one_line(str(refused.value)) and "window_length" in str(refused.value)


@pytest.mark.parametrize("value", ["[[[[", "\x01", "!!python/object"])
def test_the_cli_refuses_a_knob_that_is_not_yaml_with_exit_2_in_one_line(capsys, no_model_load, value):
    assert main(["plan", "--model", "bundled", "--context", "1k", "--strategies", f"sink:window_length={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert one_line(err) and "window_length" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["[[[[", alias_bomb(6)])
def test_the_plan_tool_refuses_a_bad_knob_in_one_unquoted_line(value):
    with pytest.raises(ToolError) as refused:
        AgentTools(pool=None).plan(model="bundled", contexts="1k", strategies=f"sink:window_length={value}")
    assert one_line(str(refused.value)) and str(refused.value).startswith("knob 'window_length'")


def test_a_page_knob_field_holding_an_alias_bomb_stays_short_text():
    value = parse_knob(alias_bomb(6), 64)
    assert value == alias_bomb(6).strip()
    with pytest.raises(ValueError) as refused:
        make_strategy({"strategy": "sink", "window_length": value})
    assert one_line(str(refused.value))


def test_a_long_value_is_never_echoed_whole():
    with pytest.raises(ValueError) as refused:
        make_strategy({"strategy": "sink", "window_length": list(range(100_000))})
    assert one_line(str(refused.value), MESSAGE_CHARS)
    assert len(shown("x" * 1000)) == SHOWN_CHARS and shown("x" * 1000).endswith("…") and shown(4) == "4"


@pytest.mark.parametrize("budget", [1e308, float("inf"), float("nan"), -1, MAX_BUDGET_GIB * 2, "lots"])
def test_a_budget_out_of_range_is_refused_on_every_front(capsys, no_model_load, budget):
    with pytest.raises(ToolError) as refused:
        AgentTools(pool=None).plan(model="bundled", contexts="1k", strategies="dynamic", budget_gib=budget)
    assert one_line(str(refused.value)) and "budget_gib" in str(refused.value)
    if budget != -1:  # the page and the CLI read "-1" as a number below 0: refused with their own words
        with pytest.raises(PlanRejected) as page:
            parse_budget(str(budget))
        assert one_line(str(page.value))
    assert main(["plan", "--model", "bundled", "--context", "1k", f"--budget-gib={budget}"]) == 2
    assert one_line(capsys.readouterr().err.strip())


def test_a_budget_in_range_is_whole_bytes():
    assert budget_bytes(1.5) == 3 << 29 and budget_bytes(MAX_BUDGET_GIB) == MAX_BUDGET_GIB << 30


@pytest.mark.parametrize("call", [
    lambda tools: tools.plan(batch=float("inf")),
    lambda tools: tools.compare_cost("dynamic", "hi", max_new_tokens=float("inf")),
    lambda tools: tools.diverge_cost("sink", "hi", steps=float("inf")),
])
def test_an_infinite_count_is_refused_not_overflowed(call):
    with pytest.raises(ToolError) as refused:
        call(AgentTools(pool=None))
    assert one_line(str(refused.value))


def test_a_tool_refusal_reads_as_its_message_not_its_repr():
    with pytest.raises(gr.Error) as refused:
        AgentTools(pool=None).compare_strategies(",".join(["dynamic"] * 9), "hi")
    message = refused.value.message
    assert str(refused.value) == message and message.startswith("strategies names 9 columns")
    assert not str(refused.value).startswith(("'", '"'))


def test_the_compare_tool_refuses_a_lone_surrogate_before_loading():
    with pytest.raises(ToolError) as refused:
        AgentTools(pool=None).compare_strategies("dynamic", SURROGATE)
    assert one_line(str(refused.value)) and "lone surrogate" in str(refused.value)


def test_every_prompt_front_refuses_a_lone_surrogate(capsys, no_model_load):
    with pytest.raises(ValueError, match="lone surrogate at character 4"):
        strategies_preset(SURROGATE, ["dynamic"], "cli")
    with pytest.raises(ValueError, match="lone surrogate"):
        records.run_preset(None, "quickstart", "api", prompt=SURROGATE)
    with pytest.raises(RunRejected, match="lone surrogate"):
        plan_run(RunRequest(prompt=SURROGATE, slots=[("dynamic", [])], budgets=[("", "")]))
    assert main(["compare", "--prompt", SURROGATE, "--strategies", "dynamic"]) == 2
    assert "lone surrogate" in capsys.readouterr().err


@pytest.mark.parametrize("text", [b'{"format": "kvlab.compare", "columns": [["ok", "\\udc00"]]}',
                                  b'{"format": "kvlab.compare", "\\ud800 key": 1}',
                                  b'{"format": "kvlab.compare", "prompt": {"text": "hi \\ud800"}}'])
def test_a_record_holding_a_lone_surrogate_is_refused(text):
    with pytest.raises(record_json.RecordJSONError, match="not valid Unicode"):
        record_json.load_json(text)


def test_a_record_given_as_text_holding_a_surrogate_itself_is_refused():
    with pytest.raises(record_json.RecordJSONError, match="not valid Unicode"):
        record_json.parse('{"format": "kvlab.compare", "name": "\ud800"}')
    with pytest.raises(record_json.RecordJSONError, match="not UTF-8"):  # its bytes are not UTF-8 either
        record_json.load_json('{"name": "\ud800"}'.encode("utf-8", "surrogatepass"))


def test_a_record_with_an_escaped_surrogate_pair_is_read():
    value = record_json.load_json(b'{"format": "kvlab.compare", "name": "\\ud83d\\ude00 \\\\ud800"}')
    assert value["name"] == "\U0001F600 \\ud800"
