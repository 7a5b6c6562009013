"""Plan section: how long the Plan tab's planner takes for four catalog models, and how much memory it adds.

As the app does after start, the section first runs the planner's warm-up
(`kvlab.plan.planner.warm_up`: a plan of another catalog model with every strategy),
then times plans with `PLAN_STRATEGIES` (6) under a `PLAN_BUDGET_GIB` budget on
kvlab's compute thread as the tab runs them: the first plan of each of
`PLAN_MODELS` at `PLAN_CONTEXTS` (5, 1k-128k; its architecture is probed on the
meta device then and every strategy measured), then a plan of each at
`OTHER_CONTEXTS` (the kept measurements, `kvlab.plan.measured`, serve the
contexts seen before; the new ones are measured) and at `PLAN_CONTEXTS` again
(all read back: what the app's page gets for a catalog model, which the app
plans once after start), then `repeats - 1` more plans of `PLAN_MODEL` at
`PLAN_CONTEXTS`.

Memory is the kernel's resident-set high-water mark (`VmHWM` in
/proc/self/status), reset to the current RSS by writing 5 to
/proc/self/clear_refs just before the warm-up and again before the timed
plans: exact, since the kernel updates it on every page it maps, where sampling
RSS from a thread misses peaks shorter than its interval (and waits for the GIL)
and tracemalloc sees Python's allocations but not torch's. Peak extra RSS is that
high-water mark minus the RSS at the reset. What earlier sections of the same run
already imported (quanto, hqq) is not counted again. Where /proc cannot be read
or written, the memory check is n/a with the reason. This module measures and
builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

from ..compute import compute
from .harness import Context, make_check, summarize

PLAN_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLAN_STRATEGIES = ({"strategy": "dynamic"}, {"strategy": "static"},
                   {"strategy": "quantized", "backend": "quanto", "nbits": 4},
                   {"strategy": "quantized", "backend": "hqq", "nbits": 4},
                   {"strategy": "sink", "window_length": 1024}, {"strategy": "offloaded"})
PLAN_CONTEXTS = (1024, 4096, 16384, 65536, 131072)
PLAN_MODELS = (PLAN_MODEL, "Qwen/Qwen3-8B", "google/gemma-3-27b-it", "mistralai/Mistral-7B-Instruct-v0.3")
"""Four public catalog models: two grouped-query Llama-style models, one with sliding layers (Gemma 3), one more."""
OTHER_CONTEXTS = (2048, 8192, 32768, 100_000, 131072)
"""A second context list, mostly new contexts, planned after each model's first plan."""
PLAN_BUDGET_GIB = 24
PLAN_TARGET_S = 2.0
"""Seconds one plan may take after the app is up (issue #14)."""
EXTRA_RSS_TARGET_MB = 300.0
"""MB (10^6 bytes) of resident memory the planner may add (issue #14)."""
MB = 1_000_000
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK = "5"
"""Written to /proc/self/clear_refs: reset the peak RSS to the current RSS (Linux 4.0 and later)."""


class PeakRss:
    """The kernel's RSS high-water mark of this process, reset on demand. `error` says why it is unavailable."""

    def __init__(self):
        self.error = ""
        try:
            self._read("VmHWM")
            CLEAR_REFS.write_text(RESET_PEAK)
        except (OSError, ValueError) as err:
            self.error = f"the kernel's peak RSS cannot be read and reset here ({err})"

    @staticmethod
    def _read(field: str) -> int:
        match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
        if match is None:
            raise ValueError(f"{STATUS} has no {field}")
        return int(match.group(1)) * 1024

    def reset(self) -> int:
        """Reset the high-water mark to the current RSS; returns that RSS in bytes."""
        CLEAR_REFS.write_text(RESET_PEAK)
        return self._read("VmRSS")

    def peak(self) -> int:
        """The highest RSS since the last reset, bytes."""
        return self._read("VmHWM")


def _plan_request(model: str = PLAN_MODEL, contexts: tuple[int, ...] = PLAN_CONTEXTS):
    from ..plan.planner import GIB, PlanRequest

    return PlanRequest(model=model, contexts=contexts, dtype="bfloat16", strategies=PLAN_STRATEGIES,
                       budget_bytes=PLAN_BUDGET_GIB * GIB)


def _timed(fn, *args) -> float:
    """Wall seconds of `fn(*args)` on the compute thread (where the Plan tab runs it), the hop included."""
    started = time.perf_counter()
    compute(fn, *args)
    return time.perf_counter() - started


