"""The `quiet` policy's re-timing pass: after the live columns, each finished column is run again on its own
live token ids (teacher-forced, so the tokens and the cache contents are the same), over its first
`RETIME_MAX_TOKENS` tokens, one step per column in turn, with no page updates and no memory sampling in
between. Its prefill is timed `TTFT_REPEATS` times (fresh caches) and the median kept. A decode step more than
`SPIKE_RATIO` times the fastest of its `SPIKE_WINDOW` neighbours on each side is timed again (`spike_steps`):
the column is replayed once more up to its last such step, and a step that is not slow the second time was an
interruption (another process, the garbage collector) and takes its second time; one slow both times is the
strategy's own work (a quantized cache flushing its residual) and stays. These figures replace the live ones
in the summary; the live ones are kept in `ColumnTiming.live`.

This module re-times and applies the figures; it does not stream events or render.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..engine import Decoder
from ..measure.noise import timing_noise
from ..measure.record import LIVE_FIGURES

RETIME_MAX_TOKENS = 64
"""The quiet pass re-times at most this many tokens per column (the first ones)."""
TTFT_REPEATS = 3
"""Prefills timed per column in the quiet pass; the median is the TTFT shown."""
SPIKE_RATIO = 1.5
"""A decode step slower than this many times the fastest of its neighbours is timed again in the quiet pass."""
SPIKE_WINDOW = 8
"""Neighbours on each side of a decode step whose fastest it is judged against."""


@dataclass
class _QuietRun:
    """One column's quiet re-timing: its decoder, the switches to replay (token index -> spec), its times."""

    result: object
    strategy: object
    prompt_ids: object
    settings: object
    max_total: int
    forced: list[int]
    switches: dict[int, dict]
    decoder: Decoder | None = None
    times: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    failed: str = ""
    spikes: dict[int, float] = field(default_factory=dict)
    """Step index -> the fastest neighbour it was judged against, for the steps timed again."""
    first_times: list[float] = field(default_factory=list)
    """The first timing of every step, while the column is replayed to time its spikes again."""

    def start_recheck(self) -> bool:
        """Find this column's spikes; when there are any, keep its times in `first_times` and start a fresh
        replay (the next `step` calls time it again, up to the last spike). Returns whether it has any."""
        self.spikes = spike_steps(self.times)
        if not self.spikes:
            return False
        self.first_times, self.times, self.decoder = self.times, [], None
        return True

    def rechecking(self) -> bool:
        """Whether the replay still has to reach the column's last spike."""
        return bool(self.spikes) and not self.failed and len(self.times) <= max(self.spikes)

    def finish_recheck(self) -> list[int]:
        """Put the first timings back, each spike that was not slow the second time replaced by its second
        timing; returns the indices replaced. A replay that failed replaces nothing, and the column keeps its
        first timings (its failure is forgotten)."""
        if not self.spikes:
            return []
        second, self.times = self.times, self.first_times
        if self.failed:
            self.failed = ""
            return []
        replaced = sorted(i for i, fastest in self.spikes.items()
                          if i < len(second) and second[i] <= SPIKE_RATIO * fastest)
        for i in replaced:
            self.times[i] = second[i]
        return replaced

    def prefill_s(self, loaded) -> float:
        """One extra prefill on a fresh cache, seconds (the first token forced)."""
        cache = self.strategy.build_cache(loaded, self.max_total)
        decoder = Decoder(loaded, self.strategy, cache, self.prompt_ids, self.settings, forced_ids=self.forced[:1])
        return next(decoder).per_token_s

    def step(self, loaded) -> bool:
        """Run the next quiet step; False when the run is over (or failed, with `failed` saying why)."""
        from ..strategies import make_strategy

        try:
            if self.decoder is None:
                cache = self.strategy.build_cache(loaded, self.max_total)
                self.decoder = Decoder(loaded, self.strategy, cache, self.prompt_ids, self.settings,
                                       forced_ids=self.forced)
            at = len(self.decoder.token_ids)
            if at in self.switches and at < len(self.forced):
                new = make_strategy(self.switches[at])
                self.decoder.replace_cache(new, new.build_cache(loaded, self.max_total))
            step = next(self.decoder, None)
        except Exception as err:  # noqa: BLE001 - the column keeps its live figures
            self.failed = f"{type(err).__name__}: {err}"
            return False
        if step is None:
            return False
        self.times.append(step.per_token_s)
        return True


def quiet_runs(columns: list, results: list, prompt_ids, settings) -> list[_QuietRun]:
    """A `_QuietRun` for every column that finished ok with at least one token (budget switches replayed at the
    token they happened)."""
    runs = []
    for column, result in zip(columns, results):
        if column.strategy is None or column.strategy.engine_name or result is None or result.status != "ok" \
                or not result.token_ids:
            continue  # an engine column keeps its live figures
        run_settings = settings.with_overrides(column.overrides)
        forced = list(result.token_ids[:RETIME_MAX_TOKENS])
        switches = {f["at_token"]: f["to_spec"] for f in result.fallbacks if f.get("to_spec")}
        runs.append(_QuietRun(result, column.strategy, prompt_ids, dataclasses.replace(run_settings, stop_at_eos=False),
                              prompt_ids.shape[1] + run_settings.max_new_tokens, forced, switches))
    return runs


