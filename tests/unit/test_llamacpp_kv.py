"""llama.cpp's KV cache formats inside transformers (`llamacpp_quantized`, the `llamacpp` backend).

The stored blocks are ggml's bit for bit (gguf-py's numpy reference, `gguf.quants`, is ggml's
`quantize_row_*_ref` in numpy), the Hadamard matrix is ggml's, the rotation applies exactly where llama.cpp's
applies it and gives attention llama.cpp's products, the bytes are exact to the layout (accounting, Inspect, the
planner through the backend), and the knobs say what they take. The comparison with llama.cpp itself on the real
model is tests/integration/test_llamacpp_agreement.py.
"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from kvlab.accounting import cache_bytes, layer_parts
from kvlab.caches import ggml_blocks
from kvlab.caches.ggml_cache import GGMLQuantizedCache, GGMLQuantizedLayer, GGMLSlidingLayer
from kvlab.caches.quant import backend_of_layer, get_backend
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.inspect.inspector import layer_rows
from kvlab.strategies import StrategyError, make_strategy
from kvlab.strategies.serving import serving_settings
from kvlab.ui.shared.code import code_snippet

pytestmark = pytest.mark.unit

TYPE_SIZES = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "iq4_nl": 18, "q5_0": 22, "q5_1": 24}
"""ggml's bytes per block of 32 values (`ggml-common.h`: block_q8_0 ... block_q5_1, block_iq4_nl)."""
REFERENCE_QUANTIZERS = [kind for kind in TYPE_SIZES if kind != "iq4_nl"]
"""Types gguf-py quantizes (it de-quantizes iq4_nl only; ggml's C holds that one: tests/integration)."""


