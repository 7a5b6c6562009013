"""The sharing wing on a fake clock: costs, caps, the fair order, positions and waits, and release.

- Cost: token steps from columns × (new + prompt ÷ 16), a cache-less column paying its sequence per step; a
  run's seconds from the measured rate (the prior before any run, then the median of finished runs).
- Caps: a run over the per-run cap, a client over its runs, and a run when the line is full are refused in one
  line naming the setting, and nothing is queued; bad settings are refused at start-up naming the setting.
- Order: the slot goes to the client with the least service in the window, earliest first among equals: a
  newcomer goes before a busy client's queued runs; a client's old use stops counting after the window.
- Position and wait: the sum of what runs now has left and the runs ahead; a stopped or disconnected waiting
  run leaves the line and the next run starts when a running one is released.
"""

import threading

import pytest

from kvlab.sharing.cost import PREFILL_TOKENS_PER_STEP, PRIOR_S_PER_STEP, RunCost, Throughput, prompt_tokens
from kvlab.sharing.limits import MAX_RUN_STEPS, Limits
from kvlab.sharing.scheduler import Client, Refused, Scheduler


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


VISITOR = Client("visitor", "page-1")
AGENT = Client("api", "10.0.0.1")
OTHER = Client("api", "10.0.0.2")
SMALL = RunCost(columns=2, new_tokens=10)  # 20 steps


def scheduler(**limits) -> tuple[Scheduler, Clock]:
    clock = Clock()
    return Scheduler(Limits(**limits), clock=clock, rate=Throughput(prior_s=1.0)), clock


# ----- cost -----

def test_a_run_costs_columns_times_new_tokens_and_a_sixteenth_of_its_prompt():
    assert RunCost(8, 512).steps == 4096
    assert RunCost(2, 10, prompt_tokens=64).steps == 2 * (10 + 64 // PREFILL_TOKENS_PER_STEP)
    no_cache = RunCost(2, 10, prompt_tokens=64, full_sequence_columns=1)
    assert no_cache.steps == RunCost(2, 10, 64).steps + 10 * (64 + 5) // 16 + 1
    assert RunCost(8, 512, 1024).describe() == "8 columns × (512 new + 1,024 prompt tokens)"
    assert prompt_tokens("x" * 300) > 300 / 4  # errs long


def test_seconds_come_from_the_prior_then_from_measured_runs():
    rate = Throughput()
    assert rate.estimate_s(RunCost(1, 10)) == pytest.approx(10 * PRIOR_S_PER_STEP) and rate.measured() == 0
    for seconds in (2.0, 4.0, 100.0):
        rate.record(RunCost(1, 10), seconds)
    assert rate.s_per_step() == pytest.approx(0.4)  # the median: one odd run does not swing it
    rate.record(RunCost(1, 10), 0.0)
    assert rate.measured() == 3


# ----- caps -----

def test_a_run_over_the_per_run_cap_is_refused_before_it_is_queued():
    s, _ = scheduler(run_steps=100)
    with pytest.raises(Refused) as refused:
        s.admit(AGENT, RunCost(8, 512))
    message = str(refused.value)
    assert "\n" not in message and "KVLAB_MAX_RUN_STEPS" in message and "4,096 token steps" in message
    assert "8 columns × (512 new tokens)" in message
    assert s.counts() == (0, 0)


def test_a_client_over_its_runs_and_a_full_line_are_refused_in_one_line():
    s, _ = scheduler(runs_per_client=2, waiting=2)
    s.admit(AGENT, SMALL), s.admit(AGENT, SMALL)
    with pytest.raises(Refused, match=r"^refused: you have 2 runs queued already.*KVLAB_MAX_RUNS_PER_CLIENT"):
        s.admit(AGENT, SMALL)
    s.admit(OTHER, SMALL)
    with pytest.raises(Refused, match=r"^refused: 2 runs are waiting already.*KVLAB_MAX_WAITING.*about \d+ s$"):
        s.admit(VISITOR, SMALL)
    assert s.counts() == (1, 2)


@pytest.mark.parametrize("name, value", [("KVLAB_MAX_RUN_STEPS", "0"), ("KVLAB_MAX_RUNS_PER_CLIENT", "two"),
                                         ("KVLAB_MAX_WAITING", "-1"), ("KVLAB_CONCURRENCY", "1.5")])
def test_a_bad_setting_is_refused_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"^{name} must be a whole number"):
        Limits.from_env()


def test_settings_change_the_caps(monkeypatch):
    assert Limits.from_env().run_steps == MAX_RUN_STEPS
    monkeypatch.setenv("KVLAB_MAX_RUN_STEPS", "512")
    monkeypatch.setenv("KVLAB_MAX_WAITING", "0")
    assert (Limits.from_env().run_steps, Limits.from_env().waiting) == (512, 0)


# ----- the order -----

def test_a_newcomer_goes_before_a_busy_clients_queued_runs():
    s, clock = scheduler(runs_per_client=3)
    first = s.admit(AGENT, SMALL)
    assert s.started(first)
    clock.now += 30
    queued = [s.admit(AGENT, SMALL), s.admit(OTHER, SMALL)]
    visitor = s.admit(VISITOR, SMALL)
    s.release(first, completed=True)
    # AGENT used 30 s; OTHER and the visitor none: they go in arrival order, then AGENT's.
    assert s.started(queued[1]) and not s.started(visitor)
    clock.now += 5
    s.release(queued[1], completed=True)
    assert s.started(visitor) and not s.started(queued[0])


def test_use_older_than_the_window_stops_counting():
    s, clock = scheduler(window_s=60)
    old = s.admit(AGENT, SMALL)
    clock.now += 50
    s.release(old, completed=True)
    assert s.service_s(AGENT) == pytest.approx(50)
    clock.now += 40  # the window starts 30 s into that run: its last 20 s count
    assert s.service_s(AGENT) == pytest.approx(20)
    clock.now += 100
    assert s.service_s(AGENT) == 0


# ----- position and wait -----

def test_a_waiting_run_knows_its_position_and_the_seconds_before_it():
    s, clock = scheduler()
    running = s.admit(AGENT, RunCost(1, 60))  # 60 s at 1 s per step
    clock.now += 20
    second, third = s.admit(OTHER, RunCost(1, 30)), s.admit(VISITOR, RunCost(1, 5))
    assert s.place(running) is None
    assert s.place(second).position == 1 and s.place(second).wait_s == pytest.approx(40)
    place = s.place(third)
    assert (place.position, place.wait_s) == (2, pytest.approx(70))
    assert place.describe() == "waiting: position 2, about 70 s"


def test_a_run_that_leaves_the_line_frees_its_place_and_a_released_slot_starts_the_next():
    s, clock = scheduler()
    running = s.admit(AGENT, SMALL)
    gone, waiting = s.admit(OTHER, SMALL), s.admit(VISITOR, SMALL)
    s.release(gone)  # stopped, or its client disconnected, while it waited
    assert s.place(waiting).position == 1 and s.counts() == (1, 1)
    started = []
    waiter = threading.Thread(target=lambda: started.append(s.wait(waiting, timeout_s=30)))
    waiter.start()
    clock.now += 3
    s.release(running)  # not completed: the rate is not taught by a stopped run
    waiter.join(30)
    assert started == [True] and s.rate.measured() == 0
    clock.now += 4
    s.release(waiting, completed=True)
    s.release(waiting, completed=True)  # idempotent
    assert s.counts() == (0, 0) and s.rate.measured() == 1
    assert s.wait(gone, timeout_s=0) is False
