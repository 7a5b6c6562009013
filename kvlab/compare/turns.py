"""How the runner's columns take turns with the model: kvlab's compute thread (fair, sequential) or free threads
(parallel), and the share of torch's intra-op threads parallel columns use.

Moved out of `kvlab.compare.runner` (which re-exports these names); it schedules, it does not measure.
"""

from __future__ import annotations

import contextlib
import threading

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


class ComputeTurns:
    """Fair and sequential modes: each step runs on kvlab's compute thread (`kvlab.compute`), one at a time, in
    the order the columns asked."""

    def run(self, work):
        return compute(work)

    def iterate(self, steps):
        return compute_iter(steps)


class FreeTurns:
    """Parallel mode: each column computes in its own thread, at the same time as the others."""

    def run(self, work):
        return work()

    def iterate(self, steps):
        return iter(steps)