def awkward_values(seed=0, shape=(2, 3, 37, 64)):
    """float32 states with a scale per row, an all-zero block, a block whose extremes tie with opposite signs, a
    block of one repeated value and values that land on x.5 after scaling."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.exponential(1.0, (*shape[:-1], 1))).astype(np.float32)
    x[0, 0, 0, :32] = 0
    x[0, 0, 1, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    x[0, 0, 2, 32:] = 0.75
    x[0, 1, 0, :32] = np.arange(32, dtype=np.float32) - 15.5
    return x


@pytest.mark.parametrize("kind", REFERENCE_QUANTIZERS)
def test_stored_blocks_and_dequantized_values_are_ggml_bit_for_bit(kind):
    values = awkward_values()
    qtype = GGMLQuantizationType[kind.upper()]
    blocks = ggml_blocks.quantize(torch.from_numpy(values), kind)
    reference = gguf_quantize(values, qtype)
    assert np.array_equal(ggml_blocks.ggml_bytes(blocks).numpy().reshape(reference.shape), reference)
    assert np.array_equal(ggml_blocks.dequantize(blocks).numpy(), gguf_dequantize(reference, qtype))
    assert ggml_blocks.TYPES[kind].type_size == TYPE_SIZES[kind] == reference.shape[-1] // 2
    assert blocks.scales.dtype == torch.float16 and blocks.qs.dtype == torch.uint8


def test_iq4_nl_blocks_read_back_as_gguf_reads_them_and_pick_the_nearest_table_entry():
    values = awkward_values(seed=2)
    blocks = ggml_blocks.quantize(torch.from_numpy(values), "iq4_nl")
    stored = ggml_blocks.ggml_bytes(blocks).numpy().reshape(*values.shape[:-1], -1)
    assert stored.shape[-1] == 2 * TYPE_SIZES["iq4_nl"]
    assert np.array_equal(ggml_blocks.dequantize(blocks).numpy(), gguf_dequantize(stored, GGMLQuantizationType.IQ4_NL))
    x = torch.from_numpy(values).reshape(-1, 32)
    peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))
    table = torch.tensor(ggml_blocks.IQ4_NL_VALUES, dtype=torch.float32)
    codes = torch.cat([blocks.qs & 0x0F, blocks.qs >> 4], dim=-1).reshape(-1, 32).long()
    live = (peak.abs() > 0).squeeze(-1)
    nearest = ((x * (-127 / peak))[..., None] - table).abs().argmin(-1)
    assert (codes[live] == nearest[live]).float().mean() > 0.999  # ties aside, the nearest entry
    assert (codes[~live] == 0).all() and (blocks.scales.reshape(-1)[~live] == 0).all()


def test_the_hadamard_matrix_is_ggmls_sylvester_matrix_and_its_own_inverse():
    for n in (64, 128, 256):
        matrix = ggml_blocks.hadamard(n)
        signs = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=torch.float32)
        assert torch.equal(matrix, signs * np.float32(1.0 / np.sqrt(np.float32(n))))
        assert torch.equal(matrix, matrix.T) and torch.allclose(matrix @ matrix, torch.eye(n), atol=1e-6)
    with pytest.raises(ValueError, match="power of two, got 96"):
        ggml_blocks.hadamard(96)


@pytest.mark.parametrize("head_dim, kind, key_size, value_size", [
    (64, "q4_0", 64, 64), (128, "q8_0", 128, 64), (256, "q4_1", 256, 64), (192, "q5_0", 64, 64),
    (96, "q4_0", None, None), (64, "f16", None, None), (64, "bf16", None, None)])
def test_the_rotation_applies_where_llama_cpp_applies_it(head_dim, kind, key_size, value_size):
    """llama_kv_cache: quantized type and head_dim % 64 == 0; keys the largest power of two dividing head_dim,
    values 64."""
    assert ggml_blocks.rotation_size(head_dim, kind, "key") == key_size
    assert ggml_blocks.rotation_size(head_dim, kind, "value") == value_size


def test_a_rotated_layer_stores_the_rotated_blocks_and_attention_sees_llama_cpps_products():
    torch.manual_seed(0)
    keys, values, query = torch.randn(1, 3, 5, 64), torch.randn(1, 3, 5, 64), torch.randn(1, 3, 1, 64)
    layer = GGMLQuantizedLayer("q4_0", "q8_0")
    read_keys, read_values = layer.update(keys, values)
    matrix = ggml_blocks.hadamard(64)
    stored_keys = ggml_blocks.quantize(keys @ matrix, "q4_0")
    assert torch.equal(ggml_blocks.ggml_bytes(layer._quantized_keys), ggml_blocks.ggml_bytes(stored_keys))
    assert torch.equal(ggml_blocks.ggml_bytes(layer._quantized_values),
                       ggml_blocks.ggml_bytes(ggml_blocks.quantize(values @ matrix, "q8_0")))
    # llama.cpp: (H q) · dequantize(H k) and H · Σ a · dequantize(H v)
    scores = query @ read_keys.transpose(-1, -2)
    assert torch.allclose(scores, (query @ matrix) @ ggml_blocks.dequantize(stored_keys).transpose(-1, -2), atol=1e-5)
    weights = scores.softmax(-1)
    stored_values = ggml_blocks.dequantize(ggml_blocks.quantize(values @ matrix, "q8_0"))
    assert torch.allclose(weights @ read_values, (weights @ stored_values) @ matrix, atol=1e-5)


def test_attn_rot_false_stores_the_unrotated_blocks_and_head_dim_96_is_never_rotated():
    torch.manual_seed(0)
    keys = torch.randn(1, 2, 4, 64)
    plain = GGMLQuantizedLayer("q4_0", "q4_0", attn_rot=False)
    read, _ = plain.update(keys, keys)
    assert plain.rotation_k is None and plain.rotation_v is None
    assert torch.equal(read, ggml_blocks.dequantize(ggml_blocks.quantize(keys, "q4_0")))
    odd = GGMLQuantizedLayer("q4_0", "q4_0")
    odd.update(torch.randn(1, 2, 4, 96), torch.randn(1, 2, 4, 96))
    assert odd.rotation_k is None and odd.rotation_v is None


def test_every_token_is_stored_as_it_arrives_and_a_residual_flushes_together():
    torch.manual_seed(0)
    states = [torch.randn(1, 1, n, 64) for n in (6, 1, 1, 1)]
    at_once = GGMLQuantizedLayer("q8_0", "q8_0", attn_rot=False)
    for state in states:
        read, _ = at_once.update(state, state)
    seen = torch.cat(states, dim=2)
    assert torch.equal(read, ggml_blocks.dequantize(ggml_blocks.quantize(seen, "q8_0")))  # the new token too
    residual = GGMLQuantizedLayer("q8_0", "q8_0", attn_rot=False, residual_length=2)
    held = [(residual.update(s, s), residual.keys.shape[-2] if residual.keys.dim() == 4 else 0)[1] for s in states]
    assert held == [0, 1, 0, 1] and residual.held_tokens() == 9
    assert torch.equal(residual._read()[0][:, :, -1:], states[-1])  # the residual is read as it is


def test_a_sliding_layer_keeps_its_window_and_masks_as_transformers_sliding_layer():
    from transformers.cache_utils import DynamicSlidingWindowLayer

    ours, theirs = GGMLSlidingLayer(4, "q4_0", "q4_0"), DynamicSlidingWindowLayer(sliding_window=4)
    for n in (6, 1, 1):
        assert ours.get_mask_sizes(n) == theirs.get_mask_sizes(n)
        state = torch.randn(1, 1, n, 32)
        assert ours.update(state, state)[0].shape == theirs.update(state, state)[0].shape
        assert ours.held_tokens() == theirs.keys.shape[-2] == min(3, 6)


def run(loaded, spec, prompt_tokens=10, new_tokens=4):
    strategy = make_strategy(spec)
    ids = torch.randint(5, 200, (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    cache = strategy.build_cache(loaded, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    return cache, list(Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True))


@pytest.mark.parametrize("type_k, type_v", [("q4_0", "q4_0"), ("q8_0", "q4_1"), ("q5_0", "q5_1"), ("f16", "iq4_nl")])
def test_bytes_are_exact_to_the_layout_in_accounting_and_inspect(tiny, type_k, type_v):
    """The tiny Llama: 2 layers, 1 KV head, head_dim 64 (two blocks per vector)."""
    cache, steps = run(tiny, {"strategy": "llamacpp_quantized", "type_k": type_k, "type_v": type_v})
    per_token = {kind: 2 * size for kind, size in TYPE_SIZES.items()} | {"f16": 128}
    assert [s.cache_bytes for s in steps] == [2 * s.seen_tokens * (per_token[type_k] + per_token[type_v])
                                              for s in steps]
    layer = cache.layers[0]
    assert backend_of_layer(layer) is get_backend("llamacpp") and cache_bytes(cache) == steps[-1].cache_bytes
    parts = {name: sum(by_device.values()) for name, by_device in layer_parts(layer).items()}
    scales = 13 * 2 * sum(2 * (1 + kind.endswith("_1")) for kind in (type_k, type_v) if kind in TYPE_SIZES)
    assert parts["scales"] == scales and parts["residual"] == parts["other"] == 0
    assert parts["keys_values"] == (13 * 128 if type_k == "f16" else 0)
    row = layer_rows(cache, tiny.config, 13)[0]
    assert row.quantized_shape == (1, 1, 13, 64) and row.held_tokens == 13


def test_bytes_per_token_on_the_bundled_models_shapes():
    """SmolLM2-135M: 30 layers x 3 KV heads x 64; Gemma 3 270M: 18 layers x 1 KV head x 256 (the 3 full layers
    grow; the 15 sliding ones stop at their window)."""
    def per_token(layers, heads, head_dim, kind):
        return layers * heads * head_dim // 32 * 2 * TYPE_SIZES[kind]

    assert {kind: per_token(30, 3, 64, kind) for kind in TYPE_SIZES} == {
        "q8_0": 12240, "q4_0": 6480, "q4_1": 7200, "iq4_nl": 6480, "q5_0": 7920, "q5_1": 8640}
    assert per_token(18, 1, 256, "q4_0") == 5184 and per_token(3, 1, 256, "q4_0") == 864
    for kind in TYPE_SIZES:
        layer = GGMLQuantizedLayer(kind, kind)
        layer.update(torch.randn(1, 3, 7, 64), torch.randn(1, 3, 7, 64))
        assert sum(sum(part.values()) for part in layer_parts(layer).values()) == 7 * per_token(1, 3, 64, kind)


def test_a_copied_cache_goes_on_exactly_as_the_original_in_and_out_of_inference_mode():
    from transformers.cache_utils import Cache

    from kvlab.caches.copying import copy_cache

    ggml_blocks.hadamard.cache_clear()
    torch.manual_seed(0)
    layer = GGMLQuantizedLayer("q5_1", "q4_0")
    with torch.inference_mode():
        layer.update(torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64))
    copied = copy_cache(Cache(layers=[layer])).layers[0]
    state = torch.randn(1, 2, 1, 64)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(layer.update(state, state), copied.update(state, state)))
    assert copied._quantized_keys.qs.data_ptr() != layer._quantized_keys.qs.data_ptr()


def test_a_hybrid_models_sliding_layers_are_stored_the_same_way_unless_kept(tiny_hybrid):
    stored = make_strategy({"strategy": "llamacpp_quantized"}).build_cache(tiny_hybrid, 40)
    assert [type(layer).__name__ for layer in stored.layers] == ["GGMLSlidingLayer", "GGMLQuantizedLayer"] * 2
    kept = make_strategy({"strategy": "llamacpp_quantized", "sliding": "keep"}).build_cache(tiny_hybrid, 40)
    assert [type(layer).__name__ for layer in kept.layers] == ["DynamicSlidingWindowLayer", "GGMLQuantizedLayer"] * 2


def test_knob_messages_name_the_allowed_values():
    for knobs, message in (({"type_k": "q3_k"}, r"type_k must be one of llama.cpp's cache types \['f32', 'f16', "
                                                r"'bf16', 'q8_0', 'q4_0', 'q4_1', 'iq4_nl', 'q5_0', 'q5_1'\], got 'q3_k'"),
                           ({"type_v": "int4"}, "type_v must be one of"),
                           ({"attn_rot": "off"}, "attn_rot must be true or false, got 'off'"),
                           ({"residual_length": -1}, "residual_length must be an integer >= 0, got -1"),
                           ({"sliding": "drop"}, r"sliding must be one of \['quantize', 'keep'\], got 'drop'")):
        with pytest.raises(StrategyError, match=message):
            make_strategy({"strategy": "llamacpp_quantized", **knobs})
    with pytest.raises(StrategyError, match=r"unknown setting\(s\) \['nbits'\]"):
        make_strategy({"strategy": "llamacpp_quantized", "nbits": 4})


def test_names_follow_llama_cpps_type_names_in_both_knobs():
    assert make_strategy({"strategy": "llamacpp_quantized"}).describe() == "llama.cpp q4_0/q4_0"
    assert (make_strategy({"strategy": "llamacpp_quantized", "type_k": "q8_0", "attn_rot": False}).describe()
            == "llama.cpp q8_0/q4_0 attn_rot=false")
    assert make_strategy({"strategy": "knorm", "quantize": "q8_0/q4_0"}).describe() == "knorm 0.5 + llama.cpp q8_0/q4_0"
    assert make_strategy({"strategy": "snapkv", "quantize": "q5_1"}).describe() == "snapkv 0.5 + llama.cpp q5_1/q5_1"
    for bad in ("q3_0", "f16", "f16/f16", "q4_0/q4_0/q4_0"):
        with pytest.raises(StrategyError, match=r"quantize must be one of .*q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1 "
                                                r"\(llama.cpp's"):
            make_strategy({"strategy": "snapkv", "quantize": bad})


def test_eviction_stores_what_it_kept_in_llama_cpps_types(tiny):
    cache, steps = run(tiny, {"strategy": "knorm", "compression_ratio": 0.5, "quantize": "q4_0",
                              "residual_length": 0}, prompt_tokens=40)
    assert [type(layer).__name__ for layer in cache.layers] == ["PrunedGGMLQuantizedLayer"] * 2
    assert steps[0].cache_bytes == 2 * 20 * 2 * 2 * TYPE_SIZES["q4_0"]


def test_a_head_dim_that_blocks_cannot_split_is_refused_with_the_reason():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=96, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1)
    backend, knobs = get_backend("llamacpp"), make_strategy({"strategy": "llamacpp_quantized"}).knobs()
    assert backend.unavailable_reason(config, knobs) == (
        "llama.cpp's q4_0 stores blocks of 32 values along head_dim; this model's head_dim (48) is not a multiple "
        "of 32 (llama.cpp refuses it too)")
    assert backend.unavailable_reason(config, {**knobs, "type_k": "f16", "type_v": "bf16"}) is None
    with pytest.raises(ValueError, match=r"head_dim \(48\) is not a multiple of 32"):
        GGMLQuantizedLayer().update(torch.zeros(1, 1, 2, 48), torch.zeros(1, 1, 2, 48))


def test_the_serving_note_is_llama_cpps_own_command_line():
    def llama(spec):
        return serving_settings("llamacpp_quantized", make_strategy({"strategy": "llamacpp_quantized",
                                                                     **spec}).knobs())[-1]

    assert llama({}).setting == "llama-server -ctk q4_0 -ctv q4_0 -fa on"
    assert "0c1e570" in llama({}).version and "a quantized V needs -fa on" in llama({}).note
    assert llama({"attn_rot": False}).setting.startswith("LLAMA_ATTN_ROT_DISABLE=1 llama-server")
    assert "-fa" not in llama({"type_k": "q8_0", "type_v": "f16"}).note


def test_the_snippet_builds_the_same_cache(tiny):
    strategy = make_strategy({"strategy": "llamacpp_quantized", "type_k": "q8_0", "attn_rot": False})
    code = code_snippet(strategy, GenerationSettings(max_new_tokens=4), "Hi")
    assert "cache = GGMLQuantizedCache(model.config, type_k='q8_0', type_v='q4_0', attn_rot=False)" in code
    assert "# llama.cpp 0c1e570 (llama-cpp-python 0.3.36): LLAMA_ATTN_ROT_DISABLE=1 llama-server -ctk q8_0" in code
    compile(code, "<snippet>", "exec")
    built = GGMLQuantizedCache(tiny.config, type_k="q8_0", type_v="q4_0", attn_rot=False)
    assert [type(layer) for layer in built.layers] == [GGMLQuantizedLayer] * 2


def test_one_list_of_llama_cpp_cache_types_serves_the_engine_column_and_the_strategy():
    from kvlab.caches import ggml_blocks
    from kvlab.engines.settings import LLAMA_FLOAT_TYPES, LLAMA_KV_TYPES, LLAMA_QUANTIZED_TYPES

    assert set(LLAMA_QUANTIZED_TYPES) == set(ggml_blocks.TYPES) and set(LLAMA_FLOAT_TYPES) == set(ggml_blocks.PLAIN_TYPES)
    for name in ("engine:llamacpp", "llamacpp_quantized"):
        taken = []
        for kind in (*LLAMA_KV_TYPES, "q3_k", "int4"):
            try:
                make_strategy({"strategy": name, "type_k": kind, "type_v": "f16"})
                taken.append(kind)
            except StrategyError:
                pass
        assert tuple(taken) == LLAMA_KV_TYPES, name
