"""How the Compare figures are timed: one-time warm-up, the quiet re-timing pass, noise and the busy note.

- `warm_up_columns`: every column's strategy runs its one-time set-up
  (`Strategy.warm_up`: backend imports, kernel loading, first-call dispatch,
  the model's first forwards) once per process and model, before any column's
  clock starts; the seconds it took are reported apart from TTFT.
- `quiet_steps`: after the live columns, each finished column is run again on
  its own live token ids (teacher-forced, so the tokens and the cache contents
  are the same), over its first `RETIME_MAX_TOKENS` tokens, one step per column
  in turn, with no page updates and no memory sampling in between. Its prefill
  is timed `TTFT_REPEATS` times (fresh caches) and the median kept. A decode
  step more than `SPIKE_RATIO` times the fastest of its `SPIKE_WINDOW`
  neighbours on each side is timed again (`spike_steps`): the column is
  replayed once more up to its last such step, and a step that is not slow
  the second time was an interruption (another process, the browser drawing
  the page, the garbage collector) and takes its second time; one slow both
  times is the strategy's own work (a quantized cache flushing its residual)
  and stays. A step whose threads waited for a CPU (`RunDelay`: Linux's run
  delay of the calling thread and torch's OpenMP team, while another process
  or thread had their cores) for `RUN_DELAY_STEP_S` or more is timed again
  too, in a column whose decode steps waited `RUN_DELAY_SHARE` of their time
  or more in all: the timing whose threads waited less wins (chosen on the
  wait, not on the time, so a step's own jitter decides nothing). These
  figures replace the live ones in the summary; the live ones are kept
  (`ColumnResult.live_*`).
- `wait_for_quiet`: before the quiet pass, wait (up to `SETTLE_MAX_S`) until
  the rest of the machine stops using the cores (a browser on this machine
  drawing the live run's last update).
- `timing_noise`: each figure's relative noise from the step times themselves,
  which `kvlab.report.best_sets` uses to call two columns tied.
- `run_timing`: the run's timing record (load average against the cores, noise,
  live against quiet) and, when the machine was too busy for a fair comparison,
  the note the page shows.

This module measures and judges; it does not stream events or render.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

from .engine import Decoder
from .environment import cores_available, load_average

logger = logging.getLogger(__name__)

RETIME_MAX_TOKENS = 64
"""The quiet pass re-times at most this many tokens per column (the first ones)."""
TTFT_REPEATS = 3
"""Prefills timed per column in the quiet pass; the median is the TTFT shown."""
NOISE_FLOOR = 0.01
"""No figure is taken to be more precise than this fraction (fair mode agrees with a column alone to ~1 %)."""
BUSY_EXCESS_PER_CORE = 0.5
"""Busy: the 1-minute load average exceeds this run's own torch threads by more than this many per core."""
BUSY_NOISE = 0.05
"""Busy: the median column's decode tok/s is noisier than this fraction."""

SPIKE_RATIO = 1.5
"""A decode step slower than this many times the fastest of its neighbours is timed again in the quiet pass."""
SPIKE_WINDOW = 8
"""Neighbours on each side of a decode step whose fastest it is judged against."""

RUN_DELAY_STEP_S = 0.002
"""A decode step whose threads waited this many seconds or more for a CPU is timed again (see RUN_DELAY_SHARE).
On 2 cores a quiet CLI run's steps wait 0.05 ms (median; 90 % under 1 ms), a browser's page on the same
cores made a quarter of them wait 3 ms or more, and those steps took 12 % longer."""
RUN_DELAY_SHARE = 0.01
"""Steps of a column are timed again for their wait only when its decode steps waited this share of their time
or more in all (the rare millisecond a quiet machine costs is not worth a replay)."""

SETTLE_WINDOW_S = 0.2
"""Length of one look at the rest of the machine before the quiet pass (seconds)."""
SETTLE_QUIET_WINDOWS = 2
"""Looks in a row in which the rest of the machine must stay under SETTLE_OTHERS_CORES."""
SETTLE_OTHERS_CORES = 0.1
"""Cores the rest of the machine (every process but this one) may use while the quiet pass waits to start."""
SETTLE_MAX_S = 5.0
"""Longest wait for the rest of the machine to go quiet before the quiet pass starts anyway (seconds)."""

WARM_UP_MAX_INPUT_TOKENS = 512
"""The warm-up prefills the run's prompt length up to this many tokens."""

