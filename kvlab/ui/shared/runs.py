"""A Run button and a Stop button for a tab whose run streams into the page (Needle, Perplexity, Report).

Each Run gives the browser session a fresh stop event in its `gr.State` dict (before the run is queued, so
Stop works while it waits); Stop sets it; the run itself takes its turn in kvlab's scheduler
(`kvlab.ui.hosting.turns.page_turn`: a refusal, or the waiting line's position and wait, shows in the tab's
status). A run's start, `load_and_plan`, loads the model and plans the run, or ends it with one status line.
Wiring only: what a run does, and what it costs, is the tab's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TypeVar

from kvlab.models.loading import LoadedModel, ModelLoadError, ModelSpec
from kvlab.strategies import StrategyError

from ..hosting import turns
from .markup import md_text

PRIVATE = {"concurrency_limit": None, "api_visibility": "private"}
"""Handlers that touch no model: unqueued and not in the public API."""
WAITING = "waiting for a free slot…"
LOADING = "loading the model…"
REFUSALS = (ValueError, ModelLoadError, StrategyError)
"""What a run's start refuses with one status line (bad input, a model that does not load, a cache that cannot
be built); anything else is the tab's to handle."""
Plan = TypeVar("Plan")


def fresh_stop(session: dict) -> str:
    """Run clicked (before queueing): a fresh stop event for this session's run; the status while it waits."""
    session["stop"] = threading.Event()
    return WAITING


def request_stop(session: dict) -> None:
    """Stop clicked: set this session's stop event (nothing when no run started)."""
    if session.get("stop") is not None:
        session["stop"].set()


def session_stop(session: dict) -> threading.Event:
    """The stop event of this session's current run (a new one when there is none)."""
    return session.get("stop") or threading.Event()


def plain_line(text: str, kind: str = "info") -> str:
    """A status line for a Markdown status (the kind shows in the text: ✖ for a refusal)."""
    return text


def wire_run(run_button, stop_button, session, status, fn, inputs, outputs, cost) -> None:
    """Run: `fresh_stop`, then `fn(*inputs)` after its turn (`cost(*inputs)` -> `kvlab.sharing.cost.RunCost`),
    streaming into `outputs`; Stop: `request_stop`. `inputs`: a list, or a set (then `fn` gets one dict)."""
    def stop_of(*args) -> threading.Event | None:
        state = args[0][session] if isinstance(inputs, set) else args[list(inputs).index(session)]
        return (state or {}).get("stop")

    run_button.click(fresh_stop, session, status, **PRIVATE).then(
        turns.page_turn(fn, cost, status, plain_line, stop_of), inputs, outputs, api_visibility="private",
        **turns.MODEL_BOUND)
    stop_button.click(request_stop, session, None, **PRIVATE)


def load_and_plan(pool, source: str, status, plan: Callable[[LoadedModel], Plan], refusals: tuple = REFUSALS,
                  first: dict | None = None) -> Generator[dict, None, tuple[LoadedModel, Plan] | None]:
    """A streaming run's start, for `yield from`: yields {status: LOADING} (with `first`'s updates), then loads
    the model of `source` (a picker value) from `pool` and returns (that model, `plan(model)`); when either raises
    one of `refusals`, yields {status: "⚠️ <the reason>"} (one Markdown-inert line) and returns None."""
    yield {status: LOADING, **(first or {})}
    try:
        loaded = pool.get(ModelSpec.from_field(source))
        return loaded, plan(loaded)
    except refusals as err:
        yield {status: f"⚠️ {md_text(err)}"}
        return None
