"""HQQ at axis 1 works at every length (kvlab's `HQQAxis1Layer`, the hqq backend's layer when an axis is 1).

Upstream (hqq 0.2.8, transformers 5.24) packs axis-1 groups in 8/nbits row slices, which do not pair up when the
row count is not a multiple of 8/nbits: transformers' own `HQQQuantizedLayer` then fails de-quantizing (the failure
named in docs/strategies.md). kvlab's layer pads the rows and must agree with upstream wherever upstream works.
Shapes are the bundled models' (SmolLM2: 3 KV heads x 64; Gemma 3 270M: 1 KV head x 256), lengths the probe's.
"""

import pytest
import torch
from transformers.cache_utils import HQQQuantizedLayer

from kvlab.accounting import layer_parts
from kvlab.caches.quant import get_backend
from kvlab.caches.quant.hqq import HQQAxis1Layer
from kvlab.caches.quant.probe import PROBE_TOKENS
from kvlab.strategies import make_strategy

pytestmark = pytest.mark.unit

SHAPES = {"smollm2": (3, 64), "gemma3": (1, 256)}


def feed(layer, heads, width, prompt, seed=0):
    """A prompt then two single tokens through `layer`; (what the last update returned, every state fed)."""
    generator = torch.Generator().manual_seed(seed)
    fed = []
    for tokens in (prompt, 1, 1):
        state = torch.randn(1, heads, tokens, width, generator=generator)
        fed.append(state)
        keys, values = layer.update(state, state.clone())
    return (keys, values), torch.cat(fed, dim=2)


def test_upstream_fails_at_axis_1_for_an_odd_row_count():
    """The failure named in docs/strategies.md: SmolLM2's 3 KV heads x 1 token at 4 bits is 3 rows of 64."""
    layer = HQQQuantizedLayer(nbits=4, axis_key=1, axis_value=1, q_group_size=64, residual_length=0)
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(4\) must match the size of tensor b \(3\)"):
        feed(layer, 3, 64, 1)


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("residual_length", [0, 128])
def test_axis_1_runs_at_every_length(nbits, model, residual_length):
    heads, width = SHAPES[model]
    hqq = get_backend("hqq")
    for prompt in PROBE_TOKENS:
        layer = hqq.make_layer(nbits=nbits, axis_key=1, axis_value=1, q_group_size=64, residual_length=residual_length)
        assert isinstance(layer, HQQAxis1Layer)
        (keys, values), fed = feed(layer, heads, width, prompt)
        assert keys.shape == values.shape == fed.shape
        if nbits >= 4:
            assert ((keys - fed).pow(2).mean() / fed.pow(2).mean()) < 0.02, (prompt, residual_length)
        assert hqq.quantized_shape(layer) == (1, heads, prompt + 2 if residual_length == 0 else prompt, width)


@pytest.mark.parametrize("prompt", [2, 64])
def test_it_quantizes_exactly_as_upstream_wherever_upstream_works(prompt):
    """3 heads x 2 or 64 tokens is an even row count: no padding, the same packed codes and the same values."""
    ours = HQQAxis1Layer(nbits=4, axis_key=1, axis_value=1, q_group_size=64, residual_length=128)
    theirs = HQQQuantizedLayer(nbits=4, axis_key=1, axis_value=1, q_group_size=64, residual_length=128)
    (ours_keys, _), _ = feed(ours, 3, 64, prompt)
    (their_keys, _), _ = feed(theirs, 3, 64, prompt)
    assert torch.equal(ours._quantized_keys[0], theirs._quantized_keys[0])
    assert torch.equal(ours_keys, their_keys)


def test_the_padding_is_counted_and_axis_0_keeps_transformers_layer():
    hqq = get_backend("hqq")
    odd = hqq.make_layer(nbits=4, axis_key=1, axis_value=1, q_group_size=64, residual_length=128)
    feed(odd, 3, 64, 1)  # 3 rows of 64 padded to 4: 4 x 32 packed bytes
    assert sum(layer_parts(odd)["packed"].values()) == 2 * 4 * 32
    assert type(hqq.make_layer(nbits=4, axis_key=0, axis_value=0, q_group_size=64, residual_length=0)) is HQQQuantizedLayer


def test_the_strategy_builds_and_runs_axis_1_without_a_refusal(tiny):
    from kvlab.engine import Decoder
    from kvlab.generation import GenerationSettings

    strategy = make_strategy({"strategy": "quantized", "backend": "hqq", "axis_key": 1, "axis_value": 1,
                              "residual_length": 0})
    cache = strategy.build_cache(tiny, 20)
    assert {type(layer) for layer in cache.layers} == {HQQAxis1Layer}
    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False, fidelity=False)
    steps = list(Decoder(tiny, strategy, cache, torch.tensor([[1, 400, 401]]), settings))
    assert len(steps) == 5
    code = strategy.cache_code()[1]
    assert "HQQAxis1Layer(nbits=4, residual_length=0, q_group_size=64, axis_key=1, axis_value=1)" in code
