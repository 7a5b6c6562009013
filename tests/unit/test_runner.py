"""The runner on a tiny random Llama: event order, stop, error isolation, modes, turn-taking."""

import threading
import time

import pytest
import torch

from kvlab.columns import Column
from kvlab.compare.events import (
    ColumnDone,
    ColumnStarted,
    FidelityScored,
    MemorySample,
    StepMetrics,
    TokenEvent,
)
from kvlab.compare.runner import parallel_threads, run_compare, shared_threads
from kvlab.compute import compute, compute_iter
from kvlab.protocol import ColumnFailed, RunDone, RunStarted, collect
from kvlab.generation import GenerationSettings
from kvlab.strategies import make_strategy
from kvlab.strategies.dynamic import Dynamic

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404]])
GREEDY = GenerationSettings(max_new_tokens=12, stop_at_eos=False)


def events_of(tiny, columns, settings=GREEDY, **kwargs):
    return list(run_compare(tiny, PROMPT, columns, settings, **kwargs))


@pytest.mark.parametrize("mode", ["fair", "parallel", "sequential"])
def test_exact_strategies_agree_and_events_come_in_order(tiny, mode):
    events = events_of(tiny, [{"strategy": "no_cache"}, {"strategy": "dynamic"}, {"strategy": "static"}], mode=mode)
    assert isinstance(events[-1], RunDone)
    results = events[-1].results
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    assert results[0].token_ids == results[1].token_ids == results[2].token_ids
    assert len(results[1].token_ids) == GREEDY.max_new_tokens
    for column in range(3):
        mine = [e for e in events if getattr(e, "column", None) == column and not isinstance(e, FidelityScored)]
        assert isinstance(mine[0], ColumnStarted)
        assert isinstance(mine[-1], ColumnDone)
        steps = [e.step for e in mine if isinstance(e, TokenEvent)]
        assert steps == list(range(GREEDY.max_new_tokens))
        metric_steps = [e.step for e in mine if isinstance(e, StepMetrics)]
        assert metric_steps == steps
    assert any(isinstance(e, MemorySample) for e in events)
    assert results[1].is_baseline and results[0].agreement == 1.0 and results[0].first_divergence is None
    assert results[2].top1_agreement == 1.0 and results[2].mean_kl < 1e-6


def test_the_summary_comes_before_the_fidelity_pass_and_a_stop_in_it_keeps_the_summary(tiny):
    columns = [{"strategy": "dynamic"}, {"strategy": "quantized", "backend": "fp8"}, {"strategy": "static"}]
    events = events_of(tiny, columns)
    kinds = [type(e).__name__ for e in events]
    ready = kinds.index("SummaryReady")
    assert ready > max(i for i, k in enumerate(kinds) if k == "ColumnDone")
    assert ready < min(i for i, k in enumerate(kinds) if k == "FidelityScored")
    assert events[ready].to_score == 3 and events[ready].results[1].agreement is not None
    assert [(e.scored, e.to_score) for e in events if isinstance(e, FidelityScored)] == [(1, 3), (2, 3), (3, 3)]
    assert events[-1].record["fidelity"] == {"state": "scored", "scored": 3, "to_score": 3}
    assert {r.fidelity_status for r in events[-1].results} == {"scored"}

    stop = threading.Event()
    kept = []
    for event in run_compare(tiny, PROMPT, columns, GREEDY, stop=stop):
        if isinstance(event, FidelityScored):
            stop.set()  # Stop during the fidelity pass, after its first column
        kept.append(event)
    done = kept[-1]
    assert isinstance(done, RunDone) and done.stopped and done.record["summary_s"] is not None
    assert done.record["fidelity"]["state"] == "stopped" and done.record["fidelity"]["scored"] == 1
    assert [r.status for r in done.results] == ["ok"] * 3 and all(r.token_ids for r in done.results)
    assert done.results[0].fidelity_status == "scored"
    assert done.results[1].fidelity_status == "not scored: stopped" and done.results[1].top1_agreement is None


def test_token_texts_add_up_to_the_column_text(tiny):
    events = events_of(tiny, [{"strategy": "dynamic"}])
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert streamed == events[-1].results[0].text
    assert events[-1].results[0].text == tiny.tokenizer.decode(events[-1].results[0].token_ids, skip_special_tokens=True)


