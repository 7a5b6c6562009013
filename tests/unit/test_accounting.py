"""Byte accounting on random tensors, for every cache layer type (no model)."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, QuantizedCache, StaticCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer

from kvlab.accounting import bytes_per_token, cache_bytes, cache_bytes_by_device, predicted_cache_bytes

BATCH, HEADS, DIM = 1, 2, 64


def kv(seq, dtype=torch.float32):
    return torch.randn(BATCH, HEADS, seq, DIM, dtype=dtype), torch.randn(BATCH, HEADS, seq, DIM, dtype=dtype)


def config(layers=2):
    return LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=HEADS, hidden_size=256,
                       head_dim=DIM, intermediate_size=64, vocab_size=100)


def dense(seq, element=4):
    return 2 * BATCH * HEADS * seq * DIM * element


@pytest.mark.parametrize("dtype,element", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_dynamic_layer_counts_keys_and_values(dtype, element):
    layer = DynamicLayer()
    layer.update(*kv(10, dtype))
    layer.update(*kv(1, dtype))
    assert cache_bytes_by_device(type("C", (), {"layers": [layer]})()) == {"cpu": dense(11, element)}


def test_dynamic_cache_matches_prediction_to_the_byte():
    cfg = config(layers=3)
    cache = DynamicCache()
    for step, seq in enumerate([7, 1, 1, 1]):
        for layer in range(3):
            cache.update(*kv(seq), layer)
        tokens = 7 + step
        assert cache_bytes(cache) == predicted_cache_bytes(cfg, torch.float32, tokens) == 3 * dense(tokens)
    assert bytes_per_token(cfg, torch.float32) == 2 * 3 * HEADS * DIM * 4


def test_sliding_window_layer_stops_growing_at_its_window():
    layer = DynamicSlidingWindowLayer(sliding_window=8)
    layer.update(*kv(5))
    for _ in range(10):
        layer.update(*kv(1))
    cache = type("C", (), {"layers": [layer]})()
    # the layer keeps window - 1 past tokens (the new one makes the window) plus an int64 window-size tensor
    assert cache_bytes(cache) == dense(7) + layer._sliding_window_tensor.nbytes


def test_static_cache_counts_its_whole_allocation():
    cache = StaticCache(config=config(), max_cache_len=32)
    for layer in range(2):
        cache.update(*kv(5), layer)
    counter = 2 * 8  # one int64 cumulative_length tensor per layer
    assert cache_bytes(cache) == 2 * dense(32) + counter


def test_static_sliding_window_layer_counts_its_buffers():
    layer = StaticSlidingWindowLayer(max_cache_len=64, sliding_window=16)
    layer.update(*kv(4))
    cache = type("C", (), {"layers": [layer]})()
    tensors = [v for v in vars(layer).values() if isinstance(v, torch.Tensor)]
    assert cache_bytes(cache) == sum(t.nbytes for t in tensors)
    assert cache_bytes(cache) >= dense(16)


def test_quanto_counts_packed_data_scales_and_residual_not_dequantized_size():
    cache = QuantizedCache(backend="quanto", config=config(layers=1), nbits=4, residual_length=4, q_group_size=64)
    cache.update(*kv(20), 0)
    cache.update(*kv(1), 0)
    layer = cache.layers[0]
    q = layer._quantized_keys
    packed = q._data._data
    expected_one = packed.nbytes + q._scale.nbytes + q._shift.nbytes
    # int4: two values per byte -> packed data is an eighth of fp32
    assert packed.nbytes == BATCH * HEADS * 20 * DIM // 2
    residual = layer.keys.nbytes + layer.values.nbytes
    assert residual == dense(1)
    assert cache_bytes(cache) == 2 * expected_one + residual
    assert cache_bytes(cache) < dense(21) / 3


def test_hqq_counts_packed_tensor_and_meta_scale_zero():
    cache = QuantizedCache(backend="hqq", config=config(layers=1), nbits=4, residual_length=4, q_group_size=64)
    cache.update(*kv(20), 0)
    cache.update(*kv(1), 0)
    layer = cache.layers[0]
    packed, meta = layer._quantized_keys
    one = packed.nbytes + meta["scale"].nbytes + meta["zero"].nbytes
    assert cache_bytes(cache) == 2 * one + layer.keys.nbytes + layer.values.nbytes
    assert cache_bytes(cache) < dense(21) / 3


def test_fp8_counts_one_byte_per_element_plus_scales():
    cache = QuantizedCache(backend="fp8", config=config(layers=1))
    cache.update(*kv(20), 0)
    cache.update(*kv(1), 0)
    layer = cache.layers[0]
    data, scale = layer._quantized_keys
    assert data.element_size() == 1
    assert cache_bytes(cache) == 2 * (data.nbytes + scale.nbytes)
    assert cache_bytes(cache) == dense(21, element=1) + 2 * scale.nbytes


def test_empty_and_missing_caches_count_zero():
    assert cache_bytes(None) == 0
    assert cache_bytes(DynamicCache()) == 0
