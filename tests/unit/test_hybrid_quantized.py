"""Quantized caches on a model with sliding layers, at the bundled Gemma 3 270M's cache shapes (18 layers: 15
sliding of window 512, 3 full; 1 KV head of 256 dims; float32) without its weights: the cache fed a 4,000-token
prefill holds exactly the documented bytes, and Plan predicts them and the 32,768-token ratio."""

import pytest
import torch
from transformers import DynamicCache, Gemma3TextConfig

from kvlab.accounting import cache_bytes
from kvlab.caches.quant.transformers_layers import HybridQuantizedCache
from kvlab.plan.planner import PlanRequest, plan

LAYERS, WINDOW, HEAD_DIM, PROMPT = 18, 512, 256, 4000
TYPES = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(LAYERS)]
CONFIG = Gemma3TextConfig(num_hidden_layers=LAYERS, sliding_window=WINDOW, layer_types=TYPES, num_key_value_heads=1,
                          num_attention_heads=4, head_dim=HEAD_DIM, hidden_size=640, vocab_size=262144)
SLIDING = 15 * (2 * (WINDOW - 1) * HEAD_DIM * 4 + 8)
"""15 sliding layers keep window - 1 tokens of K and V in float32, and an 8-byte window tensor each."""


def prefill(cache) -> int:
    states = torch.randn(1, 1, PROMPT, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    for index in range(LAYERS):
        cache.update(states, states.clone(), index)
    return cache_bytes(cache)


def test_quanto_int4_after_4000_tokens_holds_the_documented_bytes_under_0_55_of_dynamic():
    dense = prefill(DynamicCache(config=CONFIG))
    assert dense == SLIDING + 3 * 2 * PROMPT * HEAD_DIM * 4
    quanto = prefill(HybridQuantizedCache("quanto", CONFIG, nbits=4, q_group_size=64, residual_length=128))
    # quanto int4: 2 values per byte, a float32 scale and shift per 64 values; the prompt is quantized at prefill
    assert quanto == SLIDING + 3 * 2 * (PROMPT * HEAD_DIM // 2 + 8 * PROMPT * HEAD_DIM // 64) == 19_538_040
    assert quanto / dense == pytest.approx(0.4851, abs=1e-4) and quanto <= 0.55 * dense


def test_plan_predicts_the_measured_bytes_and_under_0_30_of_dynamic_at_32768_tokens():
    specs = ({"strategy": "dynamic"}, {"strategy": "quantized", "backend": "quanto", "nbits": 4},
             {"strategy": "rotation_quantized"})
    dynamic, quanto, rotation = plan(PlanRequest(model=CONFIG, contexts=(PROMPT, 32768), dtype="float32",
                                                 strategies=specs)).strategies
    assert [cell.cache_bytes for cell in quanto.cells][0] == 19_538_040
    # rotation k4/v4: per vector 4 x 256 / 8 code bytes and a float16 norm; one float32 rotation and two codebooks
    assert rotation.cells[0].cache_bytes == SLIDING + 3 * 2 * PROMPT * (128 + 2) + 4 * (HEAD_DIM * HEAD_DIM + 2 * 31)
    ratios = [planned.cells[1].cache_bytes / dynamic.cells[1].cache_bytes for planned in (quanto, rotation)]
    assert ratios[0] == pytest.approx(0.2173, abs=1e-4) and max(ratios) <= 0.30
