"""The recurrent-state cache on a tiny Mamba-2 with seeded random weights (structure only: random weights, the
text means nothing): its state bytes are the same at 64 and 4,096 tokens while a KV cache grows linearly, and a
crop either reproduces a fresh run's logits (a transformers that rolls the state back) or is reported with its
reason. The product path: Compare's recurrent runner on `bundled:mamba2-tiny-random` (the state constant beside
the KV reference growing, the strategies that cannot apply refused with their reason), and Plan's state bytes of
a public Mamba-2 from the catalog."""

import pytest
import torch
import transformers

from kvlab.accounting import cache_bytes
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.models.bundled import bundled_model
from kvlab.models.gguf_cache import ModelLoadError
from kvlab.models.loading import ModelSpec, load_model
from kvlab.models.recurrent import RECURRENT_KEY, RECURRENT_MODELS, recurrent_model
from kvlab.plan.catalog import load_catalog
from kvlab.plan.planner import PlanRequest, plan
from kvlab.protocol import ColumnFailed, RunStarted
from kvlab.recurrent.runner import EVICTION_REASON, QUANTIZED_REASON, REFERENCE_TITLE, SINK_REASON, run_recurrent
from kvlab.recurrent.state import (CROP_TOLERANCE, STRUCTURE_ONLY, crop_error, crop_reason, predicted_state_bytes,
                                   state_bytes, tiny_mamba2)

CODESTRAL = "mistralai/Mamba-Codestral-7B-v0.1"


def test_the_state_bytes_do_not_grow_with_the_sequence_while_a_kv_cache_does(tiny):
    model = tiny_mamba2()
    short, long = state_bytes(model, 64), state_bytes(model, 4096)
    assert short == long > 0
    layers, (heads, head_dim, state) = 2, (4, 32, 16)
    conv_channels, kernel = 2 * 64 + 2 * state, 4  # expand × hidden + 2 × groups × state
    parts = predicted_state_bytes(model.config, torch.float32)
    assert parts["conv_state"] + parts["ssm_state"] == layers * (heads * head_dim * state + conv_channels * kernel) * 4
    assert short == sum(parts.values())  # transformers 5.25 adds an 8-byte length counter per layer ("other")
    kv = []
    for tokens in (64, 1024):
        with torch.inference_mode():
            kv.append(cache_bytes(tiny.model(torch.ones(1, tokens, dtype=torch.long), use_cache=True).cache))
    assert kv[1] == 16 * kv[0]
    assert "random weights" in STRUCTURE_ONLY


def test_a_crop_rolls_the_state_back_or_is_reported_with_its_reason():
    model = tiny_mamba2()
    reason = crop_reason(model)
    errors = [crop_error(model, crop=n) for n in (1, 2, 3, 4)]
    if reason is None:  # a transformers that rolls the SSM state back (5.25: exactly 0.0 for n = 1..4, measured)
        assert max(errors) <= CROP_TOLERANCE
    else:
        assert transformers.__version__ in reason and "\n" not in reason
        assert min(errors) > CROP_TOLERANCE


@pytest.fixture(scope="module")
def recurrent():
    """The bundled recurrent model as Compare loads it (seeded random weights; under a second once imported)."""
    return load_model(ModelSpec(RECURRENT_KEY))


def _run(loaded, columns, tokens: int = 12):
    ids = encode_prompt(loaded.tokenizer, "a state space model keeps one state", "", chat=True)
    events = list(run_recurrent(loaded, ids, columns, GenerationSettings(max_new_tokens=tokens)))
    return ids, events, events[-1]


def test_compare_on_the_recurrent_model_keeps_the_state_constant_beside_a_growing_kv_reference(recurrent):
    assert recurrent.is_recurrent and STRUCTURE_ONLY in RECURRENT_MODELS[RECURRENT_KEY].line()
    ids, events, done = _run(recurrent, ["dynamic", "no_cache"])
    assert isinstance(events[0], RunStarted) and events[0].columns[-1] == REFERENCE_TITLE
    dynamic, no_cache, reference = done.results
    assert dynamic.status == no_cache.status == reference.status == "ok"
    state = predicted_state_bytes(recurrent.config, torch.float32)
    assert dynamic.cache_bytes == [sum(state.values())] * 12 == dynamic.predicted_cache_bytes
    assert dynamic.cache_bytes_by_layer_type == {part: [size] * 12 for part, size in state.items()}
    per_token = 2 * 2 * 4 * 16 * 4  # layers × (keys, values) × heads × head_dim × float32
    held = [ids.shape[1] + step for step in range(12)]
    assert reference.cache_bytes == [per_token * n for n in held] == reference.predicted_cache_bytes
    assert no_cache.cache_bytes == [0] * 12 and no_cache.token_ids == dynamic.token_ids
    for result in done.results:
        assert STRUCTURE_ONLY in result.message and result.text.isascii() and result.text.replace("\n", "").isprintable()
    assert done.record["prompt"]["label"] == STRUCTURE_ONLY and done.record["model"]["layer_types"] == ["linear_attention"]


def test_strategies_that_cannot_apply_to_a_recurrent_state_are_refused_with_their_reason(recurrent):
    columns = ["sink", "snapkv", "quantized:backend=quanto:nbits=4", "static"]
    _, events, done = _run(recurrent, columns, tokens=2)
    refused = {r.strategy: r.message for r in done.results[:4]}
    assert all(r.status == "unavailable" for r in done.results[:4])
    assert refused["sink"] == SINK_REASON and refused["snapkv"] == EVICTION_REASON
    assert refused["quantized"] == QUANTIZED_REASON and "not offered for a recurrent model" in refused["static"]
    assert sum(isinstance(e, ColumnFailed) for e in events) == 4 and done.results[4].status == "ok"
    assert all("\n" not in reason for reason in refused.values())


def test_the_bundled_recurrent_model_is_no_text_model_of_the_bundled_list():
    assert bundled_model(RECURRENT_KEY) is None and recurrent_model(RECURRENT_KEY) is not None
    with pytest.raises(ModelLoadError, match="mamba2-tiny-random"):
        bundled_model("bundled:nope")


def test_plan_gives_the_state_bytes_of_mamba_codestral_constant_in_the_context():
    result = plan(PlanRequest(model=CODESTRAL, contexts=(64, 4096, 131072), dtype="bfloat16"))
    dynamic = result.strategies[0]
    assert result.model["layer_groups"] == {"linear_attention": 64} and dynamic.status == "ok"
    sizes = {cell.cache_bytes for cell in dynamic.cells}
    expected = predicted_state_bytes(load_catalog()[CODESTRAL].build_config(), torch.bfloat16)
    assert sizes == {sum(expected.values())}
    assert expected["conv_state"] + expected["ssm_state"] == 273_678_336  # 64 × (10,240 × 4 × 2 + 128 × 64 × 128 × 4)


def test_the_cli_compares_the_recurrent_model_with_its_own_runner(capsys):
    from kvlab.cli import main

    code = main(["compare", "--model", RECURRENT_KEY, "--strategies", "dynamic,sink", "--max-new-tokens", "4",
                 "--prompt", "state"])
    out = capsys.readouterr()
    assert code == 0 and SINK_REASON in out.out and STRUCTURE_ONLY in out.out and REFERENCE_TITLE in out.out
