"""GPU tier: the offloaded strategies on CUDA, with the tiny random Llama (skipped where torch has no CUDA).

An offloaded cache must give the same greedy tokens as its in-GPU counterpart,
hold the same bytes in all, and have them split between host and GPU memory:
after a run on the 2-layer model, the last layer updated has been offloaded to
the CPU and the first one prefetched back to the GPU for the next step.
"""

import pytest
import torch
from transformers import DynamicCache, StaticCache

from kvlab.accounting import cache_bytes, cache_bytes_by_device
from kvlab.strategies import make_strategy

NEW_TOKENS = 8
PROMPT_IDS = [1, 400, 401, 402, 403, 404]


def generate(loaded, cache) -> list[int]:
    ids = torch.tensor([PROMPT_IDS], device=loaded.device)
    with torch.inference_mode():
        out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache,
                                    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    torch.cuda.synchronize()
    return out[0, len(PROMPT_IDS):].tolist()


@pytest.mark.parametrize("name", ["offloaded", "offloaded_static"])
def test_offloaded_cache_runs_on_cuda_and_its_bytes_are_counted_on_both_devices(tiny_cuda, name):
    strategy = make_strategy({"strategy": name})
    assert strategy.unavailable_reason(tiny_cuda) is None
    total_tokens = len(PROMPT_IDS) + NEW_TOKENS
    if name == "offloaded":
        reference_cache = DynamicCache()
    else:
        reference_cache = StaticCache(config=tiny_cuda.config, max_cache_len=total_tokens)
    reference = generate(tiny_cuda, reference_cache)

    cache = strategy.build_cache(tiny_cuda, total_tokens)
    assert generate(tiny_cuda, cache) == reference

    by_device = cache_bytes_by_device(cache)
    on_gpu = sum(size for device, size in by_device.items() if device.startswith("cuda"))
    assert by_device.get("cpu", 0) > 0 and on_gpu > 0, by_device
    assert sum(by_device.values()) == cache_bytes(reference_cache)