def test_dynamic_bytes_equal_prediction_every_step(tiny):
    events = events_of(tiny, [{"strategy": "dynamic"}])
    metrics = [e for e in events if isinstance(e, StepMetrics)]
    assert metrics and all(m.cache_bytes == m.predicted_cache_bytes > 0 for m in metrics)
    assert [m.seen_tokens for m in metrics] == list(range(PROMPT.shape[1], PROMPT.shape[1] + GREEDY.max_new_tokens))


class Exploding(Dynamic):
    """A dynamic cache whose forward fails at a given step."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def forward(self, loaded, cache, sequence, new_tokens):
        self.calls += 1
        if self.calls > self.fail_at:
            raise RuntimeError("boom at step %d" % self.calls)
        return super().forward(loaded, cache, sequence, new_tokens)


@pytest.mark.parametrize("mode", ["fair", "parallel", "sequential"])
def test_an_error_ends_its_own_column_only(tiny, mode):
    events = events_of(tiny, [Exploding(fail_at=3), {"strategy": "dynamic"}], mode=mode)
    done = events[-1]
    assert done.results[0].status == "error" and "boom" in done.results[0].message
    assert len(done.results[0].token_ids) == 3
    assert done.results[1].status == "ok" and len(done.results[1].token_ids) == GREEDY.max_new_tokens
    assert [e.column for e in events if isinstance(e, ColumnFailed)] == [0]


def test_invalid_sampling_in_one_column_errors_fast_and_the_rest_finish(tiny):
    columns = [
        Column(make_strategy({"strategy": "dynamic"}), {"do_sample": True, "top_p": 0.0}),
        Column(make_strategy({"strategy": "dynamic"}), {"repetition_penalty": 0.0}),
        {"strategy": "static"},
    ]
    done = events_of(tiny, columns)[-1]
    assert done.results[0].status == "error" and "top_p must be in (0, 1]" in done.results[0].message
    assert done.results[1].status == "error" and "repetition_penalty must be > 0" in done.results[1].message
    assert done.results[0].token_ids == [] and done.results[1].token_ids == []
    assert done.results[2].status == "ok"
    again = events_of(tiny, [{"strategy": "dynamic"}])[-1]
    assert again.results[0].status == "ok"


def test_static_too_small_fails_before_compute_and_others_finish(tiny):
    done = events_of(tiny, [{"strategy": "static", "max_cache_len": 8}, {"strategy": "dynamic"}])[-1]
    assert done.results[0].status == "error"
    assert "max_cache_len=8" in done.results[0].message and str(PROMPT.shape[1] + GREEDY.max_new_tokens) in done.results[0].message
    assert done.results[0].ttft_s is None
    assert done.results[1].status == "ok"


def test_unavailable_column_reports_its_reason(tiny):
    done = events_of(tiny, [{"strategy": "sliding_window"}, {"strategy": "dynamic"}])[-1]
    assert done.results[0].status == "unavailable" and "no sliding-window layers" in done.results[0].message
    assert done.results[1].status == "ok"


class Counting(Dynamic):
    """Counts its forward passes; the first column sets the stop event at its 20th and
    snapshots every column's count at that moment."""

    def __init__(self, board, index, stop):
        super().__init__()
        self.board, self.index, self.stop = board, index, stop

    def forward(self, loaded, cache, sequence, new_tokens):
        logits = super().forward(loaded, cache, sequence, new_tokens)
        with self.board["lock"]:
            self.board["calls"][self.index] += 1
            if self.index == 0 and self.board["calls"][0] == 20:
                self.stop.set()
                self.board["at_stop"] = list(self.board["calls"])
        return logits


@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_stop_ends_every_column_within_two_tokens(tiny, mode):
    stop = threading.Event()
    board = {"lock": threading.Lock(), "calls": [0, 0, 0], "at_stop": None}
    long = GenerationSettings(max_new_tokens=2000, stop_at_eos=False, fidelity=False)
    columns = [Counting(board, i, stop) for i in range(3)]
    done = collect(run_compare(tiny, PROMPT, columns, long, mode, stop))
    assert done.stopped and board["at_stop"] is not None
    for result, before in zip(done.results, board["at_stop"]):
        assert result.status == "ok" and result.stopped and "stopped after" in result.message
        assert len(result.token_ids) - before <= 2
    assert not [t for t in threading.enumerate() if t.name.startswith("kvlab-") and not t.name.startswith("kvlab-compute")]


