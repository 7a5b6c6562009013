"""Every catalog entry builds and plans, and the plans agree with what the architecture implies.

Full-attention models: dynamic bytes per token are 2 · layers · kv_heads · head_dim ·
bytes per element, computed here from the catalog's own config.json fields. Hybrid
models: under `sliding_window` (DynamicCache with the config) the sliding layers stop
growing at their window. No weights, no bundled model.
"""

import pytest

from kvlab.plan.catalog import ConfigError, CatalogEntry, known_models, load_catalog
from kvlab.plan.planner import PlanRequest, plan

REQUIRED = [
    "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-8B", "mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "google/gemma-2-9b-it", "google/gemma-3-27b-it", "openai/gpt-oss-20b", "microsoft/Phi-3.5-mini-instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct", "deepseek-ai/DeepSeek-V2-Lite-Chat",
]
HYBRID = {"google/gemma-2-9b-it": 4096, "google/gemma-3-27b-it": 1024, "openai/gpt-oss-20b": 128}
PARAMETERS_B = {  # published sizes, billions of parameters (rounded as the model cards give them)
    "meta-llama/Llama-3.1-8B-Instruct": 8.03, "meta-llama/Llama-3.3-70B-Instruct": 70.6,
    "Qwen/Qwen2.5-7B-Instruct": 7.61, "Qwen/Qwen3-8B": 8.19, "google/gemma-3-27b-it": 27.4,
    "openai/gpt-oss-20b": 20.9, "HuggingFaceTB/SmolLM2-1.7B-Instruct": 1.71, "deepseek-ai/DeepSeek-V2-Lite-Chat": 15.7,
}


def _text_fields(hub_id: str) -> dict:
    config = load_catalog()[hub_id].config
    return config.get("text_config", config)


def test_catalog_has_the_required_models_addressed_by_hub_id():
    assert set(REQUIRED) <= set(known_models())
    for hub_id, entry in load_catalog().items():
        assert entry.hub_id == hub_id and entry.source.startswith(f"https://huggingface.co/{hub_id}/")


@pytest.mark.parametrize("hub_id", REQUIRED)
def test_every_entry_builds_and_plans(hub_id):
    specs = ({"strategy": "dynamic"}, {"strategy": "sliding_window"}, {"strategy": "static"},
             {"strategy": "quantized", "backend": "quanto", "nbits": 4}, {"strategy": "sink", "window_length": 1024})
    result = plan(PlanRequest(model=hub_id, contexts=(1, 4096, 131072), strategies=specs, budget_bytes=80 << 30))
    assert result.model["name"] == hub_id and result.model["origin"] == "catalog"
    dynamic = result.strategies[0]
    assert dynamic.status == "ok" and all(cell.cache_bytes > 0 for cell in dynamic.cells)
    for strategy in result.strategies:
        assert strategy.status in ("ok", "unavailable", "error") and strategy.explanation
        assert strategy.status == "ok" or strategy.message
    weights = result.strategies[0].cells[0].weights_bytes
    if hub_id == "deepseek-ai/DeepSeek-V2-Lite-Chat":  # transformers keeps its 26 MoE routers (64 x 2048) in float32
        assert weights == result.model["parameters"] * 2 + 26 * 64 * 2048 * 2
    else:
        assert weights == result.model["parameters"] * 2


@pytest.mark.parametrize("hub_id", sorted(PARAMETERS_B))
def test_parameter_counts_match_the_published_sizes(hub_id):
    result = plan(PlanRequest(model=hub_id, contexts=(1,)))
    assert result.model["parameters"] / 1e9 == pytest.approx(PARAMETERS_B[hub_id], abs=0.006 * PARAMETERS_B[hub_id])


def test_tied_embeddings_are_counted_once():
    tied = plan(PlanRequest(model="HuggingFaceTB/SmolLM2-1.7B-Instruct", contexts=(1,))).model["parameters"]
    fields = _text_fields("HuggingFaceTB/SmolLM2-1.7B-Instruct")
    assert fields["tie_word_embeddings"] is True
    assert tied == 1_711_376_384  # 2 x vocab x hidden would add another 100,663,296


@pytest.mark.parametrize("hub_id", [h for h in REQUIRED if h != "deepseek-ai/DeepSeek-V2-Lite-Chat"])
@pytest.mark.parametrize("dtype,size", [("bfloat16", 2), ("float32", 4)])
def test_dynamic_bytes_per_token_follow_the_dense_formula(hub_id, dtype, size):
    fields = _text_fields(hub_id)
    head_dim = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    per_token = 2 * fields["num_hidden_layers"] * fields["num_key_value_heads"] * head_dim * size
    result = plan(PlanRequest(model=hub_id, contexts=(1, 1000, 131072, 10**7), dtype=dtype,
                              strategies=({"strategy": "dynamic", "layer_types": "full"},)))
    assert [cell.cache_bytes for cell in result.strategies[0].cells] == [per_token * n for n in (1, 1000, 131072, 10**7)]