_warmed: "weakref.WeakKeyDictionary[object, set]" = weakref.WeakKeyDictionary()
_warm_lock = threading.Lock()


# ---------------------------------------------------------------- warm-up


def _already_warm(loaded, strategy) -> bool:
    with _warm_lock:
        return strategy.warm_up_key() in _warmed.get(loaded.model, set())


def needs_warm_up(loaded, strategies: list) -> list[str]:
    """Names of the strategies (None entries and unavailable ones skipped) whose one-time set-up has not run in
    this process for `loaded`'s model yet."""
    return [s.describe() for s in strategies
            if s is not None and not s.unavailable_reason(loaded) and not _already_warm(loaded, s)]


def warm_up_columns(loaded, strategies: list, input_tokens: int | None = None) -> list[float | None]:
    """Run each strategy's one-time set-up (`Strategy.warm_up`) unless this process already did for this model
    and `warm_up_key`; call it on kvlab's compute thread before any column's clock starts. `input_tokens`: the
    run's prompt length (at most WARM_UP_MAX_INPUT_TOKENS are fed), so the warm-up prefills the same shapes.

    Returns, per strategy, the seconds spent warming it now (0.0 when it was warm already, None for a None
    entry or a strategy that cannot run here). A failing warm-up is logged and left for the column to report
    when it runs; it raises nothing.
    """
    spent: list[float | None] = []
    for strategy in strategies:
        if strategy is None or strategy.unavailable_reason(loaded):
            spent.append(None)
            continue
        key = strategy.warm_up_key()
        with _warm_lock:
            done = _warmed.setdefault(loaded.model, set())
            if key in done:
                spent.append(0.0)
                continue
            started = time.perf_counter()
            try:
                if input_tokens:
                    strategy.warm_up(loaded, input_tokens=min(input_tokens, WARM_UP_MAX_INPUT_TOKENS))
                else:
                    strategy.warm_up(loaded)
                done.add(key)
            except Exception as err:  # noqa: BLE001 - the column reports its own failure when it runs
                logger.info("warm-up of %s failed: %s: %s", strategy.describe(), type(err).__name__, err)
            spent.append(time.perf_counter() - started)
    return spent


# ---------------------------------------------------------------- the quiet pass


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
    delays: list[float | None] = field(default_factory=list)
    """Seconds the threads doing each step waited for a CPU (`RunDelay`; None where it cannot be read)."""
    first_delays: list[float | None] = field(default_factory=list)
    """The first wait of every step, while the column is replayed."""
    waited: list[int] = field(default_factory=list)
    """The steps timed again because their threads waited for a CPU (`waited_steps`)."""
    run_delay: "RunDelay | None" = None

    @property
    def suspects(self) -> set[int]:
        """The steps the replay times again: the spikes and the waited steps."""
        return {*self.spikes, *self.waited}

    def start_recheck(self) -> bool:
        """Find this column's spikes and the steps whose threads waited for a CPU (`waited_steps`); when there
        are any, keep its times in `first_times` and start a fresh replay (the next `step` calls time it again,
        up to the last of them). Returns whether it has any."""
        self.spikes = spike_steps(self.times)
        self.waited = waited_steps(self.times, self.delays)
        if not self.suspects:
            return False
        self.first_times, self.times, self.decoder = self.times, [], None
        self.first_delays, self.delays = self.delays, []
        return True

    def rechecking(self) -> bool:
        """Whether the replay still has to reach the column's last spike or waited step."""
        return bool(self.suspects) and not self.failed and len(self.times) <= max(self.suspects)

    def finish_recheck(self) -> list[int]:
        """Put the first timings back, with each spike that was not slow the second time, and each waited step
        whose threads waited less the second time, replaced by its second timing; returns the indices
        replaced. A replay that failed replaces nothing, and the column keeps its first timings (its failure
        is forgotten)."""
        if not self.suspects:
            return []
        second, self.times = self.times, self.first_times
        second_delays, self.delays = self.delays, self.first_delays
        if self.failed:
            self.failed = ""
            return []
        replaced = {i for i, fastest in self.spikes.items() if i < len(second) and second[i] <= SPIKE_RATIO * fastest}
        replaced |= {i for i in self.waited if i < len(second) and i < len(second_delays)
                     and second_delays[i] is not None and second_delays[i] < self.delays[i]}
        for i in replaced:
            self.times[i] = second[i]
        return sorted(replaced)

    def prefill_s(self, loaded) -> float:
        """One extra prefill on a fresh cache, seconds (the first token forced)."""
        cache = self.strategy.build_cache(loaded, self.max_total)
        decoder = Decoder(loaded, self.strategy, cache, self.prompt_ids, self.settings, forced_ids=self.forced[:1])
        return next(decoder).per_token_s

    def step(self, loaded) -> bool:
        """Run the next quiet step; False when the run is over (or failed, with `failed` saying why)."""
        from .strategies import make_strategy

        try:
            if self.decoder is None:
                cache = self.strategy.build_cache(loaded, self.max_total)
                self.decoder = Decoder(loaded, self.strategy, cache, self.prompt_ids, self.settings,
                                       forced_ids=self.forced)
            at = len(self.decoder.token_ids)
            if at in self.switches and at < len(self.forced):
                new = make_strategy(self.switches[at])
                self.decoder.replace_cache(new, new.build_cache(loaded, self.max_total))
            before = self.run_delay.before() if self.run_delay is not None else None
            step = next(self.decoder, None)
            waited = self.run_delay.after(before, step.per_token_s) if step is not None and before is not None \
                else None
        except Exception as err:  # noqa: BLE001 - the column keeps its live figures
            self.failed = f"{type(err).__name__}: {err}"
            return False
        if step is None:
            return False
        self.times.append(step.per_token_s)
        self.delays.append(waited)
        return True


