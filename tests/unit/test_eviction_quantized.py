"""Eviction composed with quantization (`quantize` knob of the scored-eviction strategies) on the tiny random
Llama and Gemma 3: each full-attention layer is pruned at prefill, then what it kept is quantized; bytes exact to
quanto's layout and to Plan, positions kept for Inspect, knobs checked."""

import pytest
import torch

from kvlab.accounting import cache_bytes, cache_bytes_by_layer_type
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.inspect.held import held_positions
from kvlab.strategies import StrategyError, make_strategy

PROMPT_TOKENS = 1000
PER_TOKEN = 2 * 2 * 1 * 64 * 4
"""Dense K+V bytes per token of the tiny Llama: 2 layers x (K, V) x 1 KV head x 64 dims x float32."""


def quanto_int4_bytes(values: int) -> int:
    """quanto's int4 layout at q_group_size 64 in float32: 2 values per byte, a float32 scale and shift per 64."""
    return values // 2 + 2 * 4 * values // 64


def run(loaded, spec, ids, new_tokens=1):
    strategy = make_strategy(spec)
    cache = strategy.build_cache(loaded, ids.shape[1] + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    steps = list(Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True))
    return strategy, cache, steps


def test_snapkv_half_then_quanto_int4_holds_under_0_3_of_dynamic_after_a_1000_token_prefill(tiny):
    ids = torch.randint(5, 900, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    spec = {"strategy": "snapkv", "compression_ratio": 0.5, "quantize": "quanto4"}
    strategy, cache, steps = run(tiny, spec, ids)
    kept = PROMPT_TOKENS // 2
    assert [type(layer).__name__ for layer in cache.layers] == ["PrunedQuantoQuantizedLayer"] * 2
    expected = 2 * 2 * quanto_int4_bytes(kept * 64)  # layers x (K, V), nothing in the residual yet
    assert steps[0].cache_bytes == cache_bytes(cache) == expected
    assert expected <= 0.3 * PROMPT_TOKENS * PER_TOKEN  # 0.078 of dynamic's 1,024,000 B
    positions, _ = held_positions(cache.layers[0], PROMPT_TOKENS, heads=1)
    assert positions.shape == (1, kept) and positions.max() < PROMPT_TOKENS and len(set(positions[0].tolist())) == kept
    assert strategy.describe() == "snapkv 0.5 + quanto int4"


def test_plan_predicts_the_composed_bytes_step_by_step(tiny, tmp_path):
    from kvlab.plan.planner import PlanRequest, plan

    tiny.config.save_pretrained(tmp_path)
    ids = torch.randint(5, 900, (1, 100), generator=torch.Generator().manual_seed(1))
    for quantize in ("quanto4", "rotation_k4v2", "fp8"):
        spec = {"strategy": "knorm", "quantize": quantize, **({} if quantize == "fp8" else {"residual_length": 4})}
        _, _, steps = run(tiny, spec, ids, new_tokens=9)
        planned = plan(PlanRequest(model=str(tmp_path), contexts=tuple(s.seen_tokens for s in steps),
                                   dtype="float32", strategies=(spec,), prefill_tokens=100)).strategies[0]
        assert planned.status == "ok", planned.message
        assert [cell.cache_bytes for cell in planned.cells] == [s.cache_bytes for s in steps], quantize


def test_on_gemma_only_the_full_layers_are_pruned_and_quantized(tiny_hybrid):
    ids = torch.randint(5, 900, (1, 40), generator=torch.Generator().manual_seed(2))
    spec = {"strategy": "knorm", "quantize": "rotation_k4v4", "residual_length": 4}
    _, cache, steps = run(tiny_hybrid, spec, ids, new_tokens=3)
    kinds = [type(layer).__name__ for layer in cache.layers]
    assert kinds == ["DynamicSlidingWindowLayer", "PrunedRotationQuantizedLayer"] * 2
    by_type = cache_bytes_by_layer_type(cache, ["sliding_attention", "full_attention"] * 2)
    sliding = 2 * (2 * 15 * 32 * 4 + 8)  # window 16 - 1 tokens, 1 KV head x 32 dims, float32, + window tensor
    # per layer 20 kept positions packed, the 2 decoded in the full-precision residual; one table for the cache
    full = 2 * (20 * 2 * (4 * 32 // 8 + 2) + 2 * 2 * 32 * 4) + 4 * (32 * 32 + 31 + 31)
    assert by_type == {"sliding_attention": sliding, "full_attention": full} and steps[-1].cache_bytes == sliding + full


@pytest.mark.parametrize("knobs,message", [
    ({"quantize": "quanto3"}, r"quantize must be one of none, quanto2, quanto4, hqq1.*rotation_k<1-4>v<1-4>"),
    ({"quantize": "rotation_k5v2"}, "quantize must be one of"),
    ({"quantize": "quanto4", "compress_every": 80}, "cannot be combined with compress_every"),
    ({"residual_length": 16}, "needs quantize"),
])
def test_quantize_knobs_are_checked(knobs, message):
    with pytest.raises(StrategyError, match=message):
        make_strategy({"strategy": "snapkv", **knobs})


def test_the_snippet_builds_a_pruned_cache_that_quantizes(tiny):
    strategy = make_strategy({"strategy": "snapkv", "quantize": "quanto4", "residual_length": 16})
    imports, code = strategy.cache_code()
    assert "from transformers.cache_utils import QuantoQuantizedLayer" in imports
    assert "PrunedCache(model.config, quantized_layer=lambda: QuantoQuantizedLayer(nbits=4, q_group_size=64, " \
           "residual_length=16))" in code
    namespace = {"model": tiny.model}
    exec("\n".join(imports + [code]), namespace)
    assert namespace["cache"].quantized_layer().nbits == 4
