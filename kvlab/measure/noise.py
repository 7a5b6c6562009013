"""Noise and the busy note: each timing figure's relative noise from the step times themselves (which
`kvlab.compare.summary.best_sets` uses to call two columns tied), and the run's timing record with the note the page
shows when the machine was too busy for a fair comparison.

This module judges figures already measured; it runs no model.
"""

from __future__ import annotations

import math
import statistics

from .environment import cores_available, load_average

NOISE_FLOOR = 0.01
"""No figure is taken to be more precise than this fraction (fair mode agrees with a column alone to ~1 %)."""
BUSY_EXCESS_PER_CORE = 0.5
"""Busy: other processes took more than this many cores per core while the run was timed (`OtherWork`); where
that cannot be measured, the 1-minute load average exceeded this run's own torch threads by more than this."""
BUSY_STEP_NOISE = 0.15
"""Busy: the median column's decode steps vary by more than this fraction (`robust_step_noise`); other
processes competing for the cores make the steps vary (docs/timing.md gives the readings behind it)."""
MIN_JUDGED_STEPS = 8
"""A column with fewer decode steps than this is not judged for noise (too few to tell a hiccup from a trend)."""


def step_noise(steps: list[float]) -> float | None:
    """Relative noise of one step's time (a fraction): the spread of successive differences (von Neumann's
    estimator), so a steady trend such as no_cache's growing steps is not counted as noise. None for fewer
    than 3 steps."""
    if len(steps) < 3 or sum(steps) <= 0:
        return None
    squares = [(b - a) ** 2 for a, b in zip(steps, steps[1:])]
    return math.sqrt(sum(squares) / (2 * len(squares))) / statistics.mean(steps)


def robust_step_noise(steps: list[float]) -> float | None:
    """Relative noise of one step's time (a fraction) that isolated hiccups (a garbage collection, one page
    update) do not dominate: the median absolute successive difference, scaled to a standard deviation for
    Gaussian noise (× 1.4826 / √2), over the median step. Like `step_noise` it ignores a steady trend. None for
    fewer than MIN_JUDGED_STEPS steps."""
    if len(steps) < MIN_JUDGED_STEPS or statistics.median(steps) <= 0:
        return None
    differences = [abs(b - a) for a, b in zip(steps, steps[1:])]
    return 1.4826 * statistics.median(differences) / math.sqrt(2) / statistics.median(steps)


def timing_noise(per_token_s: list[float], ttft_samples_s: list[float]) -> dict[str, float]:
    """Relative noise (fractions, at least NOISE_FLOOR) of each timing figure of a column: decode tok/s and ITL
    p50 from the standard error of the mean decode step, ITL p99 and a single TTFT from one step's noise, a
    repeated TTFT from the half-range of its samples. Figures it cannot judge are left out."""
    decode = per_token_s[1:]
    step = step_noise(decode)
    noise: dict[str, float] = {}
    if step is not None:
        mean_error = step / math.sqrt(len(decode))
        noise.update(decode_tok_s=max(NOISE_FLOOR, mean_error), itl_ms_p50=max(NOISE_FLOOR, 1.25 * mean_error),
                     itl_ms_p99=max(NOISE_FLOOR, step))
    samples = [s for s in ttft_samples_s if s]
    if len(samples) >= 2:
        noise["ttft_s"] = max(NOISE_FLOOR, (max(samples) - min(samples)) / 2 / statistics.median(samples))
    elif step is not None:
        noise["ttft_s"] = max(NOISE_FLOOR, step)
    return noise


def sample_load() -> float | None:
    """The 1-minute load average now, or None where the platform has none."""
    loads = load_average()
    return loads[0] if loads else None


def busy_reasons(load: float | None, noise: float | None, threads: int, cores: int,
                 other_cores: float | None = None) -> list[str]:
    """Why the machine was too busy for a fair comparison ([] when it was not): other processes taking more
    than BUSY_EXCESS_PER_CORE cores per core during the run (`other_cores`, from
    `kvlab.measure.environment.OtherWork`; when it is None, a `load` average beyond this run's own `threads` by
    more than that), or the median column's `robust_step_noise` above BUSY_STEP_NOISE."""
    reasons = []
    if other_cores is not None:
        if other_cores > BUSY_EXCESS_PER_CORE * cores:
            reasons.append(f"other processes took {other_cores:.1f} of {cores} cores during the run")
    elif load is not None and load - threads > BUSY_EXCESS_PER_CORE * cores:
        reasons.append(f"load average {load:.1f} on {cores} cores, this run's own {threads} threads included")
    if noise is not None and noise > BUSY_STEP_NOISE:
        reasons.append(f"decode steps varied by ±{100 * noise:.0f}% within a column")
    return reasons


def run_timing(results: list, policy: str, loads: list, threads: int, cores: int | None = None,
               other_cores: float | None = None) -> dict:
    """The run's timing record (the `timing` of `RunDone` and of the JSON record).

    Args:
        results: the run's `ColumnResult`s. policy: the policy whose figures the columns carry (`live`, or
        `quiet` when the re-timing pass ran to its end).
        loads: 1-minute load averages sampled during the run (None entries where the platform has none).
        threads: torch intra-op threads this run's forwards used (its own share of the load).
        cores: CPU cores this process may use (default: `kvlab.measure.environment.cores_available()`).
        other_cores: cores other processes took while the run was timed (`OtherWork.cores()`; None: not
            measured, the load average is judged instead).

    Returns {policy, load_average, other_cores, cores, torch_threads, decode_noise, step_noise, warm_up_s, busy,
    note}, plus the policy's own figures (`quiet`: max_tokens, live_vs_quiet, replaced_steps; see
    `kvlab.compare.quiet`):
    decode_noise is the median column's relative noise of its decode tok/s (what ties are judged by),
    step_noise the median column's `robust_step_noise` (what busy is judged by; None when no column had
    MIN_JUDGED_STEPS steps), warm_up_s the one-time set-up this run did (seconds),
    note the sentence the page shows ('' when not busy).
    """
    cores = cores or cores_available()
    load = max((value for value in loads if value is not None), default=None)
    ok = [r for r in results if r is not None and r.status == "ok"]
    noises = [r.timing.noise["decode_tok_s"] for r in ok if "decode_tok_s" in r.timing.noise]
    noise = statistics.median(noises) if noises else None
    steps = [robust_step_noise((r.timing.per_token_s if r.timing.policy == "quiet" and r.timing.per_token_s
                                else r.per_token_s)[1:]) for r in ok]
    judged = [value for value in steps if value is not None]
    step_noise_value = statistics.median(judged) if judged else None
    reasons = busy_reasons(load, step_noise_value, threads, cores, other_cores)
    note = ""
    if reasons:
        note = (f"⚠ the machine was too busy for a fair comparison ({'; '.join(reasons)}): differences within "
                "the noise are marked as ties, others may still come from other work; run again when it is quieter")
    return {"policy": policy, "load_average": load, "other_cores": other_cores, "cores": cores,
            "torch_threads": threads, "decode_noise": noise, "step_noise": step_noise_value,
            "warm_up_s": sum(r.timing.warm_up_s or 0.0 for r in ok),
            "busy": bool(reasons), "note": note}
