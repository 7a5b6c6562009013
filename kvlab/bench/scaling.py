"""Scaling section: cache bytes and per-token latency vs context length, one kvlab column per strategy and
length, on plain English filler text.

`measure_scaling` collects the per-repeat figures (a strategy that fails is
recorded with its error and left out of later runs); `scaling_checks` judges the
expected shapes. Each check needs a kind of strategy (no_cache, dynamic, sink,
quantized int4), looked up by what the strategy is; when `--strategies` leaves
it out, the check is reported as not judged, with the reason. This module
measures and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .harness import Context, filler_ids, make_check, median_decode_s, summarize

from .sides import run_kvlab
from .strategy_sets import SCALING_STRATEGIES, find, is_dynamic, is_no_cache, is_quantized_int4, is_sink

NO_CACHE_GROWTH_MIN = 1.5
"""no_cache's latency at the longest length over the shortest must reach this."""
DYNAMIC_VS_NO_CACHE_GROWTH_MAX = 0.5
"""dynamic's latency growth over no_cache's must not exceed this."""
SINK_FLAT_BAND = (0.8, 1.25)
"""sink's latency ratio between two lengths past its window must stay inside this band."""
QUANTIZED_INT4_BYTES_MAX_RATIO = 0.30
"""quantized int4's cache bytes over dynamic's at the longest length must not exceed this."""


def bench_scaling(ctx: Context) -> dict:
    """The scaling section's record: per strategy, latency (ms), cache bytes and TTFT (s) per length."""
    from ..strategies import make_strategy

    lineup = ctx.lineup(SCALING_STRATEGIES)
    lengths = list(ctx.size.lengths)
    new_tokens = {label: ctx.size.scaling_new_tokens if make_strategy(spec).use_cache else ctx.size.no_cache_new_tokens
                  for label, spec in lineup.items()}
    figures = measure_scaling(ctx, lineup, lengths, new_tokens)
    return {"lengths": lengths, "new_tokens": ctx.size.scaling_new_tokens,
            "no_cache_new_tokens": ctx.size.no_cache_new_tokens,
            "series": {label: figures.series(label) for label in lineup},
            "checks": scaling_checks(lineup, figures)}


@dataclass
class ScalingFigures:
    """Per-repeat values: latency (median decode seconds per token), nbytes (cache bytes after the run) and
    ttft (seconds, prefill + first token), each label -> length -> list; errors: label -> why that strategy stopped running."""

    lengths: list[int]
    latency: dict
    nbytes: dict
    ttft: dict
    errors: dict

    def series(self, label: str) -> dict:
        """One strategy's figures as median/min/max per length (None where nothing was measured)."""
        def stats(values: dict, scale: float = 1.0) -> list:
            return [summarize([v * scale for v in values[n]]) if values[n] else None for n in self.lengths]

        series = {"latency_ms": stats(self.latency[label], 1000), "cache_bytes": stats(self.nbytes[label]),
                  "ttft_s": stats(self.ttft[label])}
        if label in self.errors:
            series["error"] = self.errors[label]
        return series

    def growth(self, label: str, first: int, last: int) -> list[float]:
        return [b / a for a, b in zip(self.latency[label][first], self.latency[label][last])]

    def missing(self, label: str) -> str:
        return f"{label} did not run: {self.errors[label]}" if label in self.errors else ""

    def ms(self, label: str, n: int) -> float:
        return statistics.median(self.latency[label][n]) * 1000 if self.latency[label][n] else float("nan")

    def path(self, label: str, first: int, last: int) -> str:
        return (f"{label} {self.ms(label, first):.0f} → {self.ms(label, last):.0f} ms per token from {first} to "
                f"{last} tokens")

    def mib(self, label: str, n: int) -> str:
        return f"{statistics.median(self.nbytes[label][n]) / 2**20:.2f} MiB" if self.nbytes[label][n] else "—"


def measure_scaling(ctx: Context, lineup: dict[str, dict], lengths: list[int], new_tokens: dict[str, int]
                    ) -> ScalingFigures:
    """Run every strategy at every length, `ctx.size.scaling_repeats` times; `new_tokens` per label."""
    prompts = {n: filler_ids(ctx.loaded.tokenizer, n) for n in lengths}

    def empty() -> dict:
        return {label: {n: [] for n in lengths} for label in lineup}

    figures = ScalingFigures(lengths, latency=empty(), nbytes=empty(), ttft=empty(), errors={})
    for rep in range(ctx.size.scaling_repeats):
        for n in lengths:
            ctx.say(f"scaling: {n} tokens, repeat {rep + 1}/{ctx.size.scaling_repeats}")
            for label, spec in lineup.items():
                if label in figures.errors:
                    continue
                try:
                    result = run_kvlab(ctx.loaded, prompts[n], [spec], new_tokens[label])["results"][0]
                except RuntimeError as err:
                    figures.errors[label] = str(err)
                    continue
                figures.latency[label][n].append(median_decode_s(result))
                figures.nbytes[label][n].append(result.cache_bytes[-1])
                figures.ttft[label][n].append(result.ttft_s)
    return figures