def quiet_steps(loaded, columns: list, results: list, prompt_ids, settings, stop: threading.Event) -> Iterator[int]:
    """The quiet re-timing pass, one timed step per `next()` (run each on kvlab's compute thread with
    `kvlab.compute.compute_iter`); yields the index of the column that just stepped.

    First `TTFT_REPEATS - 1` extra prefills per column, then every column's steps in turns, then the columns
    with spikes (`spike_steps`) replayed in turns up to their last spike, each spike that is not slow again
    taking its second timing (`ColumnTiming.replaced_steps`). When every column is done, each result gets its
    quiet figures (`apply_quiet`) and noise; a column whose quiet run failed keeps its live figures and says
    why in its message. Nothing is applied when `stop` is set before the end.
    """
    runs = quiet_runs(columns, results, prompt_ids, settings)
    yield from _ttft_repeats(loaded, runs, stop)
    if stop.is_set():
        return
    yield from _in_turns(loaded, [run for run in runs if not run.failed], stop, lambda run: True)
    if stop.is_set():
        return
    rechecks = [run for run in runs if not run.failed and run.start_recheck()]
    yield from _in_turns(loaded, rechecks, stop, _QuietRun.rechecking)
    if stop.is_set():
        return
    for run in rechecks:
        run.result.timing.replaced_steps = run.finish_recheck()
    for run in runs:
        _apply(run)


def _ttft_repeats(loaded, runs: list[_QuietRun], stop: threading.Event) -> Iterator[int]:
    """`TTFT_REPEATS - 1` extra prefills per column, in turns; yields each column's index after its prefill."""
    for _ in range(TTFT_REPEATS - 1):
        for run in runs:
            if stop.is_set():
                return
            if not run.failed:
                try:
                    run.ttft.append(run.prefill_s(loaded))
                except Exception as err:  # noqa: BLE001 - the column keeps its live figures
                    run.failed = f"{type(err).__name__}: {err}"
            yield run.result.index


def _in_turns(loaded, runs: list[_QuietRun], stop: threading.Event, going) -> Iterator[int]:
    """One step of each run in turn while `going(run)` and its decoder has steps left; yields the index of the
    column that just stepped."""
    active = list(runs)
    while active:
        for run in list(active):
            if stop.is_set():
                return
            if not going(run) or not run.step(loaded):
                active.remove(run)
                continue
            yield run.result.index


def spike_steps(times: list[float], ratio: float = SPIKE_RATIO, window: int = SPIKE_WINDOW) -> dict[int, float]:
    """The decode steps of `times` (seconds per step, index 0 the prefill, never judged) slower than `ratio`
    times the fastest of the up to `window` decode steps on each side (at least 2 neighbours needed): step
    index -> that fastest neighbour, in seconds. The fastest of a window, not its median, so a stall of
    several steps in a row is found too (up to `window` - 1 steps long); a cost that grows slowly with the
    sequence (no_cache) is no spike."""
    spikes = {}
    for i in range(1, len(times)):
        neighbours = times[max(1, i - window):i] + times[i + 1:i + 1 + window]
        if len(neighbours) >= 2:
            fastest = min(neighbours)
            if times[i] > ratio * fastest:
                spikes[i] = fastest
    return spikes


def apply_quiet(result, per_token_s: list[float], ttft_samples_s: list[float]) -> None:
    """Make the re-timing's figures `result`'s (a `ColumnResult`): the live ones move to `timing.live`, then
    TTFT (the median of `ttft_samples_s`, seconds), decode tok/s, ITL and e2e latency come from `per_token_s`
    (seconds per step, the first being the prefill); `timing.policy` becomes `quiet`."""
    timing = result.timing
    timing.live = {name: getattr(result, name) for name in LIVE_FIGURES}
    timing.per_token_s, timing.ttft_samples_s = list(per_token_s), list(ttft_samples_s)
    result.fill_timing(per_token_s)
    result.ttft_s = statistics.median(ttft_samples_s) if ttft_samples_s else (per_token_s[0] if per_token_s
                                                                               else None)
    timing.policy = "quiet"


def _apply(run: _QuietRun) -> None:
    result = run.result
    if run.failed or len(run.times) != len(run.forced):
        reason = run.failed or f"it made {len(run.times)} of {len(run.forced)} steps"
        result.message = "; ".join(filter(None, [result.message, f"quiet re-timing failed ({reason}): live figures"]))
        result.timing.replaced_steps = []
        return
    apply_quiet(result, run.times, run.ttft + run.times[:1])
    result.timing.noise = timing_noise(run.times, result.timing.ttft_samples_s)


def quiet_summary(results: list) -> dict:
    """The `quiet` policy's figures in the run's timing record: max_tokens re-timed per column, live_vs_quiet
    (the median over columns of live / quiet decode tok/s; None without one), replaced_steps (over all
    columns, the steps that took their second timing)."""
    ok = [r for r in results if r is not None and r.status == "ok"]
    ratios = [r.timing.live["decode_tok_s"] / r.decode_tok_s for r in ok
              if r.timing.policy == "quiet" and r.timing.live.get("decode_tok_s") and r.decode_tok_s]
    return {"max_tokens": RETIME_MAX_TOKENS, "live_vs_quiet": statistics.median(ratios) if ratios else None,
            "replaced_steps": sum(len(r.timing.replaced_steps) for r in ok)}
