"""Strategy registry, knob validation messages and availability reasons (no real model)."""

import pytest
import torch

from kvlab.strategies import STRATEGIES, StrategyError, make_strategy

# The test matrix: every registered strategy with a valid knob set. Adding a strategy adds a row.
MATRIX = {
    "no_cache": {},
    "dynamic": {},
    "static": {"max_cache_len": 64},
    "offloaded": {},
    "offloaded_static": {"max_cache_len": 64},
    "quantized": {"backend": "quanto", "nbits": 2, "residual_length": 4},
    "rotation_quantized": {"key_bits": 4, "value_bits": 2, "residual_length": 4},
    "vllm_kv_cache": {"kv_cache_dtype": "turboquant_k3v4_nc", "boundary_layers": 0},
    "llamacpp_quantized": {"type_k": "q8_0", "type_v": "q4_0"},
    "sliding_window": {},
    "sink": {"window_length": 32, "num_sink_tokens": 4},
    "snapkv": {"window_size": 8},
    "pyramidkv": {"window_size": 8},
    "tova": {},
    "observed_attention": {},
    "knorm": {},
    "expected_attention": {},
    "random": {"seed": 1},
    "triattention": {"budget": 4, "beta": 2},
}


def test_matrix_covers_every_registered_strategy():
    assert set(STRATEGIES) == set(MATRIX)


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_every_strategy_builds_and_describes_itself(name, tiny):
    strategy = make_strategy({"strategy": name, **MATRIX[name]})
    assert strategy.name == name
    assert strategy.summary
    assert strategy.describe()
    reason = strategy.unavailable_reason(tiny)
    if reason is None:
        cache = strategy.build_cache(tiny, 40)
        assert (cache is None) == (not strategy.use_cache)
    else:
        assert name in ("offloaded", "offloaded_static", "sliding_window"), reason


def test_unknown_strategy_lists_allowed_names():
    with pytest.raises(StrategyError) as err:
        make_strategy({"strategy": "paged_attention"})
    assert "unknown strategy 'paged_attention'" in str(err.value)
    for name in ("dynamic", "static", "quantized", "no_cache"):
        assert name in str(err.value)


def test_unknown_knob_lists_allowed_knobs():
    with pytest.raises(StrategyError, match=r"unknown setting\(s\) \['bits'\]; allowed: .*'nbits'"):
        make_strategy({"strategy": "quantized", "bits": 4})


def test_quanto_nbits_3_lists_allowed_values():
    with pytest.raises(StrategyError, match=r"nbits=3 is not supported by the quanto backend \(optimum-quanto [0-9.]+\); allowed: \[2, 4\]"):
        make_strategy({"strategy": "quantized", "backend": "quanto", "nbits": 3})


def test_hqq_accepts_3_bits_and_rejects_5():
    assert make_strategy({"strategy": "quantized", "backend": "hqq", "nbits": 3}).nbits == 3
    with pytest.raises(StrategyError, match=r"allowed: \[1, 2, 3, 4, 8\]"):
        make_strategy({"strategy": "quantized", "backend": "hqq", "nbits": 5})


def test_unknown_backend_lists_backends():
    with pytest.raises(StrategyError, match=r"backend must be one of \['quanto', 'hqq', 'fp8'\], got 'int8'"):
        make_strategy({"strategy": "quantized", "backend": "int8"})


def test_quantized_axis_rules_per_backend():
    with pytest.raises(StrategyError, match=r"axis_key=1 is not supported by the quanto backend \(optimum-quanto [0-9.]+\); allowed: \[0, -1\]"):
        make_strategy({"strategy": "quantized", "backend": "quanto", "axis_key": 1})
    assert make_strategy({"strategy": "quantized", "backend": "hqq", "axis_key": 1}).axis_key == 1


def test_each_backend_gets_its_own_default_bits():
    assert make_strategy({"strategy": "quantized", "backend": "fp8"}).nbits == 8
    assert make_strategy({"strategy": "quantized", "backend": "hqq"}).nbits == 4