def measure_planning(ctx: Context) -> dict:
    """{warm_up_s, plan_s: [seconds per plan of PLAN_MODEL at PLAN_CONTEXTS, its first plan first], models:
    {model: {first_s, other_contexts_s, again_s}}, rss_*} (RSS in bytes; None where unavailable)."""
    from ..plan.planner import plan, warm_up

    memory = PeakRss()
    figures = {"rss_before_bytes": None, "rss_peak_warm_up_bytes": None, "rss_after_warm_up_bytes": None,
               "rss_peak_plans_bytes": None, "memory_error": memory.error}
    # 1. The warm-up the app runs after start.
    if not memory.error:
        figures["rss_before_bytes"] = memory.reset()
    ctx.say("plan: warming the planner up")
    figures["warm_up_s"] = _timed(warm_up)
    # 2. The timed plans, the peak RSS watched from a fresh reset.
    if not memory.error:
        figures["rss_peak_warm_up_bytes"] = memory.peak()
        figures["rss_after_warm_up_bytes"] = memory.reset()
    figures["models"] = {model: {} for model in PLAN_MODELS}
    for model in PLAN_MODELS:
        ctx.say(f"plan: {model}, first plan")
        figures["models"][model]["first_s"] = _timed(plan, _plan_request(model))
    for model in PLAN_MODELS:
        ctx.say(f"plan: {model}, other contexts, then the first contexts again")
        figures["models"][model]["other_contexts_s"] = _timed(plan, _plan_request(model, OTHER_CONTEXTS))
        figures["models"][model]["again_s"] = _timed(plan, _plan_request(model))
    figures["plan_s"] = [figures["models"][PLAN_MODEL]["first_s"]]
    for rep in range(1, ctx.size.repeats):
        ctx.say(f"plan: {PLAN_MODEL}, repeat {rep + 1}/{ctx.size.repeats}")
        figures["plan_s"].append(_timed(plan, _plan_request()))
    if not memory.error:
        figures["rss_peak_plans_bytes"] = memory.peak()
    return figures


def bench_planning(ctx: Context) -> dict:
    """The plan section's record: the figures and the checks (PLAN_MODEL's first plan and later plans, the
    models' first plans, their other contexts and repeats, peak extra RSS)."""
    figures = measure_planning(ctx)
    label = f"{PLAN_MODEL.split('/')[-1]}, {len(PLAN_STRATEGIES)} strategies × {len(PLAN_CONTEXTS)} contexts"
    first, later = figures["plan_s"][0], figures["plan_s"][1:]
    section = {"model": PLAN_MODEL, "strategies": list(PLAN_STRATEGIES), "contexts": list(PLAN_CONTEXTS),
               "other_contexts": list(OTHER_CONTEXTS), "models": figures["models"],
               "budget_gib": PLAN_BUDGET_GIB, "target_s": PLAN_TARGET_S, "warm_up_s": figures["warm_up_s"],
               "first_plan_s": first,
               "plan_s": summarize(figures["plan_s"]), "later_plan_s": summarize(later) if later else None,
               "memory_method": "kernel RSS high-water mark (VmHWM), reset through /proc/self/clear_refs",
               **{key: value for key, value in figures.items() if key.startswith("rss_")}}
    reason = f"{first:.2f} s for the model's first plan; warm-up {figures['warm_up_s']:.1f} s"
    checks = [make_check("plan", f"{label}: first plan after warm-up", [first], f"≤ {PLAN_TARGET_S} s",
                         lambda v: v <= PLAN_TARGET_S, reason, unit="s")]
    if later:
        checks.append(make_check("plan", f"{label}: later plans", later, f"≤ {PLAN_TARGET_S} s",
                                 lambda v: v <= PLAN_TARGET_S, f"median {statistics.median(later):.2f} s", unit="s"))
    checks.append(_models_check(figures["models"], ("first_s",),
                                "first plan (cold: the command line, a model the app did not plan at start)"))
    checks.append(_models_check(figures["models"], ("other_contexts_s", "again_s"),
                                "other contexts and the first again (the app, after its start-up plans)"))
    checks.append(_memory_check(section, figures["memory_error"]))
    section["checks"] = checks
    return section


def _models_check(models: dict[str, dict], keys: tuple[str, ...], what: str) -> dict:
    """The slowest of `keys`' seconds over PLAN_MODELS against PLAN_TARGET_S, the model that took it named."""
    times = {(model, key): figures[key] for model, figures in models.items() for key in keys}
    (model, _), slowest = max(times.items(), key=lambda item: item[1])
    return make_check("plan", f"{len(models)} catalog models, {what}: slowest", list(times.values()),
                      f"≤ {PLAN_TARGET_S} s", lambda v: v <= PLAN_TARGET_S, f"{model}: {slowest:.2f} s",
                      value=slowest, unit="s")


def _memory_check(section: dict, error: str) -> dict:
    """Peak RSS above the RSS before the warm-up, over the warm-up and the plans, MB; n/a without /proc."""
    name = "peak extra RSS, warm-up and plans (MB)"
    if error:
        return make_check("plan", name, [], f"≤ {EXTRA_RSS_TARGET_MB:.0f} MB", None, error, unit="MB")
    before = section["rss_before_bytes"]
    extra = max(section["rss_peak_warm_up_bytes"], section["rss_peak_plans_bytes"]) - before
    plans_only = section["rss_peak_plans_bytes"] - section["rss_after_warm_up_bytes"]
    section["rss_peak_extra_bytes"], section["rss_peak_extra_plans_only_bytes"] = extra, plans_only
    reason = (f"{extra / MB:.0f} MB above the RSS before the warm-up; the timed plans alone peaked "
              f"{plans_only / MB:.0f} MB above the RSS after it")
    return make_check("plan", name, [extra / MB], f"≤ {EXTRA_RSS_TARGET_MB:.0f} MB",
                      lambda v: v <= EXTRA_RSS_TARGET_MB, reason, unit="MB")
