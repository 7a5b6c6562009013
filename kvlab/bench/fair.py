"""Fair section: each strategy's median per-token latency when the set runs together in fair mode, over
its latency run alone (fair mode takes turns one forward at a time, so the ratio should stay near 1).

`measure_fair` collects the per-repeat latencies and process CPU use;
`fair_section` builds the record and its checks. Together and alone runs
alternate which goes first, and the alone runs rotate their order. This module
measures and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import statistics

from .harness import Context, interleaved, make_check, median_decode_s, rotated, spread, summarize

from .sides import run_kvlab
from .strategy_sets import FAIR_STRATEGIES, usable_lineup

FAIR_BAND = (0.95, 1.05)
"""Together / alone latency must stay inside this band."""
WARM_UP_TOKENS = 2


def bench_fair(ctx: Context) -> dict:
    """The fair section's record: one row and one check per strategy (default set or `--strategies`)."""
    lineup, skipped = usable_lineup(ctx, FAIR_STRATEGIES, "fair")
    together, alone, cores = measure_fair(ctx, lineup)
    section = fair_section(ctx.size.new_tokens, list(lineup), together, alone, cores)
    if skipped:
        section["skipped_strategies"] = skipped
    return section


def measure_fair(ctx: Context, lineup: dict[str, dict]) -> tuple[dict, dict, dict]:
    """(together, alone, cores): label -> median decode seconds per token, one per repeat, run together in
    fair mode and alone; cores: "together"/"alone" -> process CPU seconds per wall second of each run."""
    loaded, ids, n = ctx.loaded, ctx.prompt_ids, ctx.size.new_tokens
    labels, specs = list(lineup), list(lineup.values())
    run_kvlab(loaded, ids, specs, WARM_UP_TOKENS)
    together = {label: [] for label in labels}
    alone = {label: [] for label in labels}
    cores = {"together": [], "alone": []}

    def run_together(rep: int) -> None:
        run = run_kvlab(loaded, ids, specs, n, "fair")
        cores["together"].append(run["cpu_s"] / run["elapsed_s"])
        for label, result in zip(labels, run["results"]):
            together[label].append(median_decode_s(result))

    def run_alone(rep: int) -> None:
        for label in rotated(labels, rep):
            run = run_kvlab(loaded, ids, [lineup[label]], n, "fair")
            cores["alone"].append(run["cpu_s"] / run["elapsed_s"])
            alone[label].append(median_decode_s(run["results"][0]))

    for rep in range(ctx.size.repeats):
        ctx.say(f"fair: repeat {rep + 1}/{ctx.size.repeats}")
        for step in interleaved(rep, (run_together, run_alone)):
            step(rep)
    return together, alone, cores


def fair_section(new_tokens: int, labels: list[str], together: dict, alone: dict, cores: dict) -> dict:
    """Rows (latencies in ms, ratio) and one check per label; a miss is explained by the spread of the alone
    runs (machine noise) or by the cores the process kept busy."""
    low, high = FAIR_BAND
    used = {k: statistics.median(v) for k, v in cores.items()}
    rows, checks = [], []
    for label in labels:
        ratios = [t / a for t, a in zip(together[label], alone[label])]
        rows.append({"strategy": label, "together_ms": summarize([v * 1000 for v in together[label]]),
                     "alone_ms": summarize([v * 1000 for v in alone[label]]), "ratio": summarize(ratios)})
        noise = spread(alone[label])
        reason = (f"together {statistics.median(together[label]) * 1000:.1f} ms vs alone "
                  f"{statistics.median(alone[label]) * 1000:.1f} ms per token; ")
        if noise > high - low:
            reason += (f"run alone, this column's latency spread {noise:.0%} between repeats, wider than the "
                       f"{high - low:.0%} band: machine noise, not the runner, decides this ratio")
        else:
            reason += (f"the process kept {used['together']:.2f} cores busy together vs {used['alone']:.2f} alone: "
                       f"other columns' per-token work (accounting, detokenizing, events) runs beside the timed forward")
        checks.append(make_check("fair", f"{label}: together / alone latency", ratios, f"{low}–{high}",
                                 lambda v: low <= v <= high, reason))
    return {"new_tokens": new_tokens, "band": list(FAIR_BAND), "rows": rows, "cores_busy": used, "checks": checks}