def test_static_too_small_names_both_numbers_before_compute():
    strategy = make_strategy({"strategy": "static", "max_cache_len": 50})
    strategy.check_fits(10, 40)
    with pytest.raises(StrategyError) as err:
        strategy.check_fits(30, 64)
    text = str(err.value)
    assert "max_cache_len=50" in text and "(30)" in text and "(64)" in text and "94" in text


def test_static_rejects_non_positive_length():
    with pytest.raises(StrategyError, match="max_cache_len must be an integer >= 1, got 0"):
        make_strategy({"strategy": "static", "max_cache_len": 0})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only reason")
@pytest.mark.parametrize("name", ["offloaded", "offloaded_static"])
def test_offloading_is_unavailable_without_cuda_and_says_why(name, tiny):
    reason = make_strategy({"strategy": name}).unavailable_reason(tiny)
    assert reason.startswith("needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the CPU-only torch really does")
@pytest.mark.skipif(torch.cuda.is_available(), reason="offloading runs where a CUDA device is present")
def test_the_offloading_reason_matches_what_transformers_raises_on_cpu():
    """A CPU-only torch fails at the first update ("Torch not compiled with CUDA enabled"); torch's CUDA build
    on a machine without a GPU fails as the cache is built (its torch.Stream needs the driver). Either way the
    offloaded cache cannot run here, which is what the strategy's reason says."""
    from transformers import DynamicCache

    with pytest.raises((AssertionError, RuntimeError), match="CUDA|Stream"):
        cache = DynamicCache(offloading=True)
        cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)


def test_sliding_window_explains_models_without_sliding_layers(tiny):
    reason = make_strategy({"strategy": "sliding_window"}).unavailable_reason(tiny)
    assert "no sliding-window layers" in reason and "sink" in reason


@pytest.mark.parametrize("name", ["quantized", "rotation_quantized"])
def test_quantization_serves_hybrid_models_and_refuses_models_without_full_layers(name, tiny_hybrid):
    from types import SimpleNamespace

    from transformers import Gemma3TextConfig

    strategy = make_strategy({"strategy": name, **({"q_group_size": 32} if name == "quantized" else {})})
    assert strategy.unavailable_reason(tiny_hybrid) is None and strategy.follows_layer_types
    kinds = [type(layer).__name__ for layer in strategy.build_cache(tiny_hybrid, 40).layers]
    assert kinds[0::2] == ["DynamicSlidingWindowLayer"] * 2 and "Quantized" in kinds[1] and kinds[1] == kinds[3]
    all_sliding = Gemma3TextConfig(num_hidden_layers=2, sliding_window=16, layer_types=["sliding_attention"] * 2)
    reason = strategy.unavailable_reason(SimpleNamespace(config=all_sliding))
    assert "no full-attention layers to quantize" in reason and "sliding_attention" in reason


def test_fresh_cache_per_build_keeps_each_backend(tiny):
    quanto = make_strategy({"strategy": "quantized", "backend": "quanto"})
    hqq = make_strategy({"strategy": "quantized", "backend": "hqq"})
    for _ in range(2):
        assert type(quanto.build_cache(tiny, 10).layers[0]).__name__ == "QuantoQuantizedLayer"
        assert type(hqq.build_cache(tiny, 10).layers[0]).__name__ == "HQQQuantizedLayer"


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_snippet_code_compiles(name):
    strategy = make_strategy({"strategy": name, **MATRIX[name]})
    imports, code = strategy.cache_code()
    compile("\n".join(imports + [code, f"kwargs = dict({strategy.generate_kwargs_code()})"]), name, "exec")


