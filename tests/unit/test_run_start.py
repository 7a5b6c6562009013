"""A streaming tab's run start (kvlab.ui.shared.runs.load_and_plan): the loading line, then the model and the
plan, or one refusal line and no run."""

import pytest

from kvlab.models.loading import ModelLoadError
from kvlab.strategies import StrategyError
from kvlab.ui.shared.runs import LOADING, load_and_plan

STATUS = "status"


class Pool:
    """Hands out `model` for any spec, or raises `error`; remembers the sources asked for."""

    def __init__(self, model="the model", error=None):
        self.model, self.error, self.asked = model, error, []

    def get(self, spec, progress=None):
        self.asked.append(spec.source)
        if self.error:
            raise self.error
        return self.model


def drive(start):
    """(the updates yielded, the value returned) of a `load_and_plan` generator."""
    updates = []
    try:
        while True:
            updates.append(next(start))
    except StopIteration as done:
        return updates, done.value


def test_a_run_starts_with_the_loading_line_then_gets_the_model_and_its_plan():
    pool = Pool()
    updates, ready = drive(load_and_plan(pool, "bundled", STATUS, lambda model: f"plan for {model}",
                                         first={"download": None}))
    assert updates == [{STATUS: LOADING, "download": None}]
    assert ready == ("the model", "plan for the model") and pool.asked == ["bundled"]


def test_a_refused_start_is_one_inert_status_line_and_no_run():
    for pool, plan in ((Pool(error=ModelLoadError("no such *model*")), str),
                       (Pool(), lambda model: (_ for _ in ()).throw(StrategyError("no such cache"))),
                       (Pool(), lambda model: int("x"))):
        updates, ready = drive(load_and_plan(pool, "bundled", STATUS, plan))
        assert ready is None and updates[0] == {STATUS: LOADING} and list(updates[1]) == [STATUS]
        assert updates[1][STATUS].startswith("⚠️ ") and "\n" not in updates[1][STATUS]
    updates, _ = drive(load_and_plan(Pool(error=ModelLoadError("no such *model*")), "bundled", STATUS, str))
    assert "*model*" not in updates[1][STATUS]  # the reason cannot style the page


def test_only_the_refusals_named_end_the_start_quietly():
    start = load_and_plan(Pool(), "bundled", STATUS, lambda model: 1 / 0)
    assert next(start) == {STATUS: LOADING}
    with pytest.raises(ZeroDivisionError):  # the tab's to handle, not a status line
        next(start)
