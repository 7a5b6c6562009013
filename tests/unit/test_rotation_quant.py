"""Rotation quantization (TurboQuant-MSE): Lloyd-Max codebooks, the packed layout, the error on unit vectors, and
the transformers cache built on it, on random tensors and the tiny random Llama."""

import math

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from kvlab.accounting import cache_bytes, layer_parts
from kvlab.caches.lloyd_max import (
    BITS,
    MAX_1960_DISTORTION,
    coordinate_codebook,
    gaussian_codebook,
    lloyd_max_distortion,
)
from kvlab.caches.rotation_cache import RotationQuantizedCache
from kvlab.caches.rotation_quant import (
    Codec,
    dequantize,
    haar_rotation,
    make_codec,
    pack_indices,
    packed_nbytes,
    quantize,
    unpack_indices,
)

pytestmark = pytest.mark.unit

UNIT_VECTORS = 16384
"""Vectors per MSE estimate: the estimate's relative standard error is then about 0.3 %."""
BATCH, HEADS, DIM = 2, 2, 64


def unit_vectors(dim, count=UNIT_VECTORS, seed=1):
    vectors = torch.randn(count, dim, generator=torch.Generator().manual_seed(seed))
    return vectors / vectors.norm(dim=-1, keepdim=True)


def mse(vectors, codec):
    return float(((vectors - dequantize(quantize(vectors, codec), codec)) ** 2).sum(-1).mean())


@pytest.mark.parametrize("bits", BITS)
def test_gaussian_codebook_reproduces_max_1960(bits):
    # Max's table rounds to 4 digits (his 4-bit 0.009497 is 0.0095010 computed exactly, 0.04 % off)
    assert gaussian_codebook(bits).distortion == pytest.approx(MAX_1960_DISTORTION[bits], rel=1e-3)
    centroids = gaussian_codebook(bits).centroids
    assert centroids == tuple(sorted(centroids)) and centroids[0] == pytest.approx(-centroids[-1], abs=1e-9)


def test_coordinate_codebook_tends_to_the_gaussian_one():
    for bits in BITS:
        errors = [lloyd_max_distortion(dim, bits) for dim in (16, 64, 256)]
        # lighter tails than a Gaussian at small head_dim: less error, approaching Max's value from below
        assert errors == sorted(errors) and errors[-1] < gaussian_codebook(bits).distortion
        assert errors[1] == pytest.approx(gaussian_codebook(bits).distortion, rel=0.05)
        scaled = [value * math.sqrt(256) for value in coordinate_codebook(256, bits).centroids]
        assert scaled == pytest.approx(gaussian_codebook(bits).centroids, abs=0.05)


def test_codebook_knobs_are_checked():
    with pytest.raises(ValueError, match=r"bits must be one of \[1, 2, 3, 4\]"):
        coordinate_codebook(64, 5)
    with pytest.raises(ValueError, match="head_dim must be an integer >= 3"):
        coordinate_codebook(2, 2)


@pytest.mark.parametrize("dim", [64, 256])
@pytest.mark.parametrize("bits", BITS)
def test_mse_of_unit_vectors_is_the_lloyd_max_distortion(dim, bits):
    measured = mse(unit_vectors(dim), make_codec(dim, bits, seed=0))
    assert measured == pytest.approx(MAX_1960_DISTORTION[bits], rel=0.10)
    assert measured == pytest.approx(lloyd_max_distortion(dim, bits), rel=0.02)


@pytest.mark.parametrize("dim", [64, 256])
def test_more_bits_cut_the_error_and_lloyd_max_beats_a_uniform_grid(dim):
    vectors = unit_vectors(dim)
    errors = [mse(vectors, make_codec(dim, bits)) for bits in BITS]
    assert all(fewer > 3 * more for fewer, more in zip(errors, errors[1:]))
    assert errors[0] > 30 * errors[-1]
    for bits in (3, 4):
        codec = make_codec(dim, bits)
        grid = torch.linspace(float(codec.centroids[0]), float(codec.centroids[-1]), 2**bits)
        uniform = Codec(bits, codec.rotation, grid, 0.5 * (grid[1:] + grid[:-1]))
        assert mse(vectors, uniform) > 1.05 * errors[bits - 1]


