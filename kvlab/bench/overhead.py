"""Overhead section: tok/s of kvlab's runner (one column, events streamed and consumed) vs bare
`model.generate` with a fresh cache of the same strategy, both on kvlab's compute thread.

`measure_overhead` collects the per-repeat figures; `overhead_rows` and
`overhead_check` turn them into the section's record. A missed target is
explained by the time kvlab spends outside the forward pass and, when
pyinstrument is installed, a profile of the runner's step. This module measures
and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import statistics

from .harness import Context, interleaved, make_check, summarize

from .sides import run_bare, run_kvlab
from .profiling import profile_step
from .strategy_sets import OVERHEAD_STRATEGIES, usable_lineup

OVERHEAD_MIN_RATIO = 0.98
"""kvlab's tok/s over bare generate's must reach this."""
WARM_UP_TOKENS = 1


def bench_overhead(ctx: Context) -> dict:
    """The overhead section's record: one row and one check per strategy (default set or `--strategies`)."""
    lineup, skipped = usable_lineup(ctx, OVERHEAD_STRATEGIES, "overhead")
    data = measure_overhead(ctx, lineup)
    section = {"new_tokens": ctx.size.new_tokens, "prompt_tokens": int(ctx.prompt_ids.shape[1]),
               "unit": "tokens/s end to end (prefill included)",
               "note": "both sides run their forward passes on kvlab's compute thread",
               "rows": [overhead_row(label, data[label]) for label in lineup],
               "checks": [overhead_check(ctx, label, spec, data[label]) for label, spec in lineup.items()]}
    if skipped:
        section["skipped_strategies"] = skipped
    return section


def measure_overhead(ctx: Context, lineup: dict[str, dict]) -> dict[str, dict[str, list[float]]]:
    """label -> {"bare": tok/s, "kvlab": tok/s, "outside": seconds per token kvlab spent outside the forward
    pass}, one value per repeat; bare and kvlab runs alternate which goes first."""
    loaded, ids, n = ctx.loaded, ctx.prompt_ids, ctx.size.new_tokens
    for spec in lineup.values():
        run_bare(loaded, ids, spec, WARM_UP_TOKENS)
        run_kvlab(loaded, ids, [spec], WARM_UP_TOKENS)
    data = {label: {"bare": [], "kvlab": [], "outside": []} for label in lineup}
    for rep in range(ctx.size.repeats):
        for label, spec in lineup.items():
            ctx.say(f"overhead: {label}, repeat {rep + 1}/{ctx.size.repeats}")
            for side in interleaved(rep, ("bare", "kvlab")):
                if side == "bare":
                    data[label]["bare"].append(n / run_bare(loaded, ids, spec, n))
                    continue
                run = run_kvlab(loaded, ids, [spec], n)
                data[label]["kvlab"].append(n / run["elapsed_s"])
                data[label]["outside"].append((run["elapsed_s"] - sum(run["results"][0].per_token_s)) / n)
    return data


def _ratios(figures: dict[str, list[float]]) -> list[float]:
    return [k / b for k, b in zip(figures["kvlab"], figures["bare"])]


def overhead_row(label: str, figures: dict[str, list[float]]) -> dict:
    """One strategy's figures (tok/s, ms per token outside the forward, kvlab/bare ratio) as median/min/max."""
    return {"strategy": label, "bare_tok_s": summarize(figures["bare"]), "kvlab_tok_s": summarize(figures["kvlab"]),
            "kvlab_outside_forward_ms_per_token": summarize([v * 1000 for v in figures["outside"]]),
            "ratio": summarize(_ratios(figures))}


def overhead_check(ctx: Context, label: str, spec: dict, figures: dict[str, list[float]]) -> dict:
    """`label: kvlab / bare tok/s` against OVERHEAD_MIN_RATIO; a miss profiles one kvlab column for its reason."""
    ratios = _ratios(figures)
    outside_ms = statistics.median(figures["outside"]) * 1000
    per_token_ms = 1000 / statistics.median(figures["kvlab"])
    reason = (f"kvlab spends {outside_ms:.2f} ms per token outside the forward pass "
              f"({outside_ms / per_token_ms:.1%} of its time)")
    if statistics.median(ratios) < OVERHEAD_MIN_RATIO:
        ctx.say(f"overhead: {label} missed its target, profiling one kvlab column")
        breakdown = profile_step(ctx.loaded, ctx.prompt_ids, spec, ctx.size.new_tokens, ctx.profile_dir,
                                 f"overhead_{label.replace(' ', '_')}")
        if breakdown:
            reason += f"; the runner's step, profiled: {breakdown}"
    return make_check("overhead", f"{label}: kvlab / bare tok/s", ratios, f"≥ {OVERHEAD_MIN_RATIO}",
                      lambda v: v >= OVERHEAD_MIN_RATIO, reason)
