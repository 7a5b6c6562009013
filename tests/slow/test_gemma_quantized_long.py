"""Slow tier: quantized caches on the bundled Gemma 3 270M after a 4,000-token prompt (`make test-slow`): quanto
int4 quantizes the 3 full-attention layers and leaves the 15 sliding layers their window, holding at most 0.55 of
dynamic's bytes, exactly what Plan predicts. The same claim at the model's shapes without weights is in
tests/unit/test_hybrid_quantized.py; `scripts/quant_figures.py gemma` prints the figures."""

import pytest
import torch

from kvlab.accounting import cache_bytes
from kvlab.plan.planner import PlanRequest, plan
from kvlab.quality.defaults import shipped_text
from kvlab.strategies import make_strategy

PROMPT_TOKENS = 4000
SPECS = ({"strategy": "dynamic"}, {"strategy": "quantized", "backend": "quanto", "nbits": 4},
         {"strategy": "rotation_quantized"})


@pytest.fixture(scope="module")
def prefilled(gemma):
    ids = gemma.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :PROMPT_TOKENS]
    assert ids.shape[1] == PROMPT_TOKENS
    held = {}
    for spec in SPECS:
        strategy = make_strategy(spec)
        cache = strategy.build_cache(gemma, PROMPT_TOKENS)
        with torch.inference_mode():
            strategy.forward(gemma, cache, ids, PROMPT_TOKENS)
        held[strategy.describe()] = cache_bytes(cache)
    return held


def test_quanto_int4_holds_at_most_0_55_of_dynamic_and_plan_predicts_every_column(prefilled):
    dynamic, quanto = prefilled["dynamic"], prefilled["quantized quanto int4 r128"]
    assert quanto <= 0.55 * dynamic and prefilled["rotation k4/v4 r128"] < quanto
    planned = plan(PlanRequest(model="bundled:gemma-3-270m", contexts=(PROMPT_TOKENS,), dtype="float32",
                               strategies=SPECS)).strategies
    assert {strategy.name: strategy.cells[0].cache_bytes for strategy in planned} == prefilled
