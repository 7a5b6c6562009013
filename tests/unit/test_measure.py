"""kvlab.measure on the tiny model and synthetic numbers: the one-time warm-up, the two timing policies (live,
and the quiet re-timing pass with spike re-timing), noise-aware best marks and the busy-machine note.
Behaviour only: no test asserts how long anything took."""

import os
import threading
import time
from html import unescape

import pytest
import torch

from kvlab.cli import build_parser
from kvlab.cli.compare import resolve_compare
from kvlab.compare.events import ColumnResult, RunPhase
from kvlab.protocol import RunDone
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.compare.summary import best_marks, best_sets, summary_rows
from kvlab.compare.timing import for_policy
from kvlab.generation import GenerationSettings
from kvlab.measure import POLICIES
from kvlab.measure.noise import BUSY_STEP_NOISE, run_timing, timing_noise
from kvlab.compare.quiet import RETIME_MAX_TOKENS, SPIKE_RATIO, TTFT_REPEATS, apply_quiet, quiet_summary, spike_steps
from kvlab.strategies import Strategy, make_strategy
from kvlab.strategies.dynamic import Dynamic
from kvlab.ui.compare.view import BEST_MARK, RunView

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404]])
GREEDY = GenerationSettings(max_new_tokens=12, stop_at_eos=False, fidelity=False)
QUIET = GenerationSettings(max_new_tokens=12, stop_at_eos=False, fidelity=False, timing_policy="quiet")


class Recording(Dynamic):
    """A dynamic cache that records every sequence its forward is given, and its warm-ups, in one log."""

    def __init__(self, log, key="recording"):
        super().__init__()
        self.log, self.key = log, key

    def warm_up_key(self):
        return (self.key,)

    def warm_up(self, loaded, **kwargs):
        self.log.append(("warm_up", threading.current_thread().name, kwargs.get("input_tokens")))

    def forward(self, loaded, cache, sequence, new_tokens):
        self.log.append(("forward", tuple(sequence[0].tolist())))
        return super().forward(loaded, cache, sequence, new_tokens)


def test_quiet_retiming_feeds_the_live_tokens_and_replaces_the_summary_figures(tiny):
    log = []
    done = collect(run_compare(tiny, PROMPT, [Recording(log, "retime-a"), {"strategy": "static"}], QUIET))
    result = done.results[0]
    fed = [entry[1] for entry in log if entry[0] == "forward"]
    live, extra_prefills = fed[:12], fed[12:12 + TTFT_REPEATS - 1]
    quiet, replay = fed[12 + TTFT_REPEATS - 1:24 + TTFT_REPEATS - 1], fed[24 + TTFT_REPEATS - 1:]
    assert quiet == live  # the same ids, step by step: the same tokens and the same cache contents
    assert replay == live[:len(replay)]  # a step slow by chance on this tiny model is timed again on a replay
    assert extra_prefills == [live[0]] * (TTFT_REPEATS - 1)
    timing = result.timing
    assert timing.policy == "quiet" and len(timing.per_token_s) == len(result.token_ids) == 12
    assert len(timing.ttft_samples_s) == TTFT_REPEATS
    decode = timing.per_token_s[1:]
    assert result.decode_tok_s == pytest.approx(len(decode) / sum(decode))
    assert result.ttft_s == sorted(timing.ttft_samples_s)[1]
    live_decode = result.per_token_s[1:]
    assert timing.live["decode_tok_s"] == pytest.approx(len(live_decode) / sum(live_decode))
    assert timing.live["ttft_s"] == result.per_token_s[0]
    row = summary_rows(done.results)[0]
    assert row["timing"] == "quiet" and row["decode_tok_s"] == round(result.decode_tok_s, 2)
    assert set(row["noise"]) == {"ttft_s", "decode_tok_s", "itl_ms_p50", "itl_ms_p99"}
    assert done.record["timing"]["policy"] == "quiet" and done.results[1].timing.policy == "quiet"
    assert done.record["timing"]["max_tokens"] == RETIME_MAX_TOKENS
    assert result.to_json()["timing"]["live"]["decode_tok_s"] == timing.live["decode_tok_s"]


