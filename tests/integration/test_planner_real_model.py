"""Truth check on the real bundled model: the plan equals what a real Compare run measures, to the byte.

One Compare run (kvlab's runner, fair mode, greedy, fp32 on CPU) of a short prompt
under no_cache, dynamic, static, sink and quantized quanto/hqq/fp8; the planner,
given only `bundled`, must give each column's exact cache bytes at every step
(prompt prefilled, then one token per step), and the model's weights bytes.
"""

import pytest

from kvlab.compare.events import StepMetrics
from kvlab.compare.runner import run_compare
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.plan.planner import PlanRequest, plan

pytestmark = pytest.mark.integration

NEW_TOKENS = 12
COLUMNS = [
    {"strategy": "no_cache"},
    {"strategy": "dynamic"},
    {"strategy": "static"},
    {"strategy": "sink", "window_length": 12, "num_sink_tokens": 4},
    {"strategy": "quantized", "backend": "quanto", "nbits": 4, "residual_length": 4},
    {"strategy": "quantized", "backend": "hqq", "nbits": 4, "residual_length": 4},
    {"strategy": "quantized", "backend": "fp8"},
]


@pytest.fixture(scope="module")
def compare_run(bundled):
    prompt = encode_prompt(bundled.tokenizer, "List three primary colours.")
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    steps: dict[int, list[tuple[int, int]]] = {}
    done = None
    for event in run_compare(bundled, prompt, COLUMNS, settings):
        if isinstance(event, StepMetrics):
            steps.setdefault(event.column, []).append((event.seen_tokens, event.cache_bytes))
        done = event
    return prompt.shape[1], steps, done.results


@pytest.mark.parametrize("index", range(len(COLUMNS)), ids=[str(spec) for spec in COLUMNS])
def test_plan_equals_the_compare_run_at_every_step(compare_run, index):
    prompt_tokens, steps, results = compare_run
    spec = COLUMNS[index]
    assert results[index].status == "ok", results[index].message
    measured = steps[index]
    assert len(measured) == NEW_TOKENS
    if spec["strategy"] == "static":  # allocated for prompt + max_new_tokens before the first step
        planned = plan(PlanRequest(contexts=(prompt_tokens + NEW_TOKENS,), dtype="float32", strategies=(spec,)))
        expected = [planned.strategies[0].cells[0].cache_bytes] * NEW_TOKENS
    else:
        planned = plan(PlanRequest(contexts=tuple(seen for seen, _ in measured), dtype="float32",
                                   strategies=(spec,), prefill_tokens=prompt_tokens))
        expected = [cell.cache_bytes for cell in planned.strategies[0].cells]
    assert [size for _, size in measured] == expected
    if spec["strategy"] == "sink":
        assert prompt_tokens > spec["window_length"] and len(set(expected)) == 1


def test_weights_bytes_equal_the_loaded_parameters(bundled):
    planned = plan(PlanRequest(contexts=(1,), dtype="float32"))
    loaded = sum(p.numel() * p.element_size() for p in bundled.model.parameters())
    assert planned.strategies[0].cells[0].weights_bytes == loaded
    assert planned.model["name"] == bundled.name and planned.model["origin"] == "bundled"
