"""The planner keeps its measurements per model and strategy (`kvlab.plan.measured`), and its warm-up plans every
strategy it lists.

Catalog configs only (no weights, no bundled model). Behaviour only: hits, misses and the figures, never times.
"""

import pytest

from kvlab.plan import measured, planner
from kvlab.plan.meter import StrategyMeter
from kvlab.plan.planner import GIB, PlanRequest, plan
from kvlab.strategies import STRATEGIES as STRATEGIES_REGISTERED, StrategyError, make_strategy

pytestmark = pytest.mark.unit

MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"
STRATEGIES = ({"strategy": "dynamic"}, {"strategy": "quantized", "backend": "quanto", "nbits": 4},
              {"strategy": "sink", "window_length": 1024})


@pytest.fixture
def fresh(monkeypatch):
    """No kept measurement at the start; every layer measurement the meter makes is counted."""
    measured.forget_all()
    fed = []
    original = StrategyMeter._feed

    def counting(self, cache, group, chunks, device):
        fed.append((self.strategy.describe(), tuple(chunks)))
        return original(self, cache, group, chunks, device)

    monkeypatch.setattr(StrategyMeter, "_feed", counting)
    yield fed
    measured.forget_all()


def _request(**change) -> PlanRequest:
    return PlanRequest(**{"model": MISTRAL, "contexts": (1024, 4096, 16384, 65536, 131072), "dtype": "bfloat16",
                          "strategies": STRATEGIES, "budget_bytes": 24 * GIB, **change})


def test_a_second_plan_of_the_same_model_reads_its_figures_back_identical(fresh):
    first = plan(_request()).to_json()
    measured_first = len(fresh)
    assert measured_first > 0 and measured.cache_info()["misses"] == len(STRATEGIES)
    second = plan(_request()).to_json()
    assert second == first
    assert len(fresh) == measured_first  # nothing measured again
    assert measured.cache_info()["hits"] == len(STRATEGIES)


def test_a_new_context_list_measures_only_the_new_contexts_and_agrees_with_a_fresh_plan(fresh):
    plan(_request())
    before = len(fresh)
    kept = plan(_request(contexts=(1024, 3000, 131072))).to_json()
    new = fresh[before:]
    assert new and all(sum(chunks) in (3000,) for _, chunks in new)  # 1024 and 131072 were measured already
    measured.forget_all()
    assert plan(_request(contexts=(1024, 3000, 131072))).to_json() == kept


def test_a_changed_strategy_misses_and_is_measured(fresh):
    plan(_request(strategies=({"strategy": "quantized", "backend": "quanto", "nbits": 4},)))
    before = len(fresh)
    changed = plan(_request(strategies=({"strategy": "quantized", "backend": "quanto", "nbits": 2},)))
    assert len(fresh) > before and {name for name, _ in fresh[before:]} == {"quantized quanto int2 r128"}
    assert measured.cache_info() == {"hits": 0, "misses": 2, "kept": 2}
    four = plan(_request(strategies=({"strategy": "quantized", "backend": "quanto", "nbits": 4},)))
    assert changed.strategies[0].cells[-1].cache_bytes < four.strategies[0].cells[-1].cache_bytes


def test_batch_dtype_and_model_are_part_of_the_key(fresh):
    plan(_request())
    for change in ({"batch": 2}, {"dtype": "float32"}, {"model": "Qwen/Qwen3-8B"}):
        before = measured.cache_info()["misses"]
        plan(_request(**change))
        assert measured.cache_info()["misses"] == before + len(STRATEGIES), change


def test_the_table_keeps_at_most_its_limit(fresh, monkeypatch):
    monkeypatch.setattr(measured, "MEASUREMENTS_KEPT", 2)
    plan(_request())
    assert measured.cache_info()["kept"] == 2
    plan(_request(strategies=STRATEGIES[-1:]))  # the newest entry is still there
    assert measured.cache_info()["hits"] == 1


def test_warm_up_plans_every_listed_strategy_even_past_one_requests_limit(monkeypatch):
    asked = []
    monkeypatch.setattr(planner, "plan", lambda request: asked.extend(request.strategies))
    monkeypatch.setattr(planner, "MAX_STRATEGIES", 4)
    planner.warm_up()
    backends = {spec.get("backend") for spec in asked if spec["strategy"] == "quantized"}
    assert {"hqq", "fp8"} <= backends
    buildable = []
    for name in STRATEGIES_REGISTERED:
        try:
            make_strategy({"strategy": name})
        except StrategyError:
            continue
        buildable.append(name)
    assert {spec["strategy"] for spec in asked} == set(buildable)
