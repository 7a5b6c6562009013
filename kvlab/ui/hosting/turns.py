"""Model-bound events take their turn in kvlab's scheduler (`kvlab.sharing.scheduler`), not in gradio's queue.

gradio lets every model-bound event start at once (`MODEL_BOUND`: no concurrency limit); the event's handler,
wrapped here, asks the process's one `Scheduler` for a turn before it touches the model, so the fair order,
the caps and the wait estimates are kvlab's:

- `page_turn` (a tab's run, a generator): the client is the browser page's address, as for an API caller (not
  its gradio session: any client can make up a new session id per run, so a session is no one). A refused run says so
  in the tab's status line; a waiting one yields "waiting: position N, about M s" every WAIT_UPDATE_S; Stop
  while waiting leaves the line; a page that closes leaves it too (gradio stops iterating a generator whose
  client went and closes it).
- `api_turn` (an HTTP API function such as `/compare`): the client is the caller's address. A refused call
  raises `gr.Error` with the one-line reason at once; a waiting or running call yields a progress value every
  WAIT_UPDATE_S (so the event stream never goes quiet long enough for a client's read timeout, and a client
  that went is noticed); the function runs on a thread of its own with a stop event that is set when the
  caller goes, and the final value is the function's result.
- `tool_turn` (an MCP tool): an async function, registered with `queue=False`, so gradio's MCP server runs it
  inside the agent's own request; an agent that disconnects cancels it, which sets its stop event and frees
  its place. The client is the agent's address (kind `mcp`; `api` when called through gradio's queue).

A client's address is the connection's, or behind KVLAB_PROXY_HOPS trusted proxies (1 on a Hugging Face
Space, else 0) the X-Forwarded-For entry that many from the right: each proxy appends the address it was
connected from, so that entry is the one the outermost trusted proxy saw, and hops a client writes itself
(any entry further left) are never read. Two visitors behind one address (a NAT, an office proxy) are one
client.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
import typing

import anyio
import gradio as gr

from kvlab.sharing.cost import RunCost
from kvlab.sharing.limits import PROXY_HOPS_ENV, Limits, proxy_hops  # noqa: F401 - PROXY_HOPS_ENV re-exported
from kvlab.sharing.scheduler import Client, Refused, Scheduler, Ticket
from kvlab.strategies.knob_yaml import brief

WAIT_UPDATE_S = 1.0
"""Seconds between a waiting or running call's updates (gradio's own heartbeat comes every 15 s)."""
TOOL_POLL_S = 0.25
"""Seconds between an MCP tool's looks at its place in line."""
MIN_SAMPLE_S = 2.0
"""A run that ended sooner (refused input, a model that failed to load) does not teach the rate."""
MODEL_BOUND = {"concurrency_limit": None}
"""gradio settings of a model-bound event: every one starts at once and waits for its turn here."""
_SCHEDULER = Scheduler()


def scheduler() -> Scheduler:
    """The process's one scheduler (its compute thread is one too)."""
    return _SCHEDULER


def configure(limits: Limits) -> None:
    """Use `limits` from now on (the app reads them from the environment when it is built)."""
    _SCHEDULER.limits = limits


# ----- who asks -----

def client_address(request) -> str:
    """The caller's address (see the module's docstring); "unknown" when the request has none. With proxy hops
    and fewer X-Forwarded-For entries than hops (a request that did not come through them all), the
    connection's address."""
    headers = getattr(request, "headers", None) or {}
    hops = proxy_hops()
    if hops:
        values = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else \
            [headers.get("x-forwarded-for") or ""]
        entries = [entry.strip() for value in values for entry in value.split(",") if entry.strip()]
        if len(entries) >= hops:
            return entries[-hops]
    return getattr(getattr(request, "client", None), "host", None) or "unknown"


def visitor_of(request) -> Client:
    """A browser page: its address (`client_address`), not its gradio session, which the client makes up itself.
    Two visitors behind one address (a NAT, an office proxy) share its caps and its place in the fair order."""
    return Client("visitor", client_address(request))


def api_client_of(request) -> Client:
    """An API caller or an MCP agent (a request to gradio's MCP server): its address."""
    url = getattr(request, "url", None)
    kind = "mcp" if "/mcp" in str(getattr(url, "path", "") or "") else "api"
    return Client(kind, client_address(request))


# ----- the wrappers -----

