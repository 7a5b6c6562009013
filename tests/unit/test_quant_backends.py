"""A quantization backend registered in one place shows up everywhere kvlab quantizes, with no other code.

A toy backend (`toy8`: int8 codes with one float16 scale per key/value vector, the newest `residual_length`
tokens in full precision, on transformers' `QuantizedLayer`) is registered in-process (and removed again in a
`finally`). The `quantized` strategy's `backend` knob and the eviction strategies' `quantize=` knob take it,
their messages list it, a run's bytes are exact to its layout, `kvlab.accounting`, Inspect and the planner
read its layers as it says, and its snippet and serving note reach the "view code". docs/layout.md's "Adding
things" names this test.
"""

from dataclasses import dataclass

import pytest
import torch
from transformers.cache_utils import QuantizedLayer

from kvlab.accounting import cache_bytes, layer_parts
from kvlab.caches.quant import BACKENDS, QuantBackend, backend_of_layer, quantized_backend_names, register_backend
from kvlab.engine import Decoder
from kvlab.engines import ENGINES, ServingSetting
from kvlab.generation import GenerationSettings
from kvlab.inspect.inspector import layer_rows
from kvlab.strategies import StrategyError, make_strategy
from kvlab.strategies.serving import serving_settings
from kvlab.ui.shared.code import code_snippet

pytestmark = pytest.mark.unit

NAME = "toy8"
HEAD_DIM, FP32 = 64, 4
"""The tiny Llama's head_dim (one KV head, two layers) and its element size."""


class ToyLayer(QuantizedLayer):
    """int8 codes (batch, heads, tokens, head_dim) and a float16 scale (batch, heads, tokens, 1) per vector."""

    def _quantize(self, tensor, axis):
        scale = (tensor.abs().amax(dim=-1, keepdim=True).float() / 127).clamp(min=1e-8)
        return (tensor.float() / scale).round().clamp(-127, 127).to(torch.int8), scale.to(torch.float16)

    def _dequantize(self, q_tensor):
        codes, scale = q_tensor
        return (codes.float() * scale.float()).to(self.keys.dtype)


@dataclass(frozen=True)
class ToyBackend(QuantBackend):
    def layer_classes(self):
        return (ToyLayer,)

    def quantize_choices(self):
        return NAME

    def parse_quantize(self, text):
        return {"nbits": 8} if text == NAME else None

    def cache_code(self, knobs):
        return ["from toy import ToyLayer"], f"cache = toy_cache(model.config, residual_length={knobs['residual_length']})"

    def quantize_code(self, knobs, residual_length):
        return ["from toy import ToyLayer"], "", f"lambda: ToyLayer(residual_length={residual_length})"

    def serving(self, knobs):
        return [ServingSetting(engine, "--kv-cache-dtype int8", "1.0", "https://example.org/toy") for engine in ENGINES]


def toy_bytes(quantized: int, residual: int, layers: int = 2) -> int:
    """Per layer: K and V, each one int8 code per dim and a float16 scale per quantized token; residual fp32."""
    return layers * 2 * (quantized * (HEAD_DIM + 2) + residual * HEAD_DIM * FP32)


@pytest.fixture
def toy():
    register_backend(ToyBackend(name=NAME, nbits=(8,), default_nbits=8, takes=("residual_length",),
                                granularity="per vector"))
    try:
        yield BACKENDS[NAME]
    finally:
        BACKENDS.pop(NAME, None)
    assert NAME not in quantized_backend_names()