def test_compiled_static_matches_eager_and_compiles_once_per_cache_size(tiny):
    from kvlab.compare.runner import run_compare
    from kvlab.protocol import collect
    from kvlab.generation import GenerationSettings
    from kvlab.strategies.static import COMPILE_BUCKET

    compiled = make_strategy({"strategy": "static", "compile": True})
    assert compiled.unavailable_reason(tiny) is None and "compiles the forward" in compiled.caveat()
    assert [compiled.capacity(n) for n in (1, COMPILE_BUCKET, COMPILE_BUCKET + 1)] == [
        COMPILE_BUCKET, COMPILE_BUCKET, 2 * COMPILE_BUCKET]
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)
    columns = [{"strategy": "static"}, {"strategy": "static", "compile": True}]
    first = collect(run_compare(tiny, torch.tensor([[1, 400, 401, 402]]), columns, settings)).results
    assert [r.status for r in first] == ["ok", "ok"]
    assert first[0].token_ids == first[1].token_ids
    # Every later step and a longer prompt in the same bucket reuse the compiled code.
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = collect(run_compare(tiny, torch.tensor([[1, 500, 501, 502, 503, 504, 505]]), columns,
                                     settings)).results
    assert [r.status for r in second] == ["ok", "ok"], [r.message for r in second]
    assert second[0].token_ids == second[1].token_ids
    assert first[1].cache_bytes[-1] == second[1].cache_bytes[-1]


def test_quantized_group_size_must_divide_head_dim_before_compute(tiny):
    with pytest.raises(StrategyError, match=r"q_group_size=7 must divide this model's head_dim \(64\); try 16, 32, 64"):
        make_strategy({"strategy": "quantized", "backend": "hqq", "q_group_size": 7}).build_cache(tiny, 10)


@pytest.mark.parametrize("spec, works", [
    ({"backend": "hqq", "nbits": 4, "axis_key": 1}, True),
    ({"backend": "hqq", "nbits": 2, "axis_value": 1}, True),
    ({"backend": "hqq", "nbits": 3, "axis_key": 1, "axis_value": 1}, True),
    ({"backend": "hqq", "nbits": 8, "axis_key": 1, "axis_value": 1}, True),
    ({"backend": "quanto", "nbits": 4, "axis_key": -1}, False),
])
def test_a_non_default_axis_runs_or_is_refused_before_the_run(tiny, spec, works):
    from kvlab.compare.runner import run_compare
    from kvlab.protocol import collect
    from kvlab.generation import GenerationSettings

    strategy = make_strategy({"strategy": "quantized", "residual_length": 2, **spec})
    if not works:
        with pytest.raises(StrategyError, match=rf"the {spec['backend']} backend \(\S+ \d[^)]*\) fails with axis_key="):
            strategy.build_cache(tiny, 32)
    settings = GenerationSettings(max_new_tokens=9, stop_at_eos=False, fidelity=False)
    for prompt in ([[1, 400, 401]], [[1, 400, 401, 402, 403, 404, 405]]):
        result = collect(run_compare(tiny, torch.tensor(prompt), [strategy], settings)).results[0]
        if works:
            assert result.status == "ok" and len(result.token_ids) == 9
        else:
            assert result.status == "error" and "use axis_key=0 and axis_value=0" in result.message
            assert result.token_ids == []


def test_column_names_show_every_non_default_knob():
    names = {make_strategy(spec).describe() for spec in (
        {"strategy": "quantized", "backend": "hqq"},
        {"strategy": "quantized", "backend": "hqq", "q_group_size": 32},
        {"strategy": "quantized", "backend": "hqq", "axis_key": 1},
        {"strategy": "quantized", "backend": "hqq", "axis_value": 1},
    )}
    assert names == {"quantized hqq int4 r128", "quantized hqq int4 r128 q_group_size=32",
                     "quantized hqq int4 r128 axis_key=1", "quantized hqq int4 r128 axis_value=1"}
    assert make_strategy({"strategy": "sink", "window_length": 64, "label": "mine"}).describe() == "mine"


def test_backend_errors_name_the_installed_version():
    from importlib.metadata import version

    with pytest.raises(StrategyError, match=rf"quanto backend \(optimum-quanto {version('optimum-quanto')}\); allowed"):
        make_strategy({"strategy": "quantized", "backend": "quanto", "nbits": 3})
    with pytest.raises(StrategyError, match="fp8 backend quantizes per tensor and takes no q_group_size"):
        make_strategy({"strategy": "quantized", "backend": "fp8", "q_group_size": 32})