def quiet_runs(loaded, columns: list, results: list, prompt_ids, settings) -> list[_QuietRun]:
    """A `_QuietRun` for every column that finished ok with at least one token (budget switches replayed at the
    token they happened)."""
    runs, run_delay = [], RunDelay()
    for column, result in zip(columns, results):
        if column.strategy is None or result is None or result.status != "ok" or not result.token_ids:
            continue
        run_settings = settings.with_overrides(column.overrides)
        forced = list(result.token_ids[:RETIME_MAX_TOKENS])
        switches = {f["at_token"]: f["to_spec"] for f in result.fallbacks if f.get("to_spec")}
        runs.append(_QuietRun(result, column.strategy, prompt_ids, dataclasses.replace(run_settings, stop_at_eos=False),
                              prompt_ids.shape[1] + run_settings.max_new_tokens, forced, switches,
                              run_delay=run_delay))
    return runs


def quiet_steps(loaded, columns: list, results: list, prompt_ids, settings, stop: threading.Event) -> Iterator[int]:
    """The quiet re-timing pass, one timed step per `next()` (run each on kvlab's compute thread with
    `kvlab.compute.compute_iter`); yields the index of the column that just stepped.

    First `TTFT_REPEATS - 1` extra prefills per column, then every column's steps in turns, then the columns
    with spikes (`spike_steps`) or steps that waited for a CPU (`waited_steps`) replayed in turns up to the
    last of them, each spike that is not slow again and each waited step that waits less taking its second
    timing (`ColumnResult.quiet_replaced_steps`). When every column is done, each result
    gets its quiet figures (`ColumnResult.apply_quiet`) and `timing_noise`; a column whose quiet run failed
    keeps its live figures and says why in its message. Nothing is applied when `stop` is set before the end.
    """
    runs = quiet_runs(loaded, columns, results, prompt_ids, settings)
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
        run.result.quiet_replaced_steps = run.finish_recheck()
    for run in runs:
        _apply(run)


def busy_cpu_s(times) -> float:
    """Busy seconds in one `psutil.cpu_times()` record: user, nice, system, irq, softirq (guest time is
    already inside user and nice; idle, iowait and steal are not work done here)."""
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def others_cpu_s() -> float | None:
    """CPU seconds the cores this process may run on (`os.sched_getaffinity` where it exists, else all) have
    been busy, less this process's own (every thread), cumulative; None where psutil cannot tell."""
    try:
        import psutil

        per_cpu = psutil.cpu_times(percpu=True)
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
        mine = psutil.Process().cpu_times()
    except Exception:  # noqa: BLE001 - no figure: no wait
        return None
    busy = sum(busy_cpu_s(per_cpu[i]) for i in allowed if i < len(per_cpu))
    return busy - mine.user - mine.system


