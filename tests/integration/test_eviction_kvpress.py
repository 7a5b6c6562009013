"""kvlab's eviction strategies against NVIDIA kvpress 0.5.5 on the bundled model (ratio 0.5).

The fixture `tests/fixtures/kvpress/kvpress_0.5.5.npz` holds, per press, prompt and mode (`aware`: the whole
prompt compressed; `agnostic`: the context compressed, the question fed afterwards, kvpress's pipeline), the
positions kvpress kept per layer and KV head and its first greedy tokens; `make_fixture.py` beside it says how
it was made. Each kvlab run must keep the same positions, except where kvlab's scores tie (to
TIE_TOLERANCE relative) with the last kept one (kvpress computes attention through SDPA or eager
attention, kvlab through its own matmul: the same numbers to float32 rounding), and give the same tokens.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.strategies import make_strategy

FIXTURE = Path(__file__).parents[1] / "fixtures" / "kvpress" / "kvpress_0.5.5.npz"
TIE_TOLERANCE = 1e-4
"""Relative score gap under which two positions count as tied (float32 rounding of different kernels)."""


def load_fixture():
    data = np.load(FIXTURE)
    return data, json.loads(bytes(data["meta"]).decode())


DATA, META = load_fixture() if FIXTURE.exists() else (None, {"runs": {}})
RUNS = sorted(key for key, run in META["runs"].items() if "tokens" in run)


def kvlab_run(loaded, key):
    """(kept mask (layers, kv_heads, seq) bool, scores (layers, kv_heads, seq), tokens) of kvlab's run `key`."""
    method, prompt, mode = key.split("/")
    context, question = DATA[f"{prompt}_context"], DATA[f"{prompt}_question"]
    spec = {"strategy": method, "compression_ratio": META["ratio"]}
    if mode == "agnostic":
        spec.update(query_aware=False, question_tokens=len(question))
    strategy = make_strategy(spec)
    ids = torch.tensor(np.concatenate([context, question]).astype(np.int64))[None]
    settings = GenerationSettings(max_new_tokens=META["new_tokens"], stop_at_eos=False, fidelity=False)
    cache = strategy.build_cache(loaded, ids.shape[1] + META["new_tokens"])
    decoder = Decoder(loaded, strategy, cache, ids, settings).run()
    record = cache.eviction
    layers = sorted(record.layers)
    kept = torch.stack([record.kept_mask(i) for i in layers]).numpy()
    scores = torch.stack([record.layers[i].scores for i in layers]).numpy()
    return kept, scores, decoder.token_ids


def compare(loaded, key):
    """(positions kvpress kept, positions kept by one side only, of those not explained by a tie, tokens equal)."""
    kept, scores, tokens = kvlab_run(loaded, key)
    shape = META["runs"][key]["shape"]
    reference = np.unpackbits(DATA[f"{key}/kept"], axis=-1, count=shape[-1]).astype(bool)
    assert reference.shape == kept.shape, (reference.shape, kept.shape)
    only_kvpress = reference & ~kept
    differing = int(only_kvpress.sum() + (kept & ~reference).sum())
    untied = 0
    for layer, head, position in zip(*np.nonzero(only_kvpress)):
        row = scores[layer, head]
        threshold = row[kept[layer, head]].min()
        if abs(row[position] - threshold) > TIE_TOLERANCE * max(abs(threshold), 1e-12):
            untied += 1
    return int(reference.sum()), differing, untied, tokens == META["runs"][key]["tokens"]


@pytest.mark.skipif(not RUNS, reason="the kvpress fixture is missing: run tests/fixtures/kvpress/make_fixture.py")
@pytest.mark.parametrize("key", RUNS)
def test_kvlab_keeps_what_kvpress_keeps_and_says_the_same(bundled, key):
    total, differing, untied, same_tokens = compare(bundled, key)
    assert untied == 0, f"{key}: {untied} of {total} kept positions differ beyond ties"
    assert same_tokens, key


def test_the_fixture_covers_every_method_and_three_prompts():
    methods = {key.split("/")[0] for key in RUNS}
    assert methods == {"snapkv", "pyramidkv", "tova", "observed_attention", "knorm", "expected_attention",
                       "random"}
    for method in methods:
        assert len({key.split("/")[1] for key in RUNS if key.startswith(f"{method}/")}) >= 3