def test_abandoning_the_event_stream_stops_the_workers(tiny):
    long = GenerationSettings(max_new_tokens=2000, stop_at_eos=False, fidelity=False)
    stream = run_compare(tiny, PROMPT, [{"strategy": "dynamic"}, {"strategy": "dynamic"}], long)
    for event in stream:
        if isinstance(event, TokenEvent) and event.step == 5:
            break
    stream.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("kvlab-") and not t.name.startswith("kvlab-compute")]


def test_compute_runs_steps_one_at_a_time_in_arrival_order_on_one_thread():
    active, peak, order, names = [0], [0], [], set()
    lock = threading.Lock()
    submitted = threading.Semaphore(0)

    def step(name):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        names.add(threading.current_thread().name)
        order.append(name)
        time.sleep(0.002)
        with lock:
            active[0] -= 1
        return name

    def worker(name):
        for _ in range(5):
            assert compute(step, name) == name
        submitted.release()

    threads = [threading.Thread(target=worker, args=(n,)) for n in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1
    assert sorted(order) == sorted("abc" * 5)
    assert len(names) == 1 and names.pop().startswith("kvlab-compute")
    # FIFO: a call queued behind a slow one waits for it.
    gate = threading.Event()
    first = threading.Thread(target=compute, args=(gate.wait, 5))
    first.start()
    time.sleep(0.05)
    seen = []
    second = threading.Thread(target=lambda: seen.append(compute(lambda: gate.is_set())))
    second.start()
    time.sleep(0.05)
    gate.set()
    first.join()
    second.join()
    assert seen == [True]


def test_the_next_turn_goes_to_the_column_that_used_the_least_compute():
    from kvlab.compare.turns import least_used

    used = {"no_cache": 0.0, "dynamic": 0.0, "sink": 0.0}  # in the order they first asked
    assert least_used(used, {"sink", "dynamic", "no_cache"}) == "no_cache"  # a tie goes to who asked first
    used.update(no_cache=0.9, dynamic=0.05, sink=0.04)
    assert least_used(used, {"no_cache", "dynamic", "sink"}) == "sink"
    assert least_used(used, {"no_cache", "dynamic"}) == "dynamic"  # round-robin would give no_cache its turn
    assert least_used(used, {"no_cache"}) == "no_cache"  # work-conserving: a lone waiter always runs


def test_compute_turns_run_every_step_of_every_column_one_at_a_time():
    from kvlab.compare.turns import ComputeTurns

    turns, order, lock, running, overlaps = ComputeTurns(), [], threading.Lock(), [], []

    def column(name, cost_s, steps):
        def step():
            with lock:
                order.append(name)
                running.append(1)
                overlaps.append(len(running) > 1)  # never two steps at once
            time.sleep(cost_s)
            with lock:
                running.pop()
        for _ in range(steps):
            turns.turn(step)

    workers = [threading.Thread(target=column, args=args) for args in (("slow", 0.02, 3), ("fast", 0.002, 12))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert order.count("fast") == 12 and order.count("slow") == 3 and not any(overlaps)


def test_compute_raises_in_the_caller_nests_inline_and_iterates():
    with pytest.raises(ZeroDivisionError):
        compute(lambda: 1 / 0)
    assert compute(lambda: compute(lambda: threading.current_thread().name)).startswith("kvlab-compute")

    def numbers():
        for n in range(3):
            yield n, threading.current_thread().name

    items = list(compute_iter(numbers()))
    assert [n for n, _ in items] == [0, 1, 2]
    assert all(name.startswith("kvlab-compute") for _, name in items)
    closed = []

    def endless():
        try:
            while True:
                yield 1
        finally:
            closed.append(threading.current_thread().name)

    stream = compute_iter(endless())
    assert next(stream) == 1
    stream.close()
    assert len(closed) == 1 and closed[0].startswith("kvlab-compute")


def test_bad_mode_and_column_counts_fail_before_running(tiny):
    with pytest.raises(ValueError, match="mode must be one of"):
        events_of(tiny, [{"strategy": "dynamic"}], mode="turbo")
    with pytest.raises(ValueError, match="no strategy picked"):
        events_of(tiny, [])
    with pytest.raises(ValueError, match="at most 8 columns"):
        events_of(tiny, [{"strategy": "dynamic"}] * 9)


def test_sampling_columns_draw_the_same_random_numbers(tiny):
    sampled = GenerationSettings(max_new_tokens=10, do_sample=True, temperature=1.5, top_k=50, seed=3, stop_at_eos=False)
    done = events_of(tiny, [{"strategy": "dynamic"}, {"strategy": "static"}, {"strategy": "no_cache"}], sampled)[-1]
    assert done.results[0].token_ids == done.results[1].token_ids == done.results[2].token_ids
    other_seed = events_of(tiny, [{"strategy": "dynamic"}], GenerationSettings(
        max_new_tokens=10, do_sample=True, temperature=1.5, top_k=50, seed=4, stop_at_eos=False))[-1]
    assert other_seed.results[0].token_ids != done.results[0].token_ids


def test_parallel_threads_share_the_cores():
    assert [parallel_threads(columns, 2) for columns in (1, 2, 4)] == [2, 1, 1]
    assert [parallel_threads(columns, 16) for columns in (1, 3, 4, 8)] == [16, 5, 4, 2]


def test_shared_threads_set_the_compute_thread_and_restore_after_the_last_overlapping_run():
    before = compute(torch.get_num_threads)
    try:
        compute(torch.set_num_threads, 4)
        first, second = shared_threads(2), shared_threads(4)
        assert first.__enter__() == 2
        assert compute(torch.get_num_threads) == 2
        assert second.__enter__() == 2  # the first run's share holds while it goes
        first.__exit__(None, None, None)
        assert compute(torch.get_num_threads) == 2  # the second run is still going
        second.__exit__(None, None, None)
        assert compute(torch.get_num_threads) == 4
    finally:
        compute(torch.set_num_threads, before)


def test_shared_threads_restore_when_the_run_is_drained_from_other_threads(tiny):
    before = compute(torch.get_num_threads)
    settings = GenerationSettings(max_new_tokens=3, stop_at_eos=False, fidelity=False)
    for _ in range(2):
        stream = run_compare(tiny, PROMPT, [{"strategy": "dynamic"}, {"strategy": "static"}], settings, "parallel")
        box = []
        starter = threading.Thread(target=lambda: box.append(next(stream)))
        starter.start()
        starter.join()
        drainer = threading.Thread(target=lambda: box.extend(stream))
        drainer.start()
        drainer.join()
        assert isinstance(box[-1], RunDone)
        assert compute(torch.get_num_threads) == before
    fresh = []
    probe = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    probe.start()
    probe.join()
    assert fresh == [before]


@pytest.mark.parametrize("mode", ["parallel", "fair"])
def test_parallel_runs_use_a_share_of_the_threads_and_give_them_back(tiny, mode):
    before = compute(torch.get_num_threads)
    seen = []
    settings = GenerationSettings(max_new_tokens=3, stop_at_eos=False, fidelity=False)
    for event in run_compare(tiny, PROMPT, [{"strategy": "dynamic"}, {"strategy": "static"}], settings, mode):
        if isinstance(event, TokenEvent):
            seen.append(compute(torch.get_num_threads))
    expected = parallel_threads(2, before) if mode == "parallel" else before
    assert seen and set(seen) == {expected}
    assert compute(torch.get_num_threads) == before


def test_an_unfinished_stream_at_interpreter_exit_closes_quietly():
    import subprocess
    import sys

    code = ("from kvlab.compute import compute_iter\n"
            "def numbers():\n"
            "    try:\n"
            "        yield from range(10)\n"
            "    finally:\n"
            "        print('closed')\n"
            "stream = compute_iter(numbers())\n"
            "print(next(stream))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "closed"]
    assert "Exception ignored" not in proc.stderr