def _with_request(wrapper, fn, drop: tuple[str, ...] = ()):
    """Give `wrapper` `fn`'s name, docstring, parameters (less `drop`) and return type, plus a last parameter
    gradio fills with the `gr.Request` (gradio reads a handler's signature and type hints to call it)."""
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
              if p.name not in drop]
    params.append(inspect.Parameter("kvlab_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                    annotation=gr.Request))
    wrapper.__signature__ = signature.replace(parameters=params,
                                              return_annotation=hints.get("return", signature.return_annotation))
    wrapper.__annotations__ = {**{p.name: p.annotation for p in params}, "return": wrapper.__signature__.return_annotation}
    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    wrapper.kvlab_turn = fn
    return wrapper


def _sample(ticket: Ticket, ended_well: bool) -> bool:
    """Whether `ticket`'s run teaches the rate: it ended well after at least MIN_SAMPLE_S."""
    return ended_well and ticket.started_at is not None and _SCHEDULER.clock() - ticket.started_at >= MIN_SAMPLE_S


def page_turn(fn, cost, status, line, stop=None, admitted=None):
    """`fn` (a tab's run generator, or a handler returning one update) behind a turn, as a generator. cost(*args) -> RunCost (never raises: bad input gets a small
    cost, and `fn` says what is wrong); status: the component for the waiting line; line(text, kind) -> its
    value (kind: busy, info, error); stop(*args) -> the run's stop event (Stop pressed), or None;
    admitted(client, *args): told who the run was admitted for (`visitor_of`), before it waits."""

    def turn(*args):
        *args, request = args
        try:
            ticket = _SCHEDULER.admit(visitor_of(request), cost(*args))
        except Refused as err:
            yield {status: line(f"✖ {err}", "error")}
            return
        ended_well = False
        try:
            if admitted is not None:
                admitted(ticket.client, *args)
            started = yield from _wait_in_line(ticket, status, line, stop(*args) if stop else None)
            if started:
                result = fn(*args)
                if inspect.isgenerator(result):
                    yield from result
                else:
                    yield result
                ended_well = True
        finally:
            _SCHEDULER.release(ticket, _sample(ticket, ended_well))

    return _with_request(turn, fn)


def _wait_in_line(ticket: Ticket, status, line, stop: threading.Event | None):
    """Generator: the waiting line's updates until `ticket` runs (returns True) or Stop is pressed (False)."""
    while (place := _SCHEDULER.place(ticket)) is not None:
        if stop is not None and stop.is_set():
            yield {status: line("stopped before the run started", "info")}
            return False
        yield {status: line(place.describe(), "busy")}
        _SCHEDULER.wait(ticket, WAIT_UPDATE_S)
    return _SCHEDULER.started(ticket)


class _Job:
    """`fn(*args, stop=stop)` run once for `ticket` on a thread; the slot is released when it ends there."""

    def __init__(self, ticket: Ticket, fn, args, stop: threading.Event):
        self.ticket, self.fn, self.args, self.stop = ticket, fn, args, stop
        self.began = False
        self.result = self.error = None
        self.done = threading.Event()

    def run(self):
        self.began = True
        ended_well = False
        try:
            self.result = self.fn(*self.args, stop=self.stop)
            ended_well = not self.stop.is_set()  # a run its caller left ended early: no measure of the rate
            return self.result
        except BaseException as err:
            self.error = err
            raise
        finally:
            _SCHEDULER.release(self.ticket, _sample(self.ticket, ended_well))
            self.done.set()


class ToolError(gr.Error):
    """A refusal an API or MCP caller gets: `gr.Error` whose message is `knob_yaml.brief(message)` (one line of
    at most MESSAGE_CHARS characters, control characters and lone surrogates escaped) and whose `str()` is
    that line. gradio's own `Error.__str__` returns `repr(message)`, and its MCP server hands an agent
    `str(error)`, so a plain `gr.Error` reaches the agent quoted, with escaped quotes; this one reaches it as
    the one line written."""

    def __init__(self, message, *args, **kwargs):
        kwargs.setdefault("print_exception", False)
        super().__init__(brief(str(message)), *args, **kwargs)

    def __str__(self) -> str:
        return str(self.message)


def _admit_or_refuse(client: Client, cost: RunCost) -> Ticket:
    try:
        return _SCHEDULER.admit(client, cost)
    except Refused as err:
        raise ToolError(str(err)) from None


def api_turn(fn, cost):
    """`fn(*args, stop=event) -> value` (an API function) behind a turn, as a generator gradio streams:
    {"waiting": {"position", "wait_s"}} while it waits, {"running": {"elapsed_s"}} while it runs, then the value.
    cost(*args) -> RunCost; a refusal is a `gr.Error`."""

    def turn(*args):
        *args, request = args
        ticket = _admit_or_refuse(api_client_of(request), cost(*args))
        job = _Job(ticket, fn, args, threading.Event())
        try:
            while (place := _SCHEDULER.place(ticket)) is not None:
                yield {"waiting": {"position": place.position, "wait_s": round(place.wait_s, 1)}}
                _SCHEDULER.wait(ticket, WAIT_UPDATE_S)
            threading.Thread(target=_quietly, args=(job.run,), daemon=True, name="kvlab-api-run").start()
            started = time.monotonic()
            while not job.done.wait(WAIT_UPDATE_S):
                yield {"running": {"elapsed_s": round(time.monotonic() - started, 1)}}
            if job.error is not None:
                raise job.error
            yield job.result
        finally:
            job.stop.set()  # the caller went (or it is over): the run ends within a step
            if not job.began:
                _SCHEDULER.release(ticket)

    return _with_request(turn, fn, drop=("stop",))


def _quietly(run) -> None:
    try:
        run()
    except BaseException:  # noqa: BLE001 - kept in the job and raised where the caller waits
        pass


def tool_turn(fn, cost):
    """`fn(*args, stop=event) -> value` (an MCP tool) behind a turn, as an async function: register it with
    `queue=False` so it runs in the agent's request, whose disconnect cancels it. cost(*args) -> RunCost
    (it may raise `gr.Error` for arguments outside the tool's schema); a refusal is a `gr.Error`."""

    async def turn(*args):
        *args, request = args
        ticket = _admit_or_refuse(api_client_of(request), cost(*args))
        job = _Job(ticket, fn, args, threading.Event())
        try:
            while not _SCHEDULER.started(ticket):
                await asyncio.sleep(TOOL_POLL_S)
            return await anyio.to_thread.run_sync(job.run, abandon_on_cancel=True)
        finally:
            job.stop.set()
            if not job.began:
                _SCHEDULER.release(ticket)

    return _with_request(turn, fn, drop=("stop",))