@pytest.mark.parametrize("hub_id", sorted(HYBRID))
def test_dynamic_on_a_hybrid_model_is_transformers_default_and_slides_like_sliding_window(hub_id):
    specs = ({"strategy": "dynamic"}, {"strategy": "sliding_window"})
    dynamic, sliding = plan(PlanRequest(model=hub_id, contexts=(10**6,), strategies=specs)).strategies
    assert dynamic.cells[0].cache_bytes == sliding.cells[0].cache_bytes


@pytest.mark.parametrize("hub_id,window", sorted(HYBRID.items()))
def test_sliding_layers_stop_growing_at_their_window(hub_id, window):
    fields = _text_fields(hub_id)
    head_dim = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    contexts = (window - 1, window, window + 1, 10 * window, 10**7)
    result = plan(PlanRequest(model=hub_id, contexts=contexts, strategies=({"strategy": "sliding_window"},)))
    label = f"sliding_attention (window {window})"
    sliding = [cell.cache_bytes_by_layer_type[label] for cell in result.strategies[0].cells]
    full = [cell.cache_bytes_by_layer_type["full_attention"] for cell in result.strategies[0].cells]
    layers = result.model["layer_groups"][label]
    kept = 2 * layers * fields["num_key_value_heads"] * head_dim * 2 * (window - 1) + 8 * layers
    assert sliding == [kept] * len(contexts)  # DynamicSlidingWindowLayer keeps window - 1 tokens (+ an 8-byte tensor)
    assert full[-1] > full[-2] > full[0]
    assert f"{layers} of {result.model['layers']} layers {label}" in result.strategies[0].explanation


def test_multi_head_latent_attention_caches_the_latent_and_says_how_it_compares():
    result = plan(PlanRequest(model="deepseek-ai/DeepSeek-V2-Lite-Chat", contexts=(1, 4096),
                              strategies=({"strategy": "dynamic"},)))
    strategy = result.strategies[0]
    assert [cell.cache_bytes for cell in strategy.cells] == [27 * (512 + 64) * 2 * n for n in (1, 4096)]
    assert "exactly the latent" in strategy.explanation and "8.9x more" in strategy.explanation


def test_hybrid_models_quantize_their_full_layers_and_refuse_sink_with_compares_reason():
    specs = ({"strategy": "dynamic"}, {"strategy": "quantized"}, {"strategy": "rotation_quantized"},
             {"strategy": "sink"})
    for hub_id in HYBRID:
        dynamic, quantized, rotation, sink = plan(PlanRequest(model=hub_id, contexts=(32768,),
                                                              strategies=specs)).strategies
        assert quantized.status == rotation.status == "ok", (quantized.message, rotation.message)
        for planned in (quantized, rotation):
            sliding = [label for label in planned.cells[0].cache_bytes_by_layer_type if label.startswith("sliding")]
            assert sliding and all(planned.cells[0].cache_bytes_by_layer_type[label]
                                   == dynamic.cells[0].cache_bytes_by_layer_type[label] for label in sliding)
            assert planned.cells[0].cache_bytes < dynamic.cells[0].cache_bytes
        assert sink.status == "unavailable"
        assert "sliding_attention" in sink.message and "every layer to be full attention" in sink.message


def test_a_bad_catalog_file_names_the_field(tmp_path, monkeypatch):
    import kvlab.plan.catalog as catalog

    (tmp_path / "bad.yaml").write_text("hub_id: not a hub id\nsource: https://huggingface.co/x\nconfig: {}\n")
    monkeypatch.setattr(catalog, "CATALOG_DIR", tmp_path)
    catalog.load_catalog.cache_clear()
    try:
        with pytest.raises(ConfigError, match="hub_id"):
            catalog.load_catalog()
    finally:
        catalog.load_catalog.cache_clear()


def test_entries_carry_only_config_json_fields():
    for entry in load_catalog().values():
        assert isinstance(entry, CatalogEntry) and "model_type" in entry.config
        assert "quantization_config" not in entry.config and "auto_map" not in entry.config
        assert isinstance(entry.build_config().get_text_config(decoder=True).num_hidden_layers, int)


def test_phi_3_5_is_all_sliding_for_transformers_so_compare_and_plan_say_so():
    specs = ({"strategy": "quantized", "q_group_size": 32}, {"strategy": "sliding_window"})
    quantized, sliding = plan(PlanRequest(model="microsoft/Phi-3.5-mini-instruct", contexts=(131072, 300000),
                                          strategies=specs)).strategies
    assert quantized.status == "unavailable" and "no full-attention layers to quantize" in quantized.message
    assert "sliding_attention" in quantized.message
    label = "sliding_attention (window 262144)"
    kept = [cell.cache_bytes_by_layer_type[label] for cell in sliding.cells]
    assert kept == [32 * (2 * 32 * 96 * 2 * n + 8) for n in (131072, 262143)]
