"""The plan equals the bytes a real run holds, step by step, on tiny random models built in-process.

Each toy model (random weights, float32, CPU; Llama, a Gemma 3 with sliding layers (quantized caches on its
full-attention layers only, but for llama.cpp's types and rotation quantization's `sliding: quantize`),
LFM2 with convolution layers, Mamba2 with state-space layers) is run through kvlab's engine
(`Decoder`, what Compare runs) for a prompt and some decode steps; the planner,
given only the toy's config.json, must give the same bytes at every step. Also:
quantized extrapolation against direct CPU measurement at moderate lengths, and
quanto on the meta device against quanto on the CPU. No bundled model here.
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, QuantizedCache

from kvlab.accounting import layer_bytes_by_device
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.models.loading import LoadedModel, ModelSpec
from kvlab.plan.planner import PlanRequest, plan
from kvlab.strategies import make_strategy

PROMPT, NEW = 100, 20
TOYS = {
    "llama": dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=64, max_position_embeddings=4096),
    "gemma3_text": dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                        num_key_value_heads=1, head_dim=64, sliding_window=16,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "lfm2": dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                 num_key_value_heads=1, layer_types=["conv", "full_attention", "conv"]),
    "mamba2": dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, n_groups=1,
                   state_size=16, expand=2, chunk_size=32),
}
CASES = [
    ("llama", {"strategy": "dynamic"}), ("llama", {"strategy": "static"}), ("llama", {"strategy": "no_cache"}),
    ("llama", {"strategy": "sink", "window_length": 24, "num_sink_tokens": 4}),
    ("llama", {"strategy": "quantized", "backend": "quanto", "nbits": 4, "residual_length": 6}),
    ("llama", {"strategy": "quantized", "backend": "quanto", "nbits": 2, "residual_length": 6}),
    ("llama", {"strategy": "quantized", "backend": "hqq", "nbits": 3, "residual_length": 6}),
    ("llama", {"strategy": "quantized", "backend": "fp8"}),
    ("gemma3_text", {"strategy": "sliding_window"}), ("gemma3_text", {"strategy": "dynamic"}),
    ("gemma3_text", {"strategy": "static"}),
    ("llama", {"strategy": "rotation_quantized", "key_bits": 4, "value_bits": 2, "residual_length": 6}),
    ("llama", {"strategy": "rotation_quantized", "key_bits": 3, "value_bits": 1, "residual_length": 0}),
    ("gemma3_text", {"strategy": "rotation_quantized", "residual_length": 6}),
    ("gemma3_text", {"strategy": "rotation_quantized", "residual_length": 6, "sliding": "quantize"}),
    ("gemma3_text", {"strategy": "quantized", "backend": "quanto", "nbits": 4, "residual_length": 6}),
    ("llama", {"strategy": "llamacpp_quantized"}),
    ("llama", {"strategy": "llamacpp_quantized", "type_k": "q8_0", "type_v": "q5_1", "residual_length": 6}),
    ("gemma3_text", {"strategy": "llamacpp_quantized", "type_k": "q4_1", "type_v": "f16"}),
    ("gemma3_text", {"strategy": "llamacpp_quantized", "sliding": "keep", "residual_length": 6}),
    ("gemma3_text", {"strategy": "quantized", "backend": "fp8"}),
    ("lfm2", {"strategy": "sliding_window"}), ("lfm2", {"strategy": "static"}),
    ("mamba2", {"strategy": "sliding_window"}), ("mamba2", {"strategy": "static"}),
]


@pytest.fixture(scope="module")
def toys(tmp_path_factory):
    """model type -> (LoadedModel of a random toy, folder holding its config.json)."""
    built = {}
    for model_type, fields in TOYS.items():
        torch.manual_seed(0)
        config = AutoConfig.for_model(model_type, **fields)
        folder = tmp_path_factory.mktemp(model_type)
        config.save_pretrained(folder)
        model = AutoModelForCausalLM.from_config(config).eval()
        built[model_type] = (LoadedModel(ModelSpec(source=str(folder), device="cpu"), model, None,
                                         torch.device("cpu"), 0.0, model_type), str(folder))
    return built


def _run(loaded, spec):
    """(tokens fed, exact cache bytes) after every step of a real engine run of PROMPT + NEW tokens."""
    strategy = make_strategy(spec)
    cache = strategy.build_cache(loaded, PROMPT + NEW)
    ids = torch.randint(0, 97, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    settings = GenerationSettings(max_new_tokens=NEW, stop_at_eos=False, fidelity=False)
    return [(step.seen_tokens, step.cache_bytes)
            for step in Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True)]


@pytest.mark.parametrize("model_type,spec", CASES, ids=[f"{m}-{'-'.join(map(str, s.values()))}" for m, s in CASES])
def test_plan_equals_a_real_run_at_every_step(toys, model_type, spec):
    loaded, folder = toys[model_type]
    steps = _run(loaded, spec)
    contexts = tuple(seen for seen, _ in steps)
    if spec["strategy"] == "static":  # a static cache is allocated for the whole run up front
        planned = plan(PlanRequest(model=folder, contexts=(PROMPT + NEW,), dtype="float32", strategies=(spec,)))
        expected = [planned.strategies[0].cells[0].cache_bytes] * len(steps)
    else:
        planned = plan(PlanRequest(model=folder, contexts=contexts, dtype="float32", strategies=(spec,),
                                   prefill_tokens=PROMPT))
        expected = [cell.cache_bytes for cell in planned.strategies[0].cells]
    assert planned.strategies[0].status == "ok", planned.strategies[0].message
    assert [size for _, size in steps] == expected


def test_dynamic_all_full_on_a_state_space_model_is_refused_with_the_reason(toys):
    """`dynamic` follows the model's layer types (its conv layers keep fixed states, as transformers' default
    cache does); `dynamic:layer_types=full` would give them growing key/value layers, which they cannot use."""
    _, folder = toys["lfm2"]
    specs = ({"strategy": "dynamic", "layer_types": "full"}, {"strategy": "dynamic"})
    all_full, dynamic = plan(PlanRequest(model=folder, contexts=(8,), dtype="float32", strategies=specs)).strategies
    assert all_full.status == "error"
    assert "conv layers keep recurrent/convolution states" in all_full.message
    assert dynamic.status == "ok", dynamic.message


def test_state_layers_are_planned_as_fixed_bytes(toys):
    _, folder = toys["lfm2"]
    result = plan(PlanRequest(model=folder, contexts=(8, 10**7), dtype="float32",
                              strategies=({"strategy": "sliding_window"},)))
    small, huge = (cell.cache_bytes_by_layer_type for cell in result.strategies[0].cells)
    assert small["conv"] == huge["conv"] > 0
    assert huge["full_attention"] == 10**7 * 2 * 1 * 32 * 4  # one full layer: K+V, 1 head of 32, float32
    assert "fixed" in result.strategies[0].explanation


def _direct_quantized_bytes(config, backend, nbits, batch, heads, width, tokens):
    """Bytes one QuantizedCache layer holds after a prefill of `tokens` real CPU tokens."""
    cache = QuantizedCache(backend=backend, config=config, nbits=nbits)
    keys = torch.randn(batch, heads, tokens, width)
    cache.update(keys, torch.randn_like(keys), 0)
    return sum(layer_bytes_by_device(cache.layers[0]).values())


@pytest.mark.parametrize("backend,nbits", [("hqq", 4), ("hqq", 3), ("quanto", 2)])
@pytest.mark.parametrize("tokens", [257, 1001])
def test_quantized_bytes_match_direct_measurement_at_moderate_lengths(toys, backend, nbits, tokens):
    loaded, folder = toys["llama"]
    spec = {"strategy": "quantized", "backend": backend, "nbits": nbits}
    result = plan(PlanRequest(model=folder, contexts=(tokens,), batch=3, dtype="float32", strategies=(spec,)))
    per_layer = result.strategies[0].cells[0].cache_bytes // 2
    assert per_layer == _direct_quantized_bytes(loaded.config, backend, nbits, 3, 2, 64, tokens)


def test_quanto_on_the_meta_device_counts_what_the_cpu_holds(toys):
    loaded, _ = toys["llama"]
    for tokens in (1, 2, 3, 5, 8, 13):
        sizes = []
        for device in ("cpu", "meta"):
            cache = QuantizedCache(backend="quanto", config=loaded.config, nbits=2)
            keys = torch.randn(1, 1, tokens, 64).to(device)
            cache.update(keys, keys.clone(), 0)
            sizes.append(sum(layer_bytes_by_device(cache.layers[0]).values()))
        assert sizes[0] == sizes[1], tokens