@pytest.mark.parametrize("settings, mode", [(GREEDY, "fair"), (QUIET, "parallel")])
def test_the_live_policy_by_default_and_no_retiming_outside_fair_mode(tiny, settings, mode):
    assert GenerationSettings().timing_policy == "live"
    events = list(run_compare(tiny, PROMPT, [{"strategy": "dynamic"}], settings, mode))
    result = events[-1].results[0]
    assert result.timing.policy == "live" and result.timing.live == {} and result.timing.per_token_s == []
    assert "retiming" not in [e.phase for e in events if isinstance(e, RunPhase)]
    assert events[-1].record["timing"]["policy"] == "live" and "live_vs_quiet" not in events[-1].record["timing"]
    live_decode = result.per_token_s[1:]
    assert result.decode_tok_s == pytest.approx(len(live_decode) / sum(live_decode))
    assert result.timing.noise  # live figures carry their noise for the best marks


def test_an_unknown_policy_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match=r"timing policy must be one of \['live', 'quiet'\]"):
        for_policy("calm")
    assert "timing_policy must be one of ['live', 'quiet']" in GenerationSettings(timing_policy="calm").problems()[0]
    assert POLICIES == ("live", "quiet")


def test_spikes_are_judged_against_their_fastest_neighbours_never_the_prefill_or_a_trend():
    steady = [0.5] + [0.05] * 10
    assert spike_steps(steady) == {}
    one = list(steady)
    one[4] = 0.2
    assert spike_steps(one) == {4: 0.05}
    assert spike_steps([9.0, 0.05, 0.05, 0.05]) == {}  # the prefill (index 0) is never a spike
    growing = [0.1] + [0.05 * (1 + 0.02 * i) for i in range(64)]  # no_cache: each step ~2 % longer than the last
    assert spike_steps(growing) == {}
    assert spike_steps([0.1, 0.05, 0.2]) == {}  # fewer than 2 neighbours: not judged
    edge = [0.1, 0.05, 0.05, 0.05, 0.05 * SPIKE_RATIO * 1.01]
    assert list(spike_steps(edge)) == [4]
    # a stall of several steps in a row, at the start or in the middle, is found step by step
    assert list(spike_steps([0.5, 0.3, 0.3, 0.3] + [0.1] * 6)) == [1, 2, 3]
    stall = [0.1] + [0.04] * 3 + [0.6] * 7 + [0.04] * 20
    assert list(spike_steps(stall)) == list(range(4, 11))


class Spiking(Dynamic):
    """A dynamic cache whose decode step SLOW_STEP sleeps SLOW_S: in every pass (`always`), or only in the quiet
    pass's first timing (the fourth prefill: live run, two extra prefills, quiet pass). Every decode step
    first sleeps STEP_S, so a step takes about that long and the tiny model's own jitter (up to ~8 ms on a busy
    2-core machine) cannot make a replayed step look 1.5x its fastest neighbour."""

    SLOW_STEP, SLOW_S, STEP_S = 5, 0.6, 0.15

    def __init__(self, always: bool):
        super().__init__()
        self.always, self.prefills, self.step = always, 0, 0

    def forward(self, loaded, cache, sequence, new_tokens):
        if new_tokens > 1:  # the prompt: a new pass starts
            self.prefills, self.step = self.prefills + 1, 0
        else:
            self.step += 1
            time.sleep(self.STEP_S)
            if self.step == self.SLOW_STEP and (self.always or self.prefills == 1 + TTFT_REPEATS):
                time.sleep(self.SLOW_S)
        return super().forward(loaded, cache, sequence, new_tokens)


def test_an_interrupted_step_takes_its_second_timing_and_a_step_slow_every_time_stays(tiny):
    interrupted, genuine = Spiking(always=False), Spiking(always=True)
    done = collect(run_compare(tiny, PROMPT, [interrupted, genuine], QUIET))
    first, second = done.results
    step = Spiking.SLOW_STEP
    assert step in first.timing.replaced_steps and first.timing.per_token_s[step] < Spiking.SLOW_S
    assert step not in second.timing.replaced_steps and second.timing.per_token_s[step] >= Spiking.SLOW_S
    assert interrupted.prefills == genuine.prefills == 2 + TTFT_REPEATS  # live, extra prefills, quiet, one replay
    replaced = len(first.timing.replaced_steps) + len(second.timing.replaced_steps)
    assert done.record["timing"]["replaced_steps"] == replaced >= 1
    assert first.to_json()["timing"]["replaced_steps"] == first.timing.replaced_steps