def test_the_rotation_spreads_an_outlier_channel():
    vectors = unit_vectors(DIM, count=4096) * 0.3
    vectors[:, 0] += 3.0
    vectors = vectors / vectors.norm(dim=-1, keepdim=True)
    rotated = make_codec(DIM, 4)
    unrotated = Codec(4, torch.eye(DIM), rotated.centroids, rotated.boundaries)
    # the rotated error is the codebook's (about 0.009); without rotation the outlier coordinate is clipped
    assert mse(vectors, rotated) == pytest.approx(lloyd_max_distortion(DIM, 4), rel=0.10)
    assert mse(vectors, unrotated) > 10 * mse(vectors, rotated)


def test_haar_rotation_is_orthogonal_and_fixed_by_its_seed():
    rotation = haar_rotation(DIM, 7)
    assert rotation.dtype == torch.float32 and rotation.shape == (DIM, DIM)
    assert torch.allclose(rotation @ rotation.T, torch.eye(DIM), atol=1e-5)
    assert torch.equal(rotation, haar_rotation(DIM, 7)) and not torch.allclose(rotation, haar_rotation(DIM, 8))
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        haar_rotation(DIM, -1)


def test_pack_layout_is_a_little_endian_bit_stream():
    indices = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0]])
    word = sum(int(index) << (3 * position) for position, index in enumerate(indices[0]))
    assert pack_indices(indices, 3).tolist() == [[word & 0xFF, (word >> 8) & 0xFF, word >> 16]]
    assert pack_indices(torch.tensor([[1, 15, 0, 2]]), 4).tolist() == [[0xF1, 0x20, 0, 0]]
    assert pack_indices(torch.tensor([[1, 0, 1, 1, 0, 0, 0, 1, 1]]), 1).tolist() == [[0b10001101, 1]]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [8, 13, 64])
