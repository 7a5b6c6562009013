"""Background work yields to everyone else (`kvlab.compute.when_idle`), and the planner's one-time warm-up is a
step of the model's load (`kvlab.ui.plan.warm`). Behaviour only (the order things ran in), never a time."""

import threading

import pytest

from kvlab import compute as compute_module
from kvlab.compute import compute, idle_s, when_idle
from kvlab.ui.plan import warm

pytestmark = pytest.mark.unit


def test_background_work_waits_until_the_compute_thread_is_quiet():
    order, started, release = [], threading.Event(), threading.Event()

    def busy():
        started.set()
        release.wait(30)
        order.append("foreground")

    worker = threading.Thread(target=compute, args=(busy,))
    worker.start()
    started.wait(30)
    assert idle_s() == 0.0  # a call is running
    background = threading.Thread(target=lambda: order.append(when_idle(lambda: "background", quiet_s=0.2)))
    background.start()
    background.join(0.5)
    assert background.is_alive() and order == []  # still waiting for the foreground call
    release.set()
    worker.join(30)
    background.join(30)
    assert order == ["foreground", "background"]


def test_background_work_asked_to_stop_never_runs():
    ran, stop = [], threading.Event()
    stop.set()
    assert when_idle(lambda: ran.append(1), quiet_s=3600, stop=stop) is None and ran == []


def test_the_planners_warm_up_is_a_load_step_run_once_per_process(monkeypatch):
    calls, said = [], []
    monkeypatch.setattr(warm, "warm_up", lambda: calls.append(threading.current_thread().name))
    monkeypatch.setattr(warm, "_warmed", threading.Event())
    step = warm.PlannerWarmUp()
    step(None, lambda fraction, message: said.append(message))
    step(None, lambda fraction, message: said.append(message))
    warm.warm_planner_once()
    assert len(calls) == 1 and calls[0].startswith(compute_module.THREAD_NAME)
    assert said == ["warming up the planner once (the Plan tab)"]