def not_judged(name: str, target: str, needs: dict[str, str | None]) -> dict:
    """A check that cannot be judged because a strategy it needs was not measured; `needs` maps what the check
    needs (e.g. `no_cache`) to the label found for it, None where none was found."""
    missing = " and ".join(kind for kind, label in needs.items() if label is None)
    return make_check("scaling", name, [], target, None,
                      f"not judged: needs {missing} among the measured strategies (see --strategies)")


def scaling_checks(lineup: dict[str, dict], figures: ScalingFigures) -> list[dict]:
    """The expected shapes, as checks on the per-repeat values of the strategies found in `lineup`."""
    first, last = figures.lengths[0], figures.lengths[-1]
    no_cache, _ = find(lineup, is_no_cache)
    dynamic, _ = find(lineup, is_dynamic)
    sink, sink_strategy = find(lineup, is_sink)
    int4, _ = find(lineup, is_quantized_int4)
    return [no_cache_check(figures, no_cache, first, last),
            relative_growth_check(figures, dynamic, no_cache, first, last),
            sink_check(figures, sink, sink_strategy),
            int4_bytes_check(figures, int4, dynamic, last)]


def no_cache_check(figures: ScalingFigures, label: str | None, first: int, last: int) -> dict:
    name, target = f"no_cache latency {last}/{first} tokens", f"≥ {NO_CACHE_GROWTH_MIN} (grows with length)"
    if label is None:
        return not_judged(name, target, {"no_cache": label})
    return make_check("scaling", name, figures.growth(label, first, last), target,
                      lambda v: v >= NO_CACHE_GROWTH_MIN,
                      figures.missing(label) or f"{figures.path(label, first, last)}: at these lengths reading the "
                                                f"weights, not the sequence, dominates")


def relative_growth_check(figures: ScalingFigures, dynamic: str | None, no_cache: str | None, first: int,
                          last: int) -> dict:
    name = "dynamic growth / no_cache growth"
    target = f"≤ {DYNAMIC_VS_NO_CACHE_GROWTH_MAX} (grows slowly)"
    if dynamic is None or no_cache is None:
        return not_judged(name, target, {"dynamic": dynamic, "no_cache": no_cache})
    relative = [d / c for d, c in zip(figures.growth(dynamic, first, last), figures.growth(no_cache, first, last))]
    return make_check("scaling", name, relative, target, lambda v: v <= DYNAMIC_VS_NO_CACHE_GROWTH_MAX,
                      figures.missing(dynamic) or figures.missing(no_cache) or
                      f"{figures.path(dynamic, first, last)}; {figures.path(no_cache, first, last)}")


def sink_check(figures: ScalingFigures, label: str | None, strategy) -> dict:
    low, high = SINK_FLAT_BAND
    if label is None:
        return not_judged("sink latency flat after its window", "flat after its window", {"a sink strategy": label})
    window = strategy.window_length
    past = [n for n in figures.lengths if n >= window]
    if len(past) < 2:
        return make_check("scaling", "sink latency flat after its window", [], "flat after its window", None,
                          f"not judged at this size: needs two lengths ≥ the window ({window})")
    flat = figures.growth(label, past[0], past[-1])
    return make_check("scaling", f"sink latency {past[-1]}/{past[0]} tokens", flat,
                      f"{low}–{high} (flat after its window)", lambda v: low <= v <= high,
                      figures.missing(label) or f"{label} {figures.ms(label, past[0]):.0f} → "
                                                f"{figures.ms(label, past[-1]):.0f} ms per token from {past[0]} to "
                                                f"{past[-1]} tokens")


def int4_bytes_check(figures: ScalingFigures, int4: str | None, dynamic: str | None, last: int) -> dict:
    name = f"quantized int4 / dynamic bytes at {last} tokens"
    target = f"≤ {QUANTIZED_INT4_BYTES_MAX_RATIO} (≈ ¼)"
    if int4 is None or dynamic is None:
        return not_judged(name, target, {"dynamic": dynamic, "a quantized int4 strategy": int4})
    ratios = [q / d for q, d in zip(figures.nbytes[int4][last], figures.nbytes[dynamic][last])]
    return make_check("scaling", name, ratios, target, lambda v: v <= QUANTIZED_INT4_BYTES_MAX_RATIO,
                      figures.missing(int4) or figures.missing(dynamic) or
                      f"int4 {figures.mib(int4, last)} vs dynamic {figures.mib(dynamic, last)} at {last} tokens; the "
                      f"newest residual_length tokens stay in full precision")
