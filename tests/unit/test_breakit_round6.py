"""Break-it round 6 (issue 45, re-tested on a public Space set-up): each test pins one finding and fails on
the code it was found on. Reproduction scripts against a running app are in breakit/ (see its README).

- a YAML alias bomb in one knob value (~600 characters) is accepted by `yaml.safe_load` and written out whole
  in the knob's refusal (10 times longer per level: 36 MB at 7 levels, 43 s on /plan_memory);
- a knob value that is not YAML (a control character, `[[[[`, a `!!python` tag) raises yaml's own errors,
  which no caller catches (the CLI prints a traceback, /plan_memory and MCP give gradio's generic error);
- `budget_gib=1e308` overflows in the plan tool (generic error on /plan_memory and MCP `kvlab_plan`);
- a record holding a lone surrogate (`"\\ud800"`, valid JSON) is read as is; replayed in Compare it breaks the
  page's event stream (gradio cannot encode it), and its kept share link shows "Error" in every box of the
  Compare tab to whoever opens it;
- page runs are counted per gradio session, so one address minting session hashes fills the whole waiting
  line (17 runs) and every other visitor is refused "try again in about 5217 s";
- gradio keeps every session's state (about 1.25 MiB each on this app, measured) for up to 10,000 sessions,
  and any anonymous client can open about 5 sessions a second with a trivial event.
"""

import sys
import types

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.measure import record_json  # noqa: E402
from kvlab.sharing.cost import RunCost, Throughput  # noqa: E402
from kvlab.sharing.limits import Limits  # noqa: E402
from kvlab.sharing.scheduler import Scheduler  # noqa: E402
from kvlab.strategies import make_strategy  # noqa: E402
from kvlab.strategies.base import parse_strategy_list  # noqa: E402
from kvlab.ui.hosting import turns  # noqa: E402
from kvlab.ui.hosting.tools import AgentTools  # noqa: E402

pytestmark = pytest.mark.unit
REFUSAL_CHARS = 500
"""A refusal is one short line; 500 characters is generous."""


def alias_bomb(levels: int) -> str:
    """A YAML block list whose last item expands to 10**levels ones through anchors and aliases."""
    lines = ["", "- &a0", *["  - 1"] * 10]
    for level in range(1, levels):
        lines += [f"- &a{level}", *[f"  - *a{level - 1}"] * 10]
    return "\n".join(lines)


def test_a_yaml_alias_bomb_in_a_knob_is_refused_in_one_short_line():
    text = f"sink:window_length={alias_bomb(6)}"
    assert len(text) < 600
    with pytest.raises(ValueError) as refused:
        make_strategy(parse_strategy_list(text)[0])
    message = str(refused.value)
    assert "\n" not in message and len(message) <= REFUSAL_CHARS, f"{len(message):,} characters"


@pytest.mark.parametrize("value", ["\x01", "[[[[", "!!python/object:os.system"])
def test_a_knob_that_is_not_yaml_is_refused_as_bad_input(value):
    with pytest.raises(ValueError) as refused:
        make_strategy(parse_strategy_list(f"sink:window_length={value}")[0])
    assert "\n" not in str(refused.value) and "window_length" in str(refused.value)


def test_the_plan_tool_refuses_an_overflowing_budget_in_one_line():
    with pytest.raises(gr.Error) as refused:
        AgentTools(pool=None).plan(model="bundled", contexts="1k", strategies="dynamic", budget_gib=1e308)
    assert "budget_gib" in refused.value.message and "\n" not in refused.value.message


def test_a_record_with_a_lone_surrogate_is_refused_or_made_encodable():
    try:
        value = record_json.load_json(b'{"format": "kvlab.compare", "prompt": {"text": "hi \\ud800"}}')
    except record_json.RecordJSONError as refused:
        assert "\n" not in str(refused)
        return
    text = value["prompt"]["text"]
    text.encode("utf-8")  # what gradio's event stream must do with it (orjson refuses surrogates)


def _request(session: str, host: str = "10.0.0.9"):
    return types.SimpleNamespace(session_hash=session, headers={}, client=types.SimpleNamespace(host=host),
                                 url=types.SimpleNamespace(path="/gradio_api/queue/join"))


def _page_run(session: dict):
    yield {"status": "running"}
    yield {"status": "finished"}


def test_page_runs_from_one_address_share_its_per_client_cap(monkeypatch):
    monkeypatch.setattr(turns, "_SCHEDULER", Scheduler(Limits(runs_per_client=2, waiting=16),
                                                       rate=Throughput(prior_s=1.0)))
    monkeypatch.delenv("SPACE_ID", raising=False)
    runs = [turns.page_turn(_page_run, lambda session: RunCost(1, 4), "status", lambda t, k="info": f"{k}: {t}")
            ({}, _request(f"session-{n}")) for n in range(3)]
    try:
        firsts = [next(run) for run in runs]
        assert firsts[2]["status"].startswith("error: ✖ refused"), firsts[2]
        assert "KVLAB_MAX_RUNS_PER_CLIENT" in firsts[2]["status"]
    finally:
        for run in runs:
            run.close()


def test_the_app_bounds_the_sessions_gradio_keeps(monkeypatch):
    launched = {}

    class Demo:
        def launch(self, **kwargs):
            launched.update(kwargs)

        def close(self, verbose=True):
            pass

    monkeypatch.setattr(app, "create_app", lambda loader=None: Demo())
    monkeypatch.setattr(sys, "argv", ["app.py"])
    app.launch()
    # about 1.25 MiB of state per session measured on this app: gradio's default 10,000 is ~12 GiB
    assert launched.get("state_session_capacity", 10_000) <= 1_000
