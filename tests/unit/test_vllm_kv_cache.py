"""The `vllm_kv_cache` strategy on tiny random models: the cache vLLM holds under each --kv-cache-dtype (boundary
layers in the model's dtype, sliding windows, prefill exact and decode decoded), its bytes equal to vLLM's
page-size formula and read by `kvlab.accounting`, Inspect and the planner as its backend says, eviction's
`quantize=`, the snippet, and the serving note pointing at vLLM's flag with vLLM's own cost figure."""

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from kvlab.accounting import cache_bytes, layer_parts
from kvlab.caches.quant import backend_of_layer, get_backend
from kvlab.caches.quant.vllm import VLLM_COST, vllm_bytes_per_token, vllm_kv_cache
from kvlab.caches.vllm_cache import VllmKVLayer, VllmKVSlidingLayer, boundary_indices
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.inspect.inspector import layer_rows
from kvlab.models.loading import LoadedModel, ModelSpec
from kvlab.plan.planner import PlanRequest, plan
from kvlab.strategies import StrategyError, make_strategy
from kvlab.strategies.serving import serving_settings
from kvlab.ui.shared.code import code_snippet

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
FP32 = 4
PRESETS = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "int4_per_token_head")
TOYS = {
    "llama6": dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, max_position_embeddings=4096),
    "gemma4": dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=64, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
}
MODEL_TYPES = {"llama6": "llama", "gemma4": "gemma3_text"}
TABLES_4BIT = 4 * (64 * 64 + 16 + 15)
"""float32 Hadamard matrix (head_dim 64), 16 centroids and 15 midpoints of a 4-bit preset."""


def vllm_page_bytes_per_token(layer_kind: str, kv_cache_dtype: str, heads: int, head_dim: int) -> int:
    """vLLM's page size of one layer divided by its block size, from its code: `TQFullAttentionSpec` (block_size ·
    num_kv_heads · slot_size_aligned), a skipped (`auto`) layer's `FullAttentionSpec` (block_size · num_kv_heads ·
    (head_size + head_size_v) · dtype size), int4 (head_size/2 + head_size_v/2 bytes and two float32 scales per
    token and head)."""
    import math

    if layer_kind == "dense":
        return heads * (head_dim + head_dim) * FP32
    if kv_cache_dtype == "int4_per_token_head":
        return heads * (head_dim // 2 + head_dim // 2 + 2 * 4)
    key_bits, value_bits = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4), "turboquant_k3v4_nc": (3, 4),
                            "turboquant_3bit_nc": (3, 3)}[kv_cache_dtype]
    key = head_dim if key_bits == 8 else math.ceil(head_dim * key_bits / 8) + 2
    slot = key + math.ceil(head_dim * value_bits / 8) + 4
    return heads * (slot + slot % 2)


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    """name -> (LoadedModel of a random toy, folder with its config.json)."""
    built = {}
    for name, fields in TOYS.items():
        torch.manual_seed(0)
        config = AutoConfig.for_model(MODEL_TYPES[name], **fields)
        folder = tmp_path_factory.mktemp(name)
        config.save_pretrained(folder)
        model = AutoModelForCausalLM.from_config(config).eval()
        built[name] = (LoadedModel(ModelSpec(source=str(folder), device="cpu"), model, None, torch.device("cpu"),
                                   0.0, name), str(folder))
    return built


