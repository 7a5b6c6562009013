"""How the runner's columns take turns with the model: kvlab's compute thread (fair, sequential; the least-used
column's turn first) or free threads (parallel), and the share of torch's intra-op threads parallel columns use.

Moved out of `kvlab.compare.runner` (which re-exports these names); it schedules, it does not measure.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch

from ..compute import compute, compute_iter

_threads_guard = threading.Lock()
_parallel_runs = 0
_threads_before: int | None = None
_threads_share = 1


def parallel_threads(columns: int, threads: int) -> int:
    """Intra-op threads per forward when `columns` columns run at once on `threads` threads: an even share, at
    least 1."""
    return max(1, threads // max(1, columns))


@contextlib.contextmanager
def shared_threads(columns: int):
    """While parallel runs go, give kvlab's compute thread (and so every other tab's work) the same share of
    torch's intra-op threads as each parallel column; yields that share, which each column thread sets for
    itself. torch keeps a thread count per thread once it has run torch work, so the compute thread is set
    explicitly, and its count from before the first run is restored when the last overlapping run ends."""
    global _parallel_runs, _threads_before, _threads_share
    with _threads_guard:
        if _parallel_runs == 0:
            _threads_before = compute(torch.get_num_threads)
            _threads_share = parallel_threads(columns, _threads_before)
            compute(torch.set_num_threads, _threads_share)
        _parallel_runs += 1
        share = _threads_share
    try:
        yield share
    finally:
        with _threads_guard:
            _parallel_runs -= 1
            if _parallel_runs == 0:
                compute(torch.set_num_threads, _threads_before)
                _threads_before = None


def least_used(used: dict, waiting: set):
    """The waiting column whose turn is next: the one that used the least compute so far (`used`: column ->
    seconds, in the order the columns first asked), ties to the one that asked first."""
    rank = {ident: n for n, ident in enumerate(used)}
    return min(waiting, key=lambda ident: (used[ident], rank[ident]))


class ComputeTurns:
    """Fair and sequential modes: each step runs on kvlab's compute thread (`kvlab.compute`), one of this run's
    steps at a time, the next turn going to the waiting column that has used the least compute so far (ties:
    the column that asked first), as a fair-queuing scheduler shares a processor (Linux CFS, or SGLang's and
    vLLM's fair scheduling of requests). So a column whose steps cost more (`no_cache` recomputes the whole
    sequence every token) takes fewer turns instead of holding every other column to its pace: the cheap
    columns stream at their own speed and finish first. A step's measured time is still its own compute."""

    def __init__(self):
        self._turns = threading.Condition()
        self._used: dict[int, float] = {}  # thread id -> compute seconds this run; dict order = who asked first
        self._waiting: set[int] = set()
        self._busy = False

    def _next(self) -> int:
        return least_used(self._used, self._waiting)

    def turn(self, work, *args):
        """Run `work(*args)` on the compute thread once this column's turn comes; return its result."""
        me = threading.get_ident()
        with self._turns:
            self._used.setdefault(me, 0.0)
            self._waiting.add(me)
            while self._busy or self._next() != me:
                self._turns.wait()
            self._waiting.discard(me)
            self._busy = True
        started = time.perf_counter()
        try:
            return compute(work, *args)
        finally:
            with self._turns:
                self._used[me] += time.perf_counter() - started
                self._busy = False
                self._turns.notify_all()

    def run(self, work):
        return self.turn(work)

    def iterate(self, steps):
        return compute_iter(steps, self.turn)


class FreeTurns:
    """Parallel mode: each column computes in its own thread, at the same time as the others."""

    def run(self, work):
        return work()

    def iterate(self, steps):
        return iter(steps)
