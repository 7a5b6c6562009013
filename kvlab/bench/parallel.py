"""Parallel section: wall time of the fair set's columns in parallel mode vs the same columns sequentially,
and, as a reference without kvlab, the same number of bare dynamic `generate` calls at once (one torch thread
each) vs one after another.

It always measures the default fair set (`--strategies` does not change it): the
comparison is about threads, not strategies. `measure_parallel` collects the
figures; `parallel_section` builds the record, its check and its reason (cores,
thread shares, the bare reference). This module measures and builds the record;
it prints and draws nothing.
"""

from __future__ import annotations

import statistics

from ..compute import compute
from ..measure.environment import cores_available
from .harness import Context, interleaved, make_check, summarize
from .sides import run_bare, run_bare_together, run_kvlab
from .strategy_sets import FAIR_STRATEGIES

PARALLEL_MAX_RATIO = 0.70
"""Parallel / sequential wall time must not exceed this."""
WARM_UP_TOKENS = 2
ONE_BY_ONE = "bare, one after another"
AT_ONCE = "bare, at once, 1 torch thread each"
REFERENCE_SPEC = {"strategy": "dynamic"}


def bench_parallel(ctx: Context) -> dict:
    """The parallel section's record: wall times, cores busy, the bare reference and two checks."""
    import torch

    from ..compare.runner import parallel_threads

    specs = list(FAIR_STRATEGIES.values())
    elapsed, cores, lever = measure_parallel(ctx, specs)
    threads = compute(torch.get_num_threads)
    return parallel_section(ctx.size.new_tokens, len(specs), elapsed, cores, lever, threads,
                            parallel_threads(len(specs), threads))


def measure_parallel(ctx: Context, specs: list[dict]) -> tuple[dict, dict, dict]:
    """(elapsed, cores, lever), one value per repeat: elapsed[mode] wall seconds and cores[mode] process CPU
    seconds per wall second for mode parallel/sequential; lever[ONE_BY_ONE | AT_ONCE] wall seconds of the
    bare reference."""
    loaded, ids, n = ctx.loaded, ctx.prompt_ids, ctx.size.new_tokens
    columns = len(specs)
    run_kvlab(loaded, ids, specs, WARM_UP_TOKENS, "parallel")
    elapsed = {"parallel": [], "sequential": []}
    cores = {"parallel": [], "sequential": []}
    lever = {ONE_BY_ONE: [], AT_ONCE: []}
    for rep in range(ctx.size.repeats):
        ctx.say(f"parallel: repeat {rep + 1}/{ctx.size.repeats}")
        for mode in interleaved(rep, ("parallel", "sequential")):
            run = run_kvlab(loaded, ids, specs, n, mode)
            elapsed[mode].append(run["elapsed_s"])
            cores[mode].append(run["cpu_s"] / run["elapsed_s"])
        for name in interleaved(rep, list(lever)):
            if name == ONE_BY_ONE:
                lever[name].append(sum(run_bare(loaded, ids, REFERENCE_SPEC, n) for _ in range(columns)))
            else:
                lever[name].append(run_bare_together(loaded, ids, REFERENCE_SPEC, n, columns, torch_threads=1))
    return elapsed, cores, lever


def parallel_section(new_tokens: int, columns: int, elapsed: dict, cores: dict, lever: dict, threads: int,
                     share: int) -> dict:
    """The record: rows per mode, the lever figures, ratios and the two checks. `threads` is the compute
    thread's torch thread count, `share` what each parallel column got."""
    ratios = [p / s for p, s in zip(elapsed["parallel"], elapsed["sequential"])]
    lever_ratios = [together / one_by_one for one_by_one, together in zip(lever[ONE_BY_ONE], lever[AT_ONCE])]
    reference = statistics.median(lever_ratios)
    verdict = ("so free threads miss the target on this machine even without kvlab" if reference > PARALLEL_MAX_RATIO
               else "the bare calls do reach it, so the gap is kvlab's")
    reason = (f"{cores_available()} cores; each parallel column and the compute thread got {share} of "
              f"{threads} torch threads (process CPU use: "
              f"{statistics.median(cores['parallel']):.2f} cores in parallel, "
              f"{statistics.median(cores['sequential']):.2f} sequentially, OpenMP spin-waiting included). Reference "
              f"without kvlab: {columns} bare dynamic generate calls at once, one torch thread each, took "
              f"{reference:.2f} of the time of the same calls one after another, {verdict}")
    check = make_check("parallel", "parallel / sequential wall time", ratios, f"≤ {PARALLEL_MAX_RATIO}",
                       lambda v: v <= PARALLEL_MAX_RATIO, reason)
    lever_check = make_check("parallel", f"reference: {columns} bare generates at once (1 thread each) / one after "
                             f"another", lever_ratios, "—", None)
    return {"new_tokens": new_tokens, "columns": list(FAIR_STRATEGIES), "target": PARALLEL_MAX_RATIO,
            "rows": [{"mode": mode, "elapsed_s": summarize(elapsed[mode]), "cores_busy": summarize(cores[mode])}
                     for mode in elapsed],
            "lever": {name: summarize(values) for name, values in lever.items()},
            "ratio": summarize(ratios), "lever_ratio": summarize(lever_ratios), "checks": [check, lever_check]}