def test_retiming_covers_at_most_the_cap(tiny):
    settings = GenerationSettings(max_new_tokens=RETIME_MAX_TOKENS + 6, stop_at_eos=False, fidelity=False,
                                  timing_policy="quiet")
    result = collect(run_compare(tiny, PROMPT, [{"strategy": "dynamic"}], settings)).results[0]
    assert len(result.token_ids) == RETIME_MAX_TOKENS + 6
    assert len(result.timing.per_token_s) == RETIME_MAX_TOKENS and len(result.per_token_s) == RETIME_MAX_TOKENS + 6


def test_warm_up_runs_once_per_process_on_the_compute_thread_before_any_step(tiny):
    log = []
    first = collect(run_compare(tiny, PROMPT, [Recording(log, "warm-once"), Recording(log, "warm-once")], GREEDY))
    second = collect(run_compare(tiny, PROMPT, [Recording(log, "warm-once")], GREEDY))
    warm_ups = [entry for entry in log if entry[0] == "warm_up"]
    assert len(warm_ups) == 1 and log[0][0] == "warm_up"
    assert warm_ups[0][1].startswith("kvlab-compute")
    assert warm_ups[0][2] == PROMPT.shape[1]  # the run's prompt length: the shapes the run will use
    assert first.results[0].timing.warm_up_s is not None and first.results[1].timing.warm_up_s == 0.0
    assert second.results[0].timing.warm_up_s == 0.0
    assert first.results[0].ttft_s is not None


def test_a_warm_up_phase_is_announced_only_when_something_is_cold(tiny):
    events = list(run_compare(tiny, PROMPT, [Recording([], "announce")], GREEDY))
    phases = [e for e in events if isinstance(e, RunPhase)]
    assert phases[0].phase == "warm_up" and "dynamic" in phases[0].detail
    again = list(run_compare(tiny, PROMPT, [Recording([], "announce")], GREEDY))
    assert "warm_up" not in [e.phase for e in again if isinstance(e, RunPhase)]


def test_the_warm_up_phase_counts_each_cold_set_up(tiny):
    columns = [Recording([], "count-a"), Recording([], "count-b"), Recording([], "count-a")]
    phases = [e for e in run_compare(tiny, PROMPT, columns, GREEDY) if isinstance(e, RunPhase) and e.phase == "warm_up"]
    assert [p.detail.split(":")[0] for p in phases] == ["one-time set-up (not timed), 1 of 2",
                                                      "one-time set-up (not timed), 2 of 2"]


def test_default_warm_up_runs_the_registered_strategy_with_the_same_knobs(tiny, monkeypatch):
    log = []
    Strategy.warm_up(Recording(log), tiny)  # a subclass: the registered Dynamic runs, not its counting forward
    assert not [entry for entry in log if entry[0] == "forward"]
    quantized = [make_strategy({"strategy": "quantized", "residual_length": r}) for r in (16, 128)]
    assert quantized[0].warm_up_key() == quantized[1].warm_up_key()
    assert make_strategy({"strategy": "quantized", "nbits": 2}).warm_up_key() != quantized[0].warm_up_key()
    warmed = []
    monkeypatch.setattr(Strategy, "warm_up", lambda self, loaded, **kwargs: warmed.append(self.knobs()))
    make_strategy({"strategy": "static", "compile": True}).warm_up(tiny)
    quantized[0].warm_up(tiny)
    assert warmed[0]["compile"] is False and warmed[1]["residual_length"] == 1


def rows_of(values: dict, noise: dict | None = None) -> list[dict]:
    """Summary-like rows: name -> decode tok/s, each with the given relative noise (default 2 %)."""
    noise = noise or {}
    return [{"column": name, "status": "ok", "decode_tok_s": value, "use_cache": True,
             "noise": {"decode_tok_s": noise.get(name, 0.02)},
             **{key: None for key in ("ttft_s", "itl_ms_p50", "itl_ms_p99", "peak_cache_bytes", "agreement",
                                      "top1_agreement", "mean_kl")}} for name, value in values.items()]