def test_pack_then_unpack_gives_the_indices_back(bits, dim):
    indices = torch.randint(0, 2**bits, (3, 5, dim), generator=torch.Generator().manual_seed(bits))
    packed = pack_indices(indices, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, bits * math.ceil(dim / 8))
    assert torch.equal(unpack_indices(packed, bits, dim), indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_then_dequantize_keeps_shape_and_dtype(dtype):
    states = torch.randn(BATCH, HEADS, 7, DIM).to(dtype)
    states[0, 0, 0] = 0
    packed = quantize(states, make_codec(DIM, 2))
    assert packed.indices.shape == (BATCH, HEADS, 7, 2 * DIM // 8) and packed.indices.dtype == torch.uint8
    assert packed.norms.shape == (BATCH, HEADS, 7) and packed.norms.dtype == torch.float16
    back = dequantize(packed, make_codec(DIM, 2))
    assert back.shape == states.shape and back.dtype == dtype
    assert torch.equal(back[0, 0, 0], torch.zeros(DIM, dtype=dtype))
    assert packed.indices.nbytes + packed.norms.nbytes == packed_nbytes(BATCH, HEADS, 7, DIM, 2)


def test_quantize_refuses_what_it_cannot_store():
    with pytest.raises(ValueError, match="not finite in torch.float16"):
        quantize(torch.full((1, 1, 1, DIM), 1e4), make_codec(DIM, 4))
    with pytest.raises(ValueError, match="32 coordinates per vector, the codec 64"):
        quantize(torch.randn(1, 1, 1, 32), make_codec(DIM, 4))
    with pytest.raises(ValueError, match="packed at 2 bits"):
        dequantize(quantize(torch.randn(1, 1, 1, DIM), make_codec(DIM, 2)), make_codec(DIM, 4))


def small_config(layers=2):
    return LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=HEADS, hidden_size=256,
                       head_dim=DIM, intermediate_size=64, vocab_size=100)


def documented_bytes(quantized, residual, key_bits, value_bits, element, owner):
    """The module docstring's layout for one layer holding `quantized` packed and `residual` dense tokens."""
    vectors = BATCH * HEADS * quantized
    packed = vectors * (key_bits * DIM // 8 + 2) + vectors * (value_bits * DIM // 8 + 2)
    tables = 4 * (DIM * DIM + 2 ** (key_bits + 1) - 1 + 2 ** (value_bits + 1) - 1) if owner else 0
    return packed + 2 * BATCH * HEADS * residual * DIM * element + tables


@pytest.mark.parametrize("dtype,element", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_cache_bytes_follow_the_documented_layout_across_flushes(dtype, element):
    cache = RotationQuantizedCache(small_config(), key_bits=4, value_bits=2, residual_length=4)
    expected_split = {10: (10, 0), 11: (10, 1), 13: (10, 3), 14: (14, 0), 15: (14, 1), 19: (18, 1)}
    for step, tokens in enumerate([10, 1, 1, 1, 1, 1, 1, 1, 1, 1]):
        for index in range(2):
            states = torch.randn(BATCH, HEADS, tokens, DIM).to(dtype)
            cache.update(states, states.clone(), index)
        seen = cache.layers[0].cumulative_length
        if seen not in expected_split:
            continue
        quantized, residual = expected_split[seen]
        layer_bytes = [documented_bytes(quantized, residual, 4, 2, element, owner) for owner in (True, False)]
        assert [layer.stored_nbytes() for layer in cache.layers] == layer_bytes
        assert cache_bytes(cache) == cache.stored_nbytes() == sum(layer_bytes)
    parts = layer_parts(cache.layers[0])
    vectors = BATCH * HEADS * 18
    assert parts["packed"] == {"cpu": vectors * (32 + 16)} and parts["scales"] == {"cpu": vectors * 2 * 2}
    assert parts["residual"] == {"cpu": 2 * BATCH * HEADS * DIM * element}
    assert parts["other"] == {"cpu": 4 * (DIM * DIM + 31 + 7)} and layer_parts(cache.layers[1])["other"] == {}


def test_a_flush_keeps_the_old_positions_packed_as_they_were():
    layer = RotationQuantizedCache(small_config(1), key_bits=1, value_bits=3, residual_length=2).layers[0]
    layer.update(*torch.randn(2, BATCH, HEADS, 6, DIM))
    first_keys, first_values = layer._quantized_keys, layer._quantized_values
    for _ in range(6):
        layer.update(*torch.randn(2, BATCH, HEADS, 1, DIM))
    assert layer._quantized_keys.tokens == 12
    # a second round trip through the quantizer would shrink these norms (by about 0.8 per flush at 1 bit)
    assert torch.equal(layer._quantized_keys.indices[..., :6, :], first_keys.indices)
    assert torch.equal(layer._quantized_keys.norms[..., :6], first_keys.norms)
    assert torch.equal(layer._quantized_values.norms[..., :6], first_values.norms)


def test_a_beam_reorder_reaches_the_kept_positions():
    layer = RotationQuantizedCache(small_config(1), key_bits=1, residual_length=1).layers[0]
    layer.update(*torch.randn(2, BATCH, HEADS, 5, DIM))
    before = layer._quantized_keys
    layer.reorder_cache(torch.tensor([1, 0]))
    layer.update(*torch.randn(2, BATCH, HEADS, 1, DIM))
    assert torch.equal(layer._quantized_keys.indices[:, :, :5], before.indices.flip(0))
    assert torch.equal(layer._quantized_keys.norms[:, :, :5], before.norms.flip(0))


def test_beam_search_generates_and_its_bytes_stay_exact(tiny):
    ids = torch.randint(4, len(tiny.tokenizer), (1, 12), generator=torch.Generator().manual_seed(0))
    cache = RotationQuantizedCache(tiny.model.config, key_bits=3, value_bits=2, residual_length=4)
    out = tiny.model.generate(ids, cache=cache, max_new_tokens=6, do_sample=False, num_beams=2)
    assert out.shape == (1, 18) and cache.layers[0]._quantized_keys.indices.shape == (2, 1, 16, 24)
    assert cache.layers[0]._pending_beam_idx is not None and cache_bytes(cache) == cache.stored_nbytes()


@pytest.mark.parametrize("knobs,message", [
    ({"key_bits": 5}, r"key_bits must be one of \[1, 2, 3, 4\], got 5"),
    ({"value_bits": 0}, r"value_bits must be one of \[1, 2, 3, 4\], got 0"),
    ({"key_bits": True}, "key_bits must be one of"),
    ({"residual_length": -1}, "residual_length must be an integer >= 0"),
    ({"seed": 1.5}, "seed must be an integer >= 0"),
])
def test_cache_knobs_are_checked(knobs, message):
    with pytest.raises(ValueError, match=message):
        RotationQuantizedCache(small_config(), **knobs)


def test_on_a_hybrid_model_only_the_full_attention_layers_are_quantized(tiny_hybrid):
    cache = RotationQuantizedCache(tiny_hybrid.model.config, key_bits=4, value_bits=2, residual_length=4)
    assert [type(layer).__name__ for layer in cache.layers] == ["DynamicSlidingWindowLayer",
                                                                 "RotationQuantizedLayer"] * 2
    ids = torch.randint(4, 900, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tiny_hybrid.model(input_ids=ids, cache=cache, use_cache=True)
    window, dim, element = 16, 32, 4
    sliding = 2 * (2 * (window - 1) * dim * element + 8)
    quantized = 2 * 40 * ((4 + 2) * dim // 8 + 2 * 2) + 4 * (dim * dim + 31 + 7)
    assert cache_bytes(cache) == cache.stored_nbytes() == sliding + quantized


def teacher_forced_log_probs(model, ids, cache, prefill=16):
    """Log-probabilities after the prefill and after each later token fed one at a time, (steps, vocab)."""
    with torch.no_grad():
        rows = [model(input_ids=ids[:, :prefill], cache=cache, use_cache=True).logits[0, -1]]
        for position in range(prefill, ids.shape[1]):
            rows.append(model(input_ids=ids[:, position:position + 1], cache=cache, use_cache=True).logits[0, -1])
    return torch.stack(rows).log_softmax(-1)


def test_tiny_llama_generates_and_stays_close_to_the_dense_cache_at_4_bits(tiny):
    ids = torch.randint(4, len(tiny.tokenizer), (1, 48), generator=torch.Generator().manual_seed(0))
    cache = RotationQuantizedCache(tiny.model.config, key_bits=4, value_bits=4, residual_length=4)
    out = tiny.model.generate(ids[:, :16], cache=cache, max_new_tokens=12, do_sample=False)
    assert out.shape == (1, 28) and cache.get_seq_length() == 27 and cache.layers[0]._quantized_keys.tokens >= 24

    dense = teacher_forced_log_probs(tiny.model, ids, DynamicCache())

    def kl(bits):
        cache = RotationQuantizedCache(tiny.model.config, key_bits=bits, value_bits=bits, residual_length=4)
        log_probs = teacher_forced_log_probs(tiny.model, ids, cache)
        return (dense.exp() * (dense - log_probs)).sum(-1), (dense - log_probs).abs().max()

    kl4, shift4 = kl(4)
    kl1, _ = kl(1)
    # To first order a KL grows with the squared error of what attention reads: 4 bits leave 1/38 of 1 bit's
    # (0.0095 vs 0.363), so 4-bit KL below a tenth of 1-bit KL leaves a fourfold margin; and no token's
    # log-probability moves by a tenth of a nat (10 % in probability). It is not zero: the cache is lossy.
    assert 0 < kl4.mean() < kl1.mean() / 10
    assert shift4 < 0.1


def test_sliding_layers_quantized_too_keep_their_window_and_stay_close_to_dense(tiny_hybrid):
    """`sliding="quantize"`: a sliding layer keeps the last window - 1 tokens, packed then residual, and the model
    reads them through the same masks as transformers' sliding layer (a wrong window would move the logits by
    far more than 4-bit codes do)."""
    model, window, dim = tiny_hybrid.model, 16, 32
    ids = torch.randint(4, 900, (1, 3 * window), generator=torch.Generator().manual_seed(3))
    dense = teacher_forced_log_probs(model, ids, DynamicCache(config=model.config), prefill=window + 4)
    cache = RotationQuantizedCache(model.config, residual_length=3, sliding="quantize")
    quantized = teacher_forced_log_probs(model, ids, cache, prefill=window + 4)
    assert [type(layer).__name__ for layer in cache.layers] == ["RotationSlidingLayer", "RotationQuantizedLayer"] * 2
    sliding = cache.layers[0]
    residual = sliding.keys.shape[-2]
    assert sliding._quantized_keys.tokens + residual == window - 1 and residual == (3 * window - window - 4) % 3
    assert cache_bytes(cache) == cache.stored_nbytes()
    assert sliding.stored_nbytes() == 2 * (window - 1 - residual) * (4 * dim // 8 + 2) + 2 * residual * dim * 4 + (
        4 * (dim * dim + 62))
    kl = (dense.exp() * (dense - quantized)).sum(-1)
    assert 0 < kl.mean() < 0.01 and (dense - quantized).abs().max() < 0.25  # 4 bits: mean KL about 3e-4
    with pytest.raises(ValueError, match=r"sliding must be one of \['keep', 'quantize'\]"):
        RotationQuantizedCache(model.config, sliding="all")
