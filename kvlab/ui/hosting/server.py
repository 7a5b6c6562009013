"""Serving the app so that the server does not slow the columns it times (gradio's queue polling), and closing
it promptly.

gradio 6's queue (`gradio.queueing.Queue`) runs two polling loops on the
server's event loop for as long as the app is up: one looks for a new event
to start every `sleep_when_free` seconds (1 ms on Linux and macOS, 50 ms on
Windows), the other for progress updates to send every
`progress_update_sleep_when_free` seconds (10 ms, 100 ms on Windows). That is
about 1,100 wake-ups a second, each a little Python on the event loop thread,
even while a run is going: about 8 % of one core in a Compare run through the
API. On a machine whose cores are all busy with torch's OpenMP team, every
wake-up preempts one of its threads and the others wait for it: on the
bundled model with 2 cores, a decode step took 67.8 ms (median of 192) with
gradio's Linux intervals against 60.6 ms with its Windows ones and 61.3 ms
with no polling: one process, an asyncio loop thread sleeping at each
interval beside decode steps on kvlab's compute thread, the three conditions
interleaved in windows of 16 steps (`python -m kvlab bench --only app`
measures the app as a whole against the CLI).

`calm_queue_polling` sets gradio's own Windows intervals. The cost: an event
waits up to 50 ms longer to start, and `gr.Progress` updates go out at most
10 times a second; kvlab streams its own updates from its generators, which
these loops do not pace.

`close_promptly` closes the server giving open connections SERVER_CLOSE_GRACE_S
to end: uvicorn waits for them without limit by default, and a client
listening to its event stream keeps one open, so gradio's `close()` waited
the 5 s it allows itself (the SIGTERM path, `kvlab.ui.hosting.shutdown`).

This is the one module that knows gradio's queue and server internals; it
touches nothing in the browser.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

EVENT_POLL_S = 0.05
"""Seconds between the queue's looks for a new event to start (gradio's value on Windows)."""
PROGRESS_POLL_S = 0.1
"""Seconds between the queue's looks for progress updates to send (gradio's value on Windows)."""
SERVER_CLOSE_GRACE_S = 1.0
"""Seconds the closing server waits for open connections (a client's event stream) before cancelling them."""
_INTERVALS = {"sleep_when_free": EVENT_POLL_S, "progress_update_sleep_when_free": PROGRESS_POLL_S}


def calm_queue_polling(demo) -> bool:
    """Set the polling intervals of `demo`'s queue (a `gr.Blocks` after `.queue()`) to EVENT_POLL_S and
    PROGRESS_POLL_S. Returns True when set; False, with a warning in the log, when this gradio's queue has no
    such attributes (another gradio version: the app still serves, with gradio's own intervals). Raises
    nothing."""
    queue = getattr(demo, "_queue", None)
    missing = [name for name in _INTERVALS if not isinstance(getattr(queue, name, None), (int, float))]
    if missing:
        logger.warning("gradio's queue has no %s here: its polling intervals are left as gradio set them",
                       ", ".join(missing))
        return False
    for name, seconds in _INTERVALS.items():
        setattr(queue, name, seconds)
    return True


def close_promptly(demo) -> None:
    """Close `demo` (a launched `gr.Blocks`; one not running is left as it is), giving open connections
    SERVER_CLOSE_GRACE_S (uvicorn's `timeout_graceful_shutdown` on gradio's server, when this gradio has one).
    The streams cancelled then would each print a `CancelledError` traceback on uvicorn's error log, which says
    nothing about a deliberate close: that log is kept to CRITICAL while closing, and put back after."""
    config = getattr(getattr(demo, "server", None), "config", None)
    if config is not None and hasattr(config, "timeout_graceful_shutdown"):
        config.timeout_graceful_shutdown = SERVER_CLOSE_GRACE_S
    server_log = logging.getLogger("uvicorn.error")
    level = server_log.level
    server_log.setLevel(logging.CRITICAL)
    try:
        demo.close(verbose=False)
    finally:
        server_log.setLevel(level)