def test_best_marks_tie_within_noise_and_never_flip_outside_it():
    within = rows_of({"dynamic": 25.0, "static": 24.4, "no_cache": 10.0})
    assert best_sets(within)["decode_tok_s"] == {0, 1}
    apart = rows_of({"dynamic": 25.0, "static": 20.0, "no_cache": 10.0})
    assert best_sets(apart)["decode_tok_s"] == {0}
    flipped = rows_of({"dynamic": 20.0, "static": 25.0, "no_cache": 10.0})
    assert best_sets(flipped)["decode_tok_s"] == {1}
    noisy = rows_of({"dynamic": 25.0, "static": 20.0, "no_cache": 10.0}, {"static": 0.2, "dynamic": 0.2})
    assert best_sets(noisy)["decode_tok_s"] == {0, 1}
    everyone = rows_of({"dynamic": 25.0, "static": 24.9})
    assert best_sets(everyone)["decode_tok_s"] == set()
    assert best_marks(within)["decode_tok_s"] == 0


def test_non_timing_metrics_tie_only_when_equal():
    rows = rows_of({"a": 1.0, "b": 1.0})
    for row, agreement in zip(rows, (0.99, 0.98)):
        row["agreement"] = agreement
        row["noise"]["agreement"] = 0.5
    assert best_sets(rows)["agreement"] == {0}


def test_noise_ignores_a_steady_trend():
    steady_growth = [0.1] + [0.01 * (1 + i / 100) for i in range(60)]
    jumpy = [0.1] + [0.01 if i % 2 else 0.02 for i in range(60)]
    assert timing_noise(steady_growth, [])["decode_tok_s"] == pytest.approx(0.01)  # the floor
    assert timing_noise(jumpy, [])["decode_tok_s"] > 0.05
    assert timing_noise(steady_growth, [0.1, 0.12, 0.1])["ttft_s"] == pytest.approx(0.1)


def quiet_result(index, name, live, quiet, noise=0.01):
    result = ColumnResult(index=index, name=name, strategy="dynamic", knobs={}, status="ok", per_token_s=live)
    result.finish_decode_stats()
    apply_quiet(result, quiet, quiet[:1])
    result.timing.noise = {"decode_tok_s": noise}
    return result


@pytest.mark.parametrize("loads, busy", [([9.0, 8.5], True), ([1.5, None], False), ([None], False)])
def test_busy_note_follows_the_load_average_where_other_work_is_not_measured(loads, busy):
    results = [quiet_result(0, "dynamic", [0.1, 0.08, 0.08], [0.1, 0.04, 0.04])]
    timing = run_timing(results, "quiet", loads, threads=2, cores=2)
    assert timing["busy"] is busy and bool(timing["note"]) is busy
    assert quiet_summary(results)["live_vs_quiet"] == pytest.approx(0.5)
    if busy:
        assert "too busy for a fair comparison" in timing["note"] and "load average 9.0 on 2 cores" in timing["note"]


@pytest.mark.parametrize("other_cores, busy", [(1.4, True), (0.3, False), (0.0, False)])
def test_busy_note_follows_the_other_processes_work_not_the_load_average(other_cores, busy):
    """The load average counts this process's own work before the run (its warm-up) and lags a minute; where
    the other processes' cores were measured, they decide, whatever the load average says."""
    results = [quiet_result(0, "dynamic", [0.1, 0.08, 0.08], [0.1, 0.04, 0.04])]
    timing = run_timing(results, "quiet", [9.0], threads=2, cores=2, other_cores=other_cores)
    assert timing["busy"] is busy and timing["other_cores"] == other_cores and timing["load_average"] == 9.0
    assert ("other processes took 1.4 of 2 cores during the run" in timing["note"]) is busy
    assert "load average" not in timing["note"]


def test_taken_cpu_counts_this_process_work_which_other_work_leaves_out():
    """`taken_cpu_s` (the CPUs' taken seconds) includes this process's own work, so `OtherWork` subtracting it
    leaves the other processes' share; a second of this process's own spinning is not 'other work'."""
    from kvlab.measure.environment import OtherWork, process_cpu_s, taken_cpu_s

    taken0, own0, other = taken_cpu_s(), process_cpu_s(), OtherWork()
    deadline = process_cpu_s() + 0.5
    while process_cpu_s() < deadline:  # spin on this process's CPU time, whatever else the machine runs
        sum(range(1000))
    own, taken = process_cpu_s() - own0, taken_cpu_s() - taken0
    assert own >= 0.5 and taken >= 0.9 * own
    cores = other.cores()
    assert cores is not None and 0.0 <= cores <= len(os.sched_getaffinity(0))


