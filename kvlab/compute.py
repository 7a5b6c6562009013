"""One thread for kvlab's torch work: `compute(fn)` runs `fn` there and returns its result.

Why: torch's CPU kernels run on OpenMP, and each Python thread that starts a
parallel torch operation gets its own OpenMP team, kept until that thread
ends. When a process holds more OpenMP threads than cores, GNU OpenMP stops
letting idle team threads spin-wait for work and parks them instead, so every
parallel region pays a wake-up: on the bundled model with 2 cores a decode
step took 53 ms in a second thread against 30 ms with all work on one thread,
and a (1, 576) × (576, 1536) matmul 125 µs against 40 µs (the roofline section
of `python -m kvlab bench` reports the decode rate reached this way). The
waiting threads spin, so other busy processes on the same cores slow each
step down. kvlab's columns, chat turns, perplexity
runs and warm-up therefore submit their torch work here, in arrival order
(first in, first out), which is also what makes fair mode fair: one forward at
a time (a Compare run's columns take their turns least-used first:
`kvlab.compare.turns.ComputeTurns`).

Calls made on the compute thread itself run inline, so nested calls cannot
deadlock. What runs here must not wait for another call to `compute`.
Parallel-mode columns do not use this thread; while they run, they and this
thread get a share of the intra-op threads (`kvlab.compare.runner.shared_threads`).

Background work that must not delay anyone (the app filling the Plan tab's
kept measurements after start) goes through `when_idle`: it waits until no call
has been waiting or running for a while, then takes one turn, so a Run started
meanwhile waits for one such call at most.

`close()` (the app's SIGTERM handler calls it) ends kvlab's torch work for
good: calls still waiting are cancelled and new ones raise `ComputeClosed`; the
call running now goes on, but every `kvlab.engine` loop (decoding, teacher
forcing, warm-up, on this thread or in a parallel-mode column) sees `closed()`
and stops before its next forward, as if its stop event were set.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THREAD_NAME = "kvlab-compute"
CLOSED_MESSAGE = "kvlab is shutting down: no more model work is taken"
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
_closed = threading.Event()
IDLE_S = 10.0
"""`when_idle` waits until the compute thread has had nothing to do for this long (seconds): longer than the
gap between two runs an API client or a visitor starts back to back, which a background call would otherwise
slip into and delay the second."""
IDLE_POLL_S = 0.25
_activity = {"pending": 0, "last": time.monotonic()}
_activity_lock = threading.Lock()


class ComputeClosed(RuntimeError):
    """The compute thread was closed (`close()`): kvlab is shutting down and takes no more torch work."""


def on_compute_thread() -> bool:
    return threading.current_thread().name.startswith(THREAD_NAME)


def close() -> None:
    """End kvlab's torch work for good (a shutdown): calls waiting for the compute thread are cancelled and
    new ones raise `ComputeClosed` in their callers; the call running now finishes. Returns at once."""
    _closed.set()
    _executor.shutdown(wait=False, cancel_futures=True)


def closed() -> bool:
    """Whether `close()` was called: kvlab's loops (`kvlab.engine`'s decoders) treat it as their stop, on the
    compute thread (so a long call ends at its next forward) and in parallel-mode columns alike."""
    return _closed.is_set()


def compute(fn: Callable[..., T], *args, **kwargs) -> T:
    """Run `fn(*args, **kwargs)` on the compute thread, after the calls submitted before it; return its
    result or raise its exception in the caller.

    Raises:
        ComputeClosed: `close()` was called before `fn` started (it never runs then).
    """
    if on_compute_thread():
        return fn(*args, **kwargs)
    if closed():
        raise ComputeClosed(CLOSED_MESSAGE)
    _note(+1)
    try:
        future = _executor.submit(fn, *args, **kwargs)
    except RuntimeError:  # shut down between the check and the submit
        _note(-1)
        raise ComputeClosed(CLOSED_MESSAGE) from None
    future.add_done_callback(lambda _: _note(-1))
    try:
        return future.result()
    except CancelledError:
        raise ComputeClosed(CLOSED_MESSAGE) from None


def _note(change: int) -> None:
    with _activity_lock:
        _activity["pending"] += change
        _activity["last"] = time.monotonic()


def idle_s() -> float:
    """Seconds since the compute thread last had a call waiting or running (0.0 while one does)."""
    with _activity_lock:
        return 0.0 if _activity["pending"] else time.monotonic() - _activity["last"]


def when_idle(fn: Callable[..., T], *args, quiet_s: float = IDLE_S, stop: threading.Event | None = None) -> T | None:
    """`compute(fn, *args)` once the compute thread has been idle for `quiet_s` seconds (background work that
    yields to everyone else); None, without running `fn`, when `stop` is set or `close()` is called first.

    Raises:
        ComputeClosed: as `compute`; whatever `fn` raises.
    """
    while idle_s() < quiet_s:
        if closed() or (stop is not None and stop.is_set()):
            return None
        time.sleep(IDLE_POLL_S)
    return compute(fn, *args)


_DONE = object()


def _next_or_done(iterator: Iterator[T]):
    return next(iterator, _DONE)


def compute_iter(iterable: Iterable[T], run: Callable = compute) -> Iterator[T]:
    """Iterate `iterable` with each step (each `next`) run on the compute thread; items are yielded in the
    caller's thread. Other callers' work can run between two steps, so a step must not leave thread-local
    torch state (such as an open `torch.inference_mode()` block) behind when it yields. `run(fn, *args)`
    submits each step (default `compute`; `kvlab.compare.turns.ComputeTurns` passes its own turn-taking)."""
    iterator = iter(iterable)
    try:
        while True:
            item = run(_next_or_done, iterator)
            if item is _DONE:
                return
            yield item
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            try:
                compute(close)
            except RuntimeError:
                # The executor is shut down (the interpreter is exiting): close it here instead.
                close()
