"""kvlab's turn wrappers around model-bound handlers (`kvlab.ui.hosting.turns`), with stand-in requests and
handlers, no model.

- Who asks: a page and an API caller by their address (X-Forwarded-For's first hop only behind a
  proxy); a request to the MCP server is an agent.
- A page run over a cap gets one refusal line in its status and never runs; a waiting one yields its position
  and wait, leaves the line when Stop is pressed, and frees its place when gradio closes it (its page went).
- An API call waits with progress values and returns the function's value; a refusal is one `gr.Error` line.
- An MCP tool cancelled while it runs (the agent went) sets its stop event, and the slot is free once the
  function returns; one cancelled while it waits leaves the line at once.
- The wrappers show gradio the handler's own parameters and return type, plus the request.
"""

import asyncio
import inspect
import threading
import types

import gradio as gr
import pytest

from kvlab.sharing.cost import RunCost, Throughput
from kvlab.sharing.limits import Limits
from kvlab.sharing.scheduler import Client, Scheduler
from kvlab.ui.hosting import turns

pytestmark = pytest.mark.unit
SMALL = RunCost(1, 4)


@pytest.fixture
def fresh(monkeypatch):
    """A scheduler of its own for the test (1 slot, 2 runs per client)."""
    scheduler = Scheduler(Limits(runs_per_client=2, waiting=4), rate=Throughput(prior_s=1.0))
    monkeypatch.setattr(turns, "_SCHEDULER", scheduler)
    return scheduler


def request(session="s1", host="10.0.0.9", path="/gradio_api/queue/join", forwarded=None):
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    return types.SimpleNamespace(session_hash=session, headers=headers, client=types.SimpleNamespace(host=host),
                                 url=types.SimpleNamespace(path=path))


def line(text, kind="info"):
    return f"{kind}: {text}"


def page_run(session: dict):
    """A tab's run: two updates."""
    yield {"status": "running"}
    yield {"status": "finished"}


