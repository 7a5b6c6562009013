"""The runner's one door into measurement: `Measurement`, chosen by a timing policy (`kvlab.measure.POLICIES`).

A run calls `warm_up` before any column's clock starts, `finish` once the live columns are done (the `quiet`
policy re-times them there, in fair mode) and `run_record` for the run's timing record. Each is a generator
where it may announce a phase (`RunPhase`) to the page. This module chooses and sequences; the work is in
`warmup`, `quiet` and `noise`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..compute import compute, compute_iter
from ..measure.noise import run_timing, timing_noise
from .quiet import RETIME_MAX_TOKENS, quiet_steps, quiet_summary
from ..measure.record import DEFAULT_POLICY, POLICIES
from ..measure.warmup import needs_warm_up, warm_up_columns
from .events import RunPhase


@dataclass(frozen=True)
class Measurement:
    """How one run is measured. policy: one of POLICIES (`live`: the live run's figures after a warm-up;
    `quiet`: those figures re-timed after the run in fair mode, see `kvlab.compare.quiet`).

    Raises:
        ValueError: an unknown policy; the message lists the allowed ones.
    """

    policy: str = "live"

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"timing policy must be one of {list(POLICIES)}, got {self.policy!r}")

    def warm_up(self, loaded, columns: list, input_tokens: int):
        """Generator: for each column's strategy that still needs its one-time set-up, a
        `RunPhase("warm_up", "k of n: name")` and that set-up, run on the compute thread; returns the seconds it
        took per column (0.0 where it was warm already, None where the column cannot run)."""
        strategies = [column.strategy for column in columns]
        cold = {s.warm_up_key() for s in strategies if s is not None and needs_warm_up(loaded, [s])}
        spent: list[float | None] = []
        for strategy in strategies:
            if strategy is not None and needs_warm_up(loaded, [strategy]):
                done = len(cold) - len({s.warm_up_key() for s in strategies
                                        if s is not None and needs_warm_up(loaded, [s])})
                yield RunPhase("warm_up", f"one-time set-up (not timed), {done + 1} of {len(cold)}: "
                                          f"{strategy.describe()}…")
            spent.extend(compute(warm_up_columns, loaded, [strategy], input_tokens))
        return spent

    def finish(self, loaded, columns: list, results: list, prompt_ids, settings, mode: str,
               stop: threading.Event):
        """Generator: under `quiet` in fair mode, a `RunPhase("retiming")` and the re-timing pass, step by step
        on the compute thread with nothing relayed meanwhile; then every finished column without one gets its
        noise from its live steps. Returns the policy the columns' figures now follow (`live` when the pass did
        not run or was stopped)."""
        used = "live"
        ok = [r for r in results if r.status == "ok" and r.token_ids]
        if self.policy == "quiet" and mode == "fair" and ok and not stop.is_set():
            tokens = min(RETIME_MAX_TOKENS, max(len(r.token_ids) for r in ok))
            yield RunPhase("retiming", f"re-timing {len(ok)} column{'s' if len(ok) > 1 else ''} quietly "
                                       f"(up to {tokens} tokens each, page updates paused)…")
            for _ in compute_iter(quiet_steps(loaded, columns, results, prompt_ids, settings, stop)):
                pass
            used = "live" if stop.is_set() else "quiet"
        for result in results:
            if result.status == "ok" and not result.timing.noise:
                result.timing.noise = timing_noise(result.per_token_s, [])
        return used

    @staticmethod
    def run_record(results: list, used: str, loads: list, threads: int, other_cores: float | None = None) -> dict:
        """The run's timing record (`kvlab.measure.noise.run_timing`), with the quiet figures when `used` is
        `quiet`; `other_cores` as `run_timing` takes it."""
        record = run_timing(results, used, loads, threads, other_cores=other_cores)
        if used == "quiet":
            record.update(quiet_summary(results))
        return record


def for_policy(name: str = DEFAULT_POLICY) -> Measurement:
    """The `Measurement` for timing policy `name` (one of POLICIES).

    Raises:
        ValueError: an unknown policy; the message lists the allowed ones.
    """
    return Measurement(name)