def test_busy_note_follows_the_step_noise_not_one_hiccup():
    steady = [0.1] + [0.040, 0.041, 0.039, 0.040, 0.042, 0.040, 0.039, 0.041, 0.040, 0.040]
    hiccup = steady[:5] + [0.4] + steady[6:]  # one garbage collection: ten times one step
    contended = [0.1] + [0.04, 0.06, 0.03, 0.07, 0.04, 0.08, 0.035, 0.06, 0.04, 0.07]
    for steps, busy in ((steady, False), (hiccup, False), (contended, True)):
        timing = run_timing([quiet_result(0, "dynamic", steps, steps)], "quiet", [0.5], threads=2, cores=2)
        assert timing["busy"] is busy, (steps, timing)
    assert "decode steps varied by ±" in timing["note"] and timing["step_noise"] > BUSY_STEP_NOISE
    short = run_timing([quiet_result(0, "dynamic", contended[:5], contended[:5])], "quiet", [0.5], threads=2, cores=2)
    assert short["step_noise"] is None and not short["busy"]  # four steps are too few to judge


def test_the_runner_and_the_page_say_when_the_machine_was_busy(tiny, monkeypatch):
    class Others:  # other processes took 1.8 of the cores while the run was timed
        cores = staticmethod(lambda: 1.8)

    monkeypatch.setattr("kvlab.compare.runner.OtherWork", Others)
    monkeypatch.setattr("kvlab.compare.runner.sample_load", lambda: 50.0)
    done = collect(run_compare(tiny, PROMPT, [{"strategy": "dynamic"}], QUIET))
    assert done.record["timing"]["busy"] and done.record["timing"]["load_average"] == 50.0
    assert done.record["timing"]["other_cores"] == 1.8
    view = RunView(["dynamic"])
    view.apply(done)
    assert "too busy for a fair comparison" in view.progress_text()
    assert "quiet re-timing" in view.progress_text()
    timing = done.record["timing"]
    assert "\n" not in view.progress_text() and timing["note"] in unescape(view.summary_notes())  # the why, below
    Others.cores = staticmethod(lambda: 0.0)
    calm = collect(run_compare(tiny, PROMPT, [{"strategy": "dynamic"}], GREEDY))
    calm_timing = calm.record["timing"]
    assert calm_timing["other_cores"] == 0.0 and "other processes" not in calm_timing["note"]  # (noise may still)


def test_the_page_shows_phases_quiet_rates_and_tied_marks():
    view = RunView(["dynamic", "static"])
    view.apply(RunPhase("warm_up", "one-time set-up (not timed) of dynamic…"))
    assert view.progress_text().startswith("warming up: one-time set-up")
    results = [quiet_result(0, "dynamic", [0.1, 0.08, 0.08], [0.1, 0.04, 0.0401]),
               quiet_result(1, "static", [0.1, 0.1, 0.1], [0.1, 0.04, 0.04])]
    for column, result in zip(view.columns, results):
        column.status, column.per_token_s = "done", list(result.per_token_s)
    view.apply(RunPhase("retiming", "re-timing 2 columns quietly…"))
    assert "re-timing 2 columns quietly" in view.progress_text()
    view.apply(RunDone({"timing": {"policy": "quiet", "max_tokens": 64}}, 1.0, False, results))
    assert view.columns[0].readout().startswith("3 tokens · 25.0 tok/s (live 12.5)")
    headers, table = view.summary_table()
    rate = headers.index("decode tok/s")
    assert [row[rate] for row in table] == ["25.0", "25.0"]  # a tie between two rows only: nothing to choose
    assert BEST_MARK not in table[0][rate]


def test_cli_timing_flag(capsys):
    args = build_parser().parse_args(["compare", "--preset", "quickstart", "--timing", "quiet"])
    assert resolve_compare(args)["settings"].timing_policy == "quiet"
    args = build_parser().parse_args(["compare", "--preset", "quickstart"])
    assert resolve_compare(args)["settings"].timing_policy == "live"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["compare", "--preset", "quickstart", "--timing", "calm"])
    assert exit_info.value.code == 2 and "invalid choice: 'calm'" in capsys.readouterr().err


def test_the_status_line_says_how_many_interrupted_steps_were_timed_again():
    from kvlab.ui.compare.timing_text import timing_line

    base = {"policy": "quiet", "max_tokens": 64}
    assert "interrupted" not in timing_line({**base, "replaced_steps": 0})
    assert " · 1 interrupted step timed again" in timing_line({**base, "replaced_steps": 1})
    assert " · 3 interrupted steps timed again" in timing_line({**base, "replaced_steps": 3})
