"""The recurrent-state cache on a tiny Mamba-2 with seeded random weights (structure only: random weights, the
text means nothing): its state bytes are the same at 64 and 4,096 tokens while a KV cache grows linearly, and a
crop either reproduces a fresh run's logits (a transformers that rolls the state back) or is reported with its
reason."""

import torch
import transformers

from kvlab.accounting import cache_bytes
from kvlab.recurrent.state import CROP_TOLERANCE, STRUCTURE_ONLY, crop_error, crop_reason, state_bytes, tiny_mamba2


def test_the_state_bytes_do_not_grow_with_the_sequence_while_a_kv_cache_does(tiny):
    model = tiny_mamba2()
    short, long = state_bytes(model, 64), state_bytes(model, 4096)
    assert short == long > 0
    layers, (heads, head_dim, state) = 2, (4, 32, 16)
    conv_channels, kernel = 2 * 64 + 2 * state, 4  # expand × hidden + 2 × groups × state
    assert short == layers * (heads * head_dim * state + conv_channels * kernel) * 4
    kv = []
    for tokens in (64, 1024):
        with torch.inference_mode():
            kv.append(cache_bytes(tiny.model(torch.ones(1, tokens, dtype=torch.long), use_cache=True).cache))
    assert kv[1] == 16 * kv[0]
    assert "random weights" in STRUCTURE_ONLY


def test_a_crop_rolls_the_state_back_or_is_reported_with_its_reason():
    model = tiny_mamba2()
    reason = crop_reason(model)
    if reason is None:
        assert crop_error(model) <= CROP_TOLERANCE
    else:
        assert transformers.__version__ in reason and "\n" not in reason
        assert crop_error(model) > CROP_TOLERANCE
