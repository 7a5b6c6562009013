"""vLLM's --kv-cache-dtype presets as Compare columns on the real bundled SmolLM2-135M (fp32, CPU; 30 layers, 3 KV
heads, head_dim 64): each column runs beside dense `dynamic`, and its bytes at every step are vLLM's page formula
per token (the first and last 2 layers dense, the rest one slot per token and KV head) plus the tables once."""

import math

import pytest

from kvlab.compare.events import StepMetrics
from kvlab.compare.runner import run_compare
from kvlab.generation import GenerationSettings, encode_prompt

pytestmark = pytest.mark.integration

LAYERS, HEADS, HEAD_DIM, FP32 = 30, 3, 64, 4
COLUMNS = [{"strategy": "dynamic"}, {"strategy": "vllm_kv_cache", "kv_cache_dtype": "turboquant_k3v4_nc"},
           {"strategy": "vllm_kv_cache", "kv_cache_dtype": "int4_per_token_head"}]


def vllm_bytes_per_token(kv_cache_dtype: str) -> int:
    """vLLM's formula for this model: TQFullAttentionSpec's num_kv_heads · slot_size_aligned on the encoded layers
    (key ceil(d·3/8) + 2, value ceil(d·4/8) + 4), FullAttentionSpec's 2 · num_kv_heads · head_dim · 4 on the
    boundary layers 0, 1, 28, 29; int4: num_kv_heads · (d/2 + d/2 + 2 · 4) on every layer."""
    if kv_cache_dtype == "int4_per_token_head":
        return LAYERS * HEADS * (HEAD_DIM // 2 + HEAD_DIM // 2 + 8)
    slot = math.ceil(HEAD_DIM * 3 / 8) + 2 + math.ceil(HEAD_DIM * 4 / 8) + 4
    return 4 * 2 * HEADS * HEAD_DIM * FP32 + (LAYERS - 4) * HEADS * (slot + slot % 2)


TABLES = {"turboquant_k3v4_nc": 4 * (HEAD_DIM * HEAD_DIM + 8 + 7), "int4_per_token_head": 4 * (HEAD_DIM * HEAD_DIM + HEAD_DIM)}
"""float32 tables counted once per cache: the Hadamard matrix and the 3-bit codebook (centroids and midpoints), or
the unnormalized Hadamard matrix and the ±1 signs."""


def test_preset_columns_run_in_compare_and_their_bytes_are_vllms_formula(bundled):
    prompt = encode_prompt(bundled.tokenizer, "Explain in two sentences why a KV cache saves compute.")
    events = list(run_compare(bundled, prompt, COLUMNS, GenerationSettings(max_new_tokens=12, stop_at_eos=False)))
    done = events[-1]
    dynamic, *presets = done.results
    assert [r.status for r in done.results] == ["ok"] * 3, [r.message for r in done.results]
    assert [r.name for r in presets] == ["vLLM turboquant_k3v4_nc", "vLLM int4_per_token_head"]
    for result in presets:
        kv_cache_dtype = result.knobs["kv_cache_dtype"]
        steps = [e for e in events if isinstance(e, StepMetrics) and e.column == result.index]
        assert len(steps) == len(result.token_ids) == 12
        assert [e.cache_bytes for e in steps] == [e.seen_tokens * vllm_bytes_per_token(kv_cache_dtype)
                                                   + TABLES[kv_cache_dtype] for e in steps]
        assert 0 < result.peak_cache_bytes < dynamic.peak_cache_bytes
        assert result.top1_agreement is not None and 0 <= result.mean_kl
