"""A Run button and a Stop button for a tab whose run streams into the page (Needle, Perplexity).

Each Run gives the browser session a fresh stop event in its `gr.State` dict (before the run is queued, so
Stop works while it waits); Stop sets it; the run itself goes through the one model queue
(`CONCURRENCY`, `MODEL_CONCURRENCY_ID`). Wiring only: what a run does is the tab's.
"""

from __future__ import annotations

import threading

from .loader import CONCURRENCY, MODEL_CONCURRENCY_ID

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


def wire_run(run_button, stop_button, session, status, fn, inputs, outputs) -> None:
    """Run: `fresh_stop`, then `fn(*inputs)` on the model queue, streaming into `outputs`; Stop: `request_stop`."""
    run_button.click(fresh_stop, session, status, **PRIVATE).then(
        fn, inputs, outputs, concurrency_limit=CONCURRENCY, concurrency_id=MODEL_CONCURRENCY_ID,
        api_visibility="private")
    stop_button.click(request_stop, session, None, **PRIVATE)