def wait_for_quiet(max_s: float = SETTLE_MAX_S, window_s: float = SETTLE_WINDOW_S,
                   quiet_windows: int = SETTLE_QUIET_WINDOWS, others_cores: float = SETTLE_OTHERS_CORES,
                   sample=others_cpu_s, sleep=time.sleep, clock=time.perf_counter,
                   stop: threading.Event | None = None) -> tuple[float, bool]:
    """Wait until the rest of the machine used under `others_cores` cores in each of `quiet_windows` windows of
    `window_s` seconds in a row, or `max_s` seconds passed, or `stop` is set; returns (the seconds waited,
    whether it went quiet: True too when there is no figure to wait on).

    Why: the quiet pass's steps use every core (torch's OpenMP threads), and work another process does on the
    same cores (a browser on this machine still drawing the live run's last update, another job) stalls them.
    The live run's tail is waited out; what runs on regardless is left to the noise and the busy note.
    `sample` gives the rest of the machine's cumulative CPU seconds (`others_cpu_s`; None: no wait).
    """
    started = clock()
    before = sample()
    if before is None:
        return 0.0, True
    quiet, now = 0, before
    while quiet < quiet_windows and clock() - started < max_s and not (stop is not None and stop.is_set()):
        sleep(window_s)
        now = sample()
        if now is None:
            break
        quiet = quiet + 1 if now - before < others_cores * window_s else 0
        before = now
    stopped = stop is not None and stop.is_set()
    return clock() - started, quiet >= quiet_windows or now is None or stopped


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
    several steps in a row is found too (up to `window` - 1 steps long: then the window still holds a step on
    each side, or `window` steps at the start); a cost that grows slowly with the sequence (no_cache) is no
    spike."""
    spikes = {}
    for i in range(1, len(times)):
        neighbours = times[max(1, i - window):i] + times[i + 1:i + 1 + window]
        if len(neighbours) >= 2:
            fastest = min(neighbours)
            if times[i] > ratio * fastest:
                spikes[i] = fastest
    return spikes


def waited_steps(times: list[float], delays: list[float | None], step_s: float = RUN_DELAY_STEP_S,
                 share: float = RUN_DELAY_SHARE) -> list[int]:
    """The decode steps (index 0, the prefill, never) whose threads waited `step_s` seconds or more for a CPU,
    when the column's decode steps waited `share` of their time or more in all; [] otherwise, and where the
    waits could not be read (None)."""
    pairs = [(i, t, d) for i, (t, d) in enumerate(zip(times, delays)) if i > 0 and d is not None]
    total = sum(t for _, t, _ in pairs)
    if not pairs or total <= 0 or sum(d for _, _, d in pairs) < share * total:
        return []
    return [i for i, _, d in pairs if d >= step_s]


class RunDelay:
    """How long the threads doing a step waited for a CPU while they could have run (Linux's run delay: the
    second field of `/proc/self/task/<tid>/schedstat`, nanoseconds, kept by the scheduler for every thread).

    The threads are the calling thread and every thread of this process that ran for at least TEAM_SHARE of
    the calling thread's own CPU time during the first step (torch's OpenMP team), found on the first step
    and again whenever one of them is gone. When another process or thread takes a core from one of them, the others wait for it at the next
    barrier, so the step is late by about the wait: on 2 cores, steps whose threads waited 3 ms or more
    took 4 ms (12 %) longer on average. `before()` returns a snapshot (None where the file cannot be read:
    not Linux, or schedstats off); `after(snapshot, step_s)` the seconds waited during the step (None then).
    Raises nothing."""

    TEAM_SHARE = 0.3

    def __init__(self):
        self.team: list[int] | None = None

    @staticmethod
    def _read(tids) -> dict[int, tuple[int, int]]:
        out = {}
        for tid in tids:
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    ran, waited = f.read().split()[:2]
                out[int(tid)] = (int(ran), int(waited))
            except (OSError, ValueError):
                continue
        return out

    def _tids(self) -> list:
        if self.team is not None:
            return self.team
        try:
            return os.listdir("/proc/self/task")
        except OSError:
            return []

    def before(self) -> dict[int, tuple[int, int]] | None:
        snapshot = self._read(self._tids())
        return snapshot or None

    def after(self, before: dict[int, tuple[int, int]], step_s: float) -> float | None:
        now = self._read(before)
        if self.team is None:
            me = threading.get_native_id()
            mine = now[me][0] - before[me][0] if me in now and me in before else step_s * 1e9
            # judged against the calling thread's own CPU time, not the step's wall time: on a busy machine a
            # worker's share of the wall time can be small exactly when the waits matter
            self.team = [tid for tid in now if tid in before and
                         (tid == me or now[tid][0] - before[tid][0] >= self.TEAM_SHARE * mine)]
        if not self.team or any(tid not in now or tid not in before for tid in self.team):
            self.team = None  # a thread of the team is gone (or none was found): look again on the next step
            return None
        return sum(now[tid][1] - before[tid][1] for tid in self.team) / 1e9


def _apply(run: _QuietRun) -> None:
    result = run.result
    if run.failed or len(run.times) != len(run.forced):
        reason = run.failed or f"it made {len(run.times)} of {len(run.forced)} steps"
        result.message = "; ".join(filter(None, [result.message, f"quiet re-timing failed ({reason}): live figures"]))
        result.quiet_replaced_steps = []
        return
    result.apply_quiet(run.times, run.ttft + run.times[:1])
    result.timing_noise = timing_noise(run.times, result.ttft_samples_s)


# ---------------------------------------------------------------- noise and the busy note


def step_noise(steps: list[float]) -> float | None:
    """Relative noise of one step's time (a fraction): the spread of successive differences (von Neumann's
    estimator), so a steady trend such as no_cache's growing steps is not counted as noise. None for fewer
    than 3 steps."""
    if len(steps) < 3 or sum(steps) <= 0:
        return None
    squares = [(b - a) ** 2 for a, b in zip(steps, steps[1:])]
    return math.sqrt(sum(squares) / (2 * len(squares))) / statistics.mean(steps)


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


def run_timing(results: list, retimed: bool, loads: list, threads: int, cores: int | None = None,
               settle_s: float | None = None, settled: bool = True) -> dict:
    """The run's timing record (the `timing` of `RunDone` and of the JSON record).

    Args:
        results: the run's `ColumnResult`s. retimed: whether the quiet pass replaced the live figures.
        loads: 1-minute load averages sampled during the run (None entries where the platform has none).
        threads: torch intra-op threads this run's forwards used (its own share of the load).
        cores: CPU cores this process may use (default: `kvlab.environment.cores_available()`).
        settle_s: seconds the quiet pass waited for the rest of the machine to go quiet (`wait_for_quiet`);
        settled: whether it did.

    Returns {retimed, retime_max_tokens, load_average, cores, torch_threads, decode_noise, live_vs_quiet,
    warm_up_s, replaced_steps, settle_s, busy, note}: decode_noise is the median column's relative noise, live_vs_quiet
    the median of live / quiet decode tok/s, warm_up_s the one-time set-up this run did (seconds),
    replaced_steps the quiet steps, over all columns, that took their second timing (interrupted once: slow,
    or waiting for a CPU; `ColumnResult.quiet_replaced_steps`),
    note the sentence the page shows ('' when not busy).
    """
    cores = cores or cores_available()
    load = max((value for value in loads if value is not None), default=None)
    ok = [r for r in results if r is not None and r.status == "ok"]
    noises = [r.timing_noise["decode_tok_s"] for r in ok if "decode_tok_s" in r.timing_noise]
    noise = statistics.median(noises) if noises else None
    ratios = [r.live_decode_tok_s / r.decode_tok_s for r in ok
              if r.timing == "quiet" and r.live_decode_tok_s and r.decode_tok_s]
    reasons = []
    if load is not None and load - threads > BUSY_EXCESS_PER_CORE * cores:
        reasons.append(f"load average {load:.1f} on {cores} cores, this run's own {threads} threads included")
    if noise is not None and noise > BUSY_NOISE:
        reasons.append(f"decode times varied by ±{100 * noise:.0f}% within a column")
    if settle_s is not None and not settled:
        reasons.append(f"other processes kept the cores busy for the {SETTLE_MAX_S:.0f} s the re-timing waited")
    note = ""
    if reasons:
        note = (f"⚠ the machine was too busy for a fair comparison ({'; '.join(reasons)}): differences within "
                "the noise are marked as ties, others may still come from other work; run again when it is quieter")
    return {"retimed": retimed, "retime_max_tokens": RETIME_MAX_TOKENS, "load_average": load, "cores": cores,
            "torch_threads": threads, "decode_noise": noise,
            "live_vs_quiet": statistics.median(ratios) if ratios else None,
            "warm_up_s": sum(r.warm_up_s or 0.0 for r in ok),
            "replaced_steps": sum(len(r.quiet_replaced_steps) for r in ok), "settle_s": settle_s,
            "busy": bool(reasons), "note": note}


def sample_load() -> float | None:
    """The 1-minute load average now, or None where the platform has none."""
    loads = load_average()
    return loads[0] if loads else None