def test_who_asks(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(turns.PROXY_HOPS_ENV, raising=False)
    forged = request(forwarded="1.2.3.4, 10.0.0.1")
    assert turns.visitor_of(forged) == Client("visitor", "10.0.0.9")  # its address, not its made-up session
    assert turns.visitor_of(request(session="s2")) == turns.visitor_of(forged)
    assert turns.api_client_of(forged) == Client("api", "10.0.0.9")  # no proxy in front: the header is ignored
    assert turns.api_client_of(request(path="/gradio_api/mcp/")).kind == "mcp"
    monkeypatch.setenv("SPACE_ID", "user/kvlab")
    assert turns.client_address(forged) == "10.0.0.1"  # the entry the Space's proxy appended, not the forged one
    monkeypatch.setenv(turns.PROXY_HOPS_ENV, "2")
    assert turns.client_address(forged) == "1.2.3.4"
    assert turns.client_address(request(forwarded="10.0.0.1")) == "10.0.0.9"  # fewer entries than hops
    monkeypatch.setenv(turns.PROXY_HOPS_ENV, "0")
    assert turns.client_address(forged) == "10.0.0.9"


def test_forged_forwarded_hops_do_not_make_one_client_many(monkeypatch):
    """Break-it round 7: the first X-Forwarded-For hop was read as the address, so a client writing a new one
    per run was a new client each time and never held to the per-client cap."""
    monkeypatch.setenv("SPACE_ID", "user/kvlab")
    monkeypatch.delenv(turns.PROXY_HOPS_ENV, raising=False)
    addresses = {turns.client_address(request(forwarded=f"203.0.113.{n}, 198.51.100.7")) for n in range(20)}
    assert addresses == {"198.51.100.7"}


@pytest.mark.parametrize("text", ["-1", "9", "one", "1.5"])
def test_a_bad_proxy_hops_setting_is_one_line_naming_it(monkeypatch, text):
    monkeypatch.setenv(turns.PROXY_HOPS_ENV, text)
    with pytest.raises(ValueError, match=turns.PROXY_HOPS_ENV) as err:
        turns.proxy_hops()
    assert "\n" not in str(err.value)


def test_a_page_run_over_a_cap_is_refused_in_one_status_line(fresh):
    run = turns.page_turn(page_run, lambda session: RunCost(8, 4096), "status", line)
    updates = list(run({}, request()))
    assert len(updates) == 1 and updates[0]["status"].startswith("error: ✖ refused: this run costs")
    assert "KVLAB_MAX_RUN_STEPS" in updates[0]["status"] and "\n" not in updates[0]["status"]
    assert fresh.counts() == (0, 0)


def test_a_page_run_is_told_the_address_it_was_admitted_for(fresh, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(turns.PROXY_HOPS_ENV, raising=False)
    told = []
    run = turns.page_turn(page_run, lambda session: SMALL, "status", line, admitted=lambda c, s: told.append((c, s)))
    session = {}
    assert list(run(session, request(session="s7"))) == [{"status": "running"}, {"status": "finished"}]
    assert told == [(Client("visitor", "10.0.0.9"), session)]


def test_a_waiting_page_run_shows_its_place_and_leaves_on_stop_or_when_closed(fresh, monkeypatch):
    monkeypatch.setattr(turns, "WAIT_UPDATE_S", 0.01)
    holder = fresh.admit(Client("api", "x"), RunCost(1, 30))
    stop = threading.Event()
    run = turns.page_turn(page_run, lambda session: SMALL, "status", line, lambda session: stop)
    waiting = run({}, request())
    assert next(waiting) == {"status": "busy: waiting: position 1, about 30 s"}
    assert fresh.counts() == (1, 1)
    stop.set()
    assert list(waiting) == [{"status": "info: stopped before the run started"}]
    assert fresh.counts() == (1, 0)

    closed = turns.page_turn(page_run, lambda session: SMALL, "status", line)({}, request("s2"))
    next(closed)
    closed.close()  # gradio closes the generator of an event whose page went
    assert fresh.counts() == (1, 0)
    fresh.release(holder)
    assert list(turns.page_turn(page_run, lambda session: SMALL, "status", line)({}, request())) == [
        {"status": "running"}, {"status": "finished"}]
    assert fresh.counts() == (0, 0)


def test_an_api_call_waits_with_progress_values_and_returns_the_value(fresh, monkeypatch):
    monkeypatch.setattr(turns, "WAIT_UPDATE_S", 0.01)
    seen = []

    def compare(preset: str, *, stop=None) -> dict:
        seen.append(stop)
        return {"preset": preset}

    holder = fresh.admit(Client("visitor", "p"), SMALL)
    call = turns.api_turn(compare, lambda preset: SMALL)("quickstart", request())
    assert next(call) == {"waiting": {"position": 1, "wait_s": 4.0}}
    fresh.release(holder)
    outputs = list(call)
    assert outputs[-1] == {"preset": "quickstart"} and isinstance(seen[0], threading.Event)
    assert fresh.counts() == (0, 0)
    with pytest.raises(gr.Error, match="KVLAB_MAX_RUN_STEPS"):
        next(turns.api_turn(compare, lambda preset: RunCost(8, 4096))("quickstart", request()))


def test_an_mcp_tool_cancelled_by_its_agent_stops_its_run_and_frees_the_slot(fresh):
    started, stops = threading.Event(), []

    def tool(prompt: str, *, stop=None) -> str:
        stops.append(stop)
        started.set()
        stop.wait(30)
        return "stopped" if stop.is_set() else "ran out"

    async def agent_goes():
        call = asyncio.ensure_future(turns.tool_turn(tool, lambda prompt: SMALL)("hi", request(path="/gradio_api/mcp/")))
        while not started.is_set():
            await asyncio.sleep(0.01)
        assert fresh.counts() == (1, 0)
        call.cancel()  # the agent disconnected: gradio's MCP server cancels the call
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(agent_goes())
    assert stops[0].is_set()
    for _ in range(300):
        if fresh.counts() == (0, 0):
            break
        threading.Event().wait(0.01)
    assert fresh.counts() == (0, 0)


def test_an_mcp_tool_cancelled_while_it_waits_leaves_the_line(fresh):
    holder = fresh.admit(Client("visitor", "p"), SMALL)

    async def agent_goes():
        call = asyncio.ensure_future(turns.tool_turn(lambda prompt, *, stop=None: "ran", lambda prompt: SMALL)(
            "hi", request(path="/gradio_api/mcp/")))
        await asyncio.sleep(0.3)
        assert fresh.counts() == (1, 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(agent_goes())
    assert fresh.counts() == (1, 0)
    fresh.release(holder)


def test_gradio_sees_the_handlers_parameters_and_the_request():
    def tool(strategies: str, max_new_tokens: int = 32, *, stop=None) -> str:
        """Doc."""

    wrapped = turns.tool_turn(tool, lambda *args: SMALL)
    parameters = inspect.signature(wrapped).parameters
    assert list(parameters) == ["strategies", "max_new_tokens", "kvlab_request"]
    assert parameters["kvlab_request"].annotation is gr.Request
    assert inspect.signature(wrapped).return_annotation is str and wrapped.__name__ == "tool"
    assert wrapped.__doc__ == "Doc." and inspect.iscoroutinefunction(wrapped)
    assert inspect.isgeneratorfunction(turns.api_turn(tool, lambda *args: SMALL))
