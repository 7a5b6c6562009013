"""Scored eviction on a hybrid model (Gemma 3 layout, built tiny and random): the full-attention layers are
pruned to the budget and the sliding layers keep their window, as kvpress leaves them; every method runs,
Expected Attention with Gemma 3's per-layer-type rotary tables, also while decoding."""

import pytest
import torch

from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.strategies import STRATEGIES, make_strategy
from kvlab.strategies.scored import ScoredEviction
from tests.conftest import TINY_HYBRID_WINDOW

EVICTING = [name for name, cls in STRATEGIES.items() if issubclass(cls, ScoredEviction)]  # the kvpress presses
SMALL_WINDOW = {"snapkv": {"window_size": 8}, "pyramidkv": {"window_size": 8}}
PROMPT_TOKENS = 40
NEW_TOKENS = 14


@pytest.mark.parametrize("compress_every", [0, 10])
@pytest.mark.parametrize("name", EVICTING)
def test_full_layers_are_pruned_and_sliding_layers_keep_their_window(tiny_hybrid, name, compress_every):
    spec = {"strategy": name, "compression_ratio": 0.5, "compress_every": compress_every, **SMALL_WINDOW.get(name, {})}
    strategy = make_strategy(spec)
    assert strategy.unavailable_reason(tiny_hybrid) is None
    ids = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    cache = strategy.build_cache(tiny_hybrid, PROMPT_TOKENS + NEW_TOKENS)
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    steps = list(Decoder(tiny_hybrid, strategy, cache, ids, settings))
    assert len(steps) == NEW_TOKENS
    fed = NEW_TOKENS - 1
    types = tiny_hybrid.config.layer_types
    record = cache.eviction
    for index, layer in enumerate(cache.layers):
        if types[index] == "sliding_attention":
            assert index in record.skipped and index not in record.layers
            assert layer.keys.shape[2] == TINY_HYBRID_WINDOW - 1  # the window, as dynamic keeps it
        else:
            kept = strategy.kept_tokens(PROMPT_TOKENS, index, tiny_hybrid.config, tiny_hybrid.model.dtype)
            assert layer.keys.shape[2] == kept + (fed % compress_every if compress_every else fed)
            assert kept < PROMPT_TOKENS