def run(loaded, spec, prompt_tokens=20, new_tokens=6):
    strategy = make_strategy(spec)
    ids = torch.randint(5, 90, (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    cache = strategy.build_cache(loaded, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    return strategy, cache, list(Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True))


def tables(cache) -> int:
    return sum(t.nelement() * t.element_size() for layer in cache.layers for t in getattr(layer, "shared_tables", []))


@pytest.mark.parametrize("kv_cache_dtype", PRESETS)
def test_bytes_per_token_equal_vllms_page_formula_with_its_boundary_layers(toys, kv_cache_dtype):
    loaded, _ = toys["llama6"]
    strategy, cache, steps = run(loaded, {"strategy": "vllm_kv_cache", "kv_cache_dtype": kv_cache_dtype})
    skipped = [] if kv_cache_dtype == "int4_per_token_head" else [0, 1, 4, 5]  # vLLM: first and last 2
    assert [i for i, layer in enumerate(cache.layers) if not isinstance(layer, VllmKVLayer)] == skipped
    formula = sum(vllm_page_bytes_per_token("dense" if i in skipped else "encoded", kv_cache_dtype, 2, 64)
                  for i in range(6))
    assert vllm_bytes_per_token(loaded.config, strategy.knobs(), FP32) == formula
    assert [s.cache_bytes - tables(cache) for s in steps] == [s.seen_tokens * formula for s in steps]
    codebook = {"turboquant_k8v4": 0, "turboquant_4bit_nc": 16 + 15, "turboquant_k3v4_nc": 8 + 7,
                "turboquant_3bit_nc": 8 + 7, "int4_per_token_head": 64}  # centroids + midpoints, or the signs
    assert tables(cache) == 4 * (64 * 64 + codebook[kv_cache_dtype])  # float32, once per cache


def test_boundary_layers_follow_vllms_rule():
    assert boundary_indices(30, 2) == [0, 1, 28, 29] and boundary_indices(18, 2) == [0, 1, 16, 17]
    assert boundary_indices(4, 2) == [0, 1, 2, 3] and boundary_indices(3, 2) == [0, 2] and boundary_indices(30, 0) == []


def test_the_prefill_attends_exactly_and_every_decode_reads_what_is_stored(toys):
    loaded, _ = toys["llama6"]
    cache = vllm_kv_cache(loaded.config, "turboquant_3bit_nc", boundary_layers=0)
    layer = cache.layers[2]
    keys, values = torch.randn(1, 2, 7, 64), torch.randn(1, 2, 7, 64)
    assert all(torch.equal(a, b) for a, b in zip(layer.update(keys, values), (keys, values)))
    new_keys, new_values = torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64)
    got_keys, got_values = layer.update(new_keys, new_values)
    stored = layer.codec.decode(layer.codec.encode(torch.cat([keys, new_keys], 2), torch.cat([values, new_values], 2)))
    assert torch.equal(got_keys, stored[0]) and torch.equal(got_values, stored[1]) and layer.held_tokens() == 8
    layer.reorder_cache(torch.tensor([0]))
    assert layer.state["slots"].shape == (1, 2, 8, 54)
    long_keys, long_values = torch.randn(1, 2, 129, 64), torch.randn(1, 2, 129, 64)  # a chunk past vLLM's 128
    got_keys, _ = layer.update(long_keys, long_values)
    assert torch.equal(got_keys[..., 8:, :], long_keys) and torch.equal(got_keys[..., :8, :], stored[0])


def test_int4_attends_from_the_cache_at_prefill_too(toys):
    """vLLM's Triton backend writes the cache, then attends from it for the prompt as for every later token."""
    loaded, _ = toys["llama6"]
    layer = vllm_kv_cache(loaded.config, "int4_per_token_head").layers[0]
    keys, values = torch.randn(1, 2, 7, 64), torch.randn(1, 2, 7, 64)
    got_keys, got_values = layer.update(keys, values)
    stored = layer.codec.decode(layer.codec.encode(keys, values))
    assert torch.equal(got_keys, stored[0]) and torch.equal(got_values, stored[1]) and not torch.equal(got_keys, keys)


def test_accounting_and_inspect_read_the_slots_as_the_backend_says(tiny):
    _, cache, steps = run(tiny, {"strategy": "vllm_kv_cache", "kv_cache_dtype": "turboquant_4bit_nc",
                                 "boundary_layers": 0}, prompt_tokens=10, new_tokens=4)
    seen = steps[-1].seen_tokens
    backend = get_backend("vllm")
    assert [type(layer).__name__ for layer in cache.layers] == ["VllmKVLayer"] * 2
    assert backend_of_layer(cache.layers[1]) is backend and cache_bytes(cache) == 2 * 13 * 70 + TABLES_4BIT
    parts = {name: sum(by_device.values()) for name, by_device in layer_parts(cache.layers[1]).items()}
    assert parts == {"keys_values": 0, "packed": 13 * (32 + 32), "scales": 13 * (2 + 4), "residual": 0, "other": 0}
    first = {name: sum(by_device.values()) for name, by_device in layer_parts(cache.layers[0]).items()}
    assert first["other"] == TABLES_4BIT  # the Hadamard matrix and codebook, listed by the first layer: once
    row = layer_rows(cache, tiny.config, seen)[1]
    assert row.strip == (("quantized", 0, 13),) and row.held_tokens == seen == 13
    assert row.quantized_shape == (1, 1, 13, 64) and row.parts == parts


@pytest.mark.parametrize("toy, spec", [
    ("llama6", {"kv_cache_dtype": "turboquant_4bit_nc"}), ("llama6", {"kv_cache_dtype": "int4_per_token_head"}),
    ("llama6", {"kv_cache_dtype": "turboquant_k3v4_nc", "boundary_layers": 0, "qjl": True}),
    ("gemma4", {"kv_cache_dtype": "int4_per_token_head"}),
    ("gemma4", {"kv_cache_dtype": "turboquant_k8v4", "boundary_layers": 0, "values": "lloyd_max"}),
])
def test_the_planner_gives_a_real_runs_bytes_at_every_step(toys, toy, spec):
    loaded, folder = toys[toy]
    spec = {"strategy": "vllm_kv_cache", **spec}
    _, _, steps = run(loaded, spec, prompt_tokens=24, new_tokens=8)
    planned = plan(PlanRequest(model=folder, contexts=tuple(s.seen_tokens for s in steps), dtype="float32",
                               strategies=(spec,), prefill_tokens=24)).strategies[0]
    assert planned.status == "ok", planned.message
    assert [cell.cache_bytes for cell in planned.cells] == [s.cache_bytes for s in steps]
    if toy == "llama6" and spec["kv_cache_dtype"] == "turboquant_4bit_nc":
        assert "(layers 0, 1, 4, 5)" in planned.explanation and "(layers 2, 3)" in planned.explanation


def test_int4_encodes_a_sliding_window_and_turboquant_keeps_it_as_transformers_does(toys):
    loaded, _ = toys["gemma4"]
    _, cache, steps = run(loaded, {"strategy": "vllm_kv_cache", "kv_cache_dtype": "int4_per_token_head"},
                          prompt_tokens=24, new_tokens=4)
    sliding = cache.layers[0]
    assert isinstance(sliding, VllmKVSlidingLayer) and sliding.held_tokens() == 15  # window 16 - 1
    assert sliding.get_mask_sizes(1) == (16, 27 - 16 + 1) and sliding.get_max_length() == 16  # 27 tokens fed
    full = (1 * (64 + 8)) * steps[-1].seen_tokens
    assert steps[-1].cache_bytes - tables(cache) == 2 * 15 * (64 + 8) + 2 * full
    turbo = vllm_kv_cache(loaded.config, "turboquant_4bit_nc", boundary_layers=0)
    assert [type(layer).__name__ for layer in turbo.layers] == ["DynamicSlidingWindowLayer", "VllmKVLayer"] * 2


def test_eviction_encodes_what_it_kept(tiny):
    _, cache, steps = run(tiny, {"strategy": "knorm", "compression_ratio": 0.5, "quantize": "turboquant_3bit_nc"},
                          prompt_tokens=40)
    assert [type(layer).__name__ for layer in cache.layers] == ["PrunedVllmKVLayer"] * 2
    assert backend_of_layer(cache.layers[0]) is get_backend("vllm")
    assert steps[0].cache_bytes == 2 * 20 * 54 + 4 * (64 * 64 + 8 + 7)
    with pytest.raises(StrategyError, match=r"quantize must be one of none, .*turboquant_k8v4, turboquant_4bit_nc, "
                                            r"turboquant_k3v4_nc, turboquant_3bit_nc, int4_per_token_head, "
                                            r"q8_0, .*rotation_k"):
        make_strategy({"strategy": "snapkv", "quantize": "turboquant_2bit"})


def test_the_snippet_builds_the_same_cache_and_names_vllms_flag(tiny):
    strategy = make_strategy({"strategy": "vllm_kv_cache", "kv_cache_dtype": "turboquant_k3v4_nc", "boundary_layers": 0,
                              "values": "lloyd_max"})
    assert strategy.describe() == "vLLM turboquant_k3v4_nc values=lloyd_max boundary_layers=0"
    imports, code = strategy.cache_code()
    scope = {"model": tiny.model}
    exec("\n".join([*imports, code]), scope)
    assert [type(layer).__name__ for layer in scope["cache"].layers] == ["VllmKVLayer"] * 2
    snippet = code_snippet(strategy, GenerationSettings(max_new_tokens=4), "Hi")
    assert "vllm_kv_cache(model.config, 'turboquant_k3v4_nc', values='lloyd_max', boundary_layers=0)" in snippet
    assert "# vLLM 0.34: --kv-cache-dtype turboquant_k3v4_nc (vLLM's own figure: ~3.5× smaller, +10.63 % PPL" in snippet
    assert "vLLM has no values=lloyd_max" in snippet and "always keeps the first and last 2 layers" in snippet


@pytest.mark.parametrize("kv_cache_dtype", PRESETS)
def test_each_preset_serves_as_its_own_vllm_flag_with_vllms_cost_figure(kv_cache_dtype):
    vllm, *others = serving_settings("vllm_kv_cache", {"kv_cache_dtype": kv_cache_dtype})
    assert vllm.engine == "vLLM" and vllm.setting == f"--kv-cache-dtype {kv_cache_dtype}"
    doc = DOC.read_text()
    assert f"`{kv_cache_dtype}`" in doc
    if kv_cache_dtype in VLLM_COST:
        ratio, ppl = VLLM_COST[kv_cache_dtype]
        assert f"{ratio} smaller, {ppl} PPL" in vllm.note and f"{ratio} smaller, {ppl} PPL" in doc
        assert vllm.source.endswith("turboquant/config.py") and all(s.setting is None for s in others)
    else:
        assert vllm.source.endswith("int4_per_token_head.py") and others[-1].setting.startswith("--cache-type-k q4_0")
    wider = serving_settings("vllm_kv_cache", {"kv_cache_dtype": kv_cache_dtype, "boundary_layers": 3})[0]
    assert wider.setting.endswith("--kv-cache-dtype-skip-layers <first and last 3>")


def test_a_model_it_cannot_serve_is_refused_in_one_sentence(tiny, tiny_hybrid):
    from types import SimpleNamespace

    strategy = make_strategy({"strategy": "vllm_kv_cache"})
    assert "keeps all 2 layers of this model in its dtype" in strategy.unavailable_reason(tiny)
    odd = LlamaConfig(num_hidden_layers=4, hidden_size=96, num_attention_heads=2, num_key_value_heads=1)
    assert "power-of-two head_dim >= 8; this model's is 48" in strategy.unavailable_reason(SimpleNamespace(config=odd))
    assert make_strategy({"strategy": "vllm_kv_cache", "kv_cache_dtype": "int4_per_token_head"}).unavailable_reason(
        tiny_hybrid) is None
    unsaid = SimpleNamespace(get_text_config=lambda decoder=True: SimpleNamespace(layer_types=["full_attention"] * 8))
    assert strategy.unavailable_reason(SimpleNamespace(config=unsaid)) is None  # a config without head_dim: not refused
    with pytest.raises(StrategyError, match=r"kv_cache_dtype must be one of \['turboquant_k8v4'"):
        make_strategy({"strategy": "vllm_kv_cache", "kv_cache_dtype": "fp8"})