def run(loaded, spec, prompt_tokens=10, new_tokens=4):
    strategy = make_strategy(spec)
    ids = torch.randint(5, 200, (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    cache = strategy.build_cache(loaded, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    return strategy, cache, list(Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True))


def test_the_knobs_take_it_and_their_messages_list_it(toy):
    strategy = make_strategy({"strategy": "quantized", "backend": NAME, "residual_length": 4})
    assert strategy.quantizer is toy and strategy.nbits == 8 and strategy.describe() == "quantized toy8 int8 r4"
    with pytest.raises(StrategyError, match=r"backend must be one of \['quanto', 'hqq', 'fp8', 'toy8'\]"):
        make_strategy({"strategy": "quantized", "backend": "toy9"})
    with pytest.raises(StrategyError, match="the toy8 backend quantizes per vector and takes no q_group_size"):
        make_strategy({"strategy": "quantized", "backend": NAME, "q_group_size": 32})
    assert make_strategy({"strategy": "snapkv", "quantize": NAME}).describe() == "snapkv 0.5 + toy8 int8"
    with pytest.raises(StrategyError, match=r"quantize must be one of none, .*rotation_k4v2\), toy8; got 'toy9'"):
        make_strategy({"strategy": "snapkv", "quantize": "toy9"})


def test_its_bytes_are_exact_and_accounting_and_inspect_read_its_layout(tiny, toy):
    _, cache, steps = run(tiny, {"strategy": "quantized", "backend": NAME, "residual_length": 4})
    seen = steps[-1].seen_tokens  # 10 quantized at prefill; 3 decoded tokens wait in the residual
    assert [type(layer).__name__ for layer in cache.layers] == ["ToyLayer"] * 2
    assert backend_of_layer(cache.layers[0]) is toy
    assert [s.cache_bytes for s in steps] == [toy_bytes(10, k) for k in range(4)] and cache_bytes(cache) == toy_bytes(10, 3)
    parts = {name: sum(by_device.values()) for name, by_device in layer_parts(cache.layers[0]).items()}
    assert parts == {"keys_values": 0, "packed": 2 * 10 * HEAD_DIM, "scales": 2 * 10 * 2,
                     "residual": 2 * 3 * HEAD_DIM * FP32, "other": 0}
    row = layer_rows(cache, tiny.config, seen)[0]
    assert row.strip == (("quantized", 0, 10), ("residual", 10, 13)) and row.held_tokens == seen == 13
    assert row.quantized_shape == (1, 1, 10, HEAD_DIM) and row.parts == parts


def test_the_planner_measures_its_layers(tiny, toy, tmp_path):
    from kvlab.plan.planner import PlanRequest, plan

    tiny.config.save_pretrained(tmp_path)
    for spec in ({"strategy": "quantized", "backend": NAME, "residual_length": 4},
                 {"strategy": "knorm", "quantize": NAME, "residual_length": 4}):
        _, _, steps = run(tiny, spec, prompt_tokens=12, new_tokens=7)
        planned = plan(PlanRequest(model=str(tmp_path), contexts=tuple(s.seen_tokens for s in steps), dtype="float32",
                                   strategies=(spec,), prefill_tokens=12)).strategies[0]
        assert planned.status == "ok", planned.message
        assert [cell.cache_bytes for cell in planned.cells] == [s.cache_bytes for s in steps], spec


def test_eviction_quantizes_what_it_kept_into_its_layer(tiny, toy):
    _, cache, steps = run(tiny, {"strategy": "knorm", "compression_ratio": 0.5, "quantize": NAME}, prompt_tokens=40)
    assert [type(layer).__name__ for layer in cache.layers] == ["PrunedToyLayer"] * 2
    assert backend_of_layer(cache.layers[0]) is toy and steps[0].cache_bytes == toy_bytes(20, 0)


def test_its_snippet_and_serving_note_reach_the_view_code(toy):
    strategy = make_strategy({"strategy": "quantized", "backend": NAME})
    code = code_snippet(strategy, GenerationSettings(max_new_tokens=4), "Hi")
    assert "cache = toy_cache(model.config, residual_length=128)" in code
    assert "# vLLM 1.0: --kv-cache-dtype int8 <https://example.org/toy>" in code
    assert [s.setting for s in serving_settings("quantized", {"backend": NAME})] == ["--kv-cache-dtype int8"] * 4
    evicting = serving_settings("tova", {"quantize": NAME})
    assert evicting[-1].setting == "--kv-cache-dtype int8" and "quantize=toy8 part only" in evicting[-1].note
    assert "quantized_layer=lambda: ToyLayer(residual_length=128)" in code_snippet(
        make_strategy({"strategy": "tova", "quantize": NAME}), GenerationSettings(max_new_tokens=4), "Hi")
