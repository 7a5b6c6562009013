"""A Run button and a Stop button for a tab whose run streams into the page (Needle, Perplexity, Report).

Each Run gives the browser session a fresh stop event in its `gr.State` dict (before the run is queued, so
Stop works while it waits); Stop sets it; the run itself takes its turn in kvlab's scheduler
(`kvlab.ui.hosting.turns.page_turn`: a refusal, or the waiting line's position and wait, shows in the tab's
status). Wiring only: what a run does, and what it costs, is the tab's.
"""

from __future__ import annotations

import threading

from ..hosting import turns

PRIVATE = {"concurrency_limit": None, "api_visibility": "private"}
"""Handlers that touch no model: unqueued and not in the public API."""
WAITING = "waiting for a free slot…"


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
