"""Divergence forensics on the tiny random Llama: equal caches measure 0 everywhere; a sink cache loses attention
exactly once it evicts; noise put into one layer is found at that layer and no earlier one; the recomputed
attention equals eager attention; the loop mistakes; the `diverge` command's input checks and JSON."""

from dataclasses import dataclass

import pytest
import torch

from kvlab.generation import GenerationSettings
from kvlab.inspect.diverge import DivergeSession, first_layer_with
from kvlab.inspect.loops import FullSequenceLoop, RestartedPositionsLoop
from kvlab.inspect.probes import attention_probs, probe
from kvlab.strategies import make_strategy
from kvlab.strategies.dynamic import Dynamic

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404, 405, 406, 407, 408]])
STEPS = 12
SETTINGS = GenerationSettings(max_new_tokens=STEPS, stop_at_eos=False)
WINDOW = 16
FLOAT32_ATOL = 1e-5
PER_LAYER = ("key_error", "value_error", "kv_error", "attention_lost", "hidden_rel_l2")


def lockstep(tiny, strategy, prompt=PROMPT, settings=SETTINGS):
    session = DivergeSession(tiny, strategy, prompt, settings)
    return session, list(session.steps(settings.max_new_tokens))


def assert_equal_runs(record):
    assert record.kl_nats < FLOAT32_ATOL and record.top1_agrees and record.lens_diverged_from is None
    for layer in record.layers:
        for name in PER_LAYER:
            value = getattr(layer, name)
            assert value is not None and value < FLOAT32_ATOL, (record.index, layer.layer, name, value)
        assert layer.hidden_cosine > 1 - FLOAT32_ATOL and layer.lens_top1 == layer.lens_reference_top1


def test_static_against_dynamic_measures_zero_at_every_step_and_layer(tiny):
    session, records = lockstep(tiny, make_strategy({"strategy": "static"}))
    assert len(records) == STEPS and session.first_divergence is None
    for record in records:
        assert len(record.layers) == 2 and record.cache_length == record.seen_tokens
        assert_equal_runs(record)


def test_a_sink_cache_loses_attention_exactly_on_the_steps_after_its_first_eviction(tiny):
    _, records = lockstep(tiny, make_strategy({"strategy": "sink", "window_length": WINDOW, "num_sink_tokens": 2}))
    evicting = [r.index for r in records if r.seen_tokens > WINDOW]
    assert evicting and evicting[0] > 0  # some steps before the window fills, some after
    for record in records:
        if record.index < evicting[0]:
            assert_equal_runs(record)
            continue
        assert record.cache_length == WINDOW
        for layer in record.layers:
            assert layer.attention_lost > 0 and all(mass > 0 for mass in layer.attention_lost_by_head)
            assert layer.held_tokens == WINDOW and layer.reference_held_tokens == record.seen_tokens
        # layer 0's keys and values come from the embeddings alone: re-rotated to their positions they are exact
        assert record.layers[0].kv_error < FLOAT32_ATOL
    assert all(first_layer_with(r, "hidden_rel_l2") == 0 for r in records if r.index >= evicting[0])


@dataclass
class NoisyLayer(Dynamic):
    """Test-only: a dynamic cache whose layer `layer`'s cached values get Gaussian noise after every forward."""

    layer: int = 1
    scale: float = 0.5

    def forward(self, loaded, cache, sequence, new_tokens: int):
        logits = super().forward(loaded, cache, sequence, new_tokens)
        values = cache.layers[self.layer].values
        generator = torch.Generator().manual_seed(values.shape[-2])
        values[..., -new_tokens:, :] += self.scale * torch.randn(values[..., -new_tokens:, :].shape,
                                                                 generator=generator)
        return logits


def test_noise_in_one_layer_is_found_at_that_layer_and_no_earlier_one(tiny):
    _, records = lockstep(tiny, NoisyLayer(layer=1))
    for record in records:
        assert first_layer_with(record, "kv_error") == 1
        assert record.layers[1].value_error > 0.1 and record.layers[1].key_error == 0
        assert record.layers[0].kv_error == 0 and record.layers[0].hidden_rel_l2 == 0
    for record in records[1:]:  # the prefill's own token attends to its clean values; later steps read noise
        assert first_layer_with(record, "hidden_rel_l2") == 1 and record.layers[1].hidden_cosine < 1


def test_the_recomputed_attention_equals_eager_attention(tiny):
    model = tiny.model
    layer_count = len(model.model.layers)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode(), probe(model, attention=True) as seen:
            out = model(input_ids=PROMPT, output_attentions=True, use_cache=True)
    finally:
        model.set_attn_implementation(previous)
    for index in range(layer_count):
        keys = out.past_key_values.layers[index].keys[0]
        probs = attention_probs(model, index, seen.attention_input[index], keys)
        torch.testing.assert_close(probs, out.attentions[index][0, :, -1].float(), atol=1e-5, rtol=1e-4)


def test_the_full_sequence_loop_duplicates_the_cache_and_leaves_the_correct_loop(tiny):
    prompt = PROMPT[:, :4]
    session, records = lockstep(tiny, FullSequenceLoop(), prompt, GenerationSettings(max_new_tokens=10,
                                                                                      stop_at_eos=False))
    assert_equal_runs(records[0])  # the prefill is the correct loop's
    assert [r.cache_length for r in records] == [4 + sum(range(5, 5 + i)) for i in range(10)]
    assert records[-1].cache_length == 85 and records[-1].seen_tokens + 1 == 14  # 14 tokens, 85 positions
    for record in records[1:]:
        assert record.cache_length > record.seen_tokens
        assert first_layer_with(record, "hidden_rel_l2") == 0 and record.kl_nats > 0
        for layer in record.layers:
            assert layer.kv_error is None and "not one per token" in layer.reasons["kv_error"]
            assert layer.attention_lost is None and layer.reasons["attention_lost"]
    assert "whole sequence" in session.strategy.explanation


def test_positions_from_zero_keep_the_length_but_rotate_the_new_keys_wrongly(tiny):
    _, records = lockstep(tiny, RestartedPositionsLoop())
    assert_equal_runs(records[0])
    for record in records[1:]:
        assert record.cache_length == record.seen_tokens
        layer0 = record.layers[0]
        assert layer0.key_error > 0.01 and layer0.value_error == 0 and layer0.attention_lost == 0
        assert layer0.hidden_rel_l2 > 0


def test_unknown_measures_are_none_with_a_reason_never_zero(tiny):
    class Evicting:
        """A layer that holds fewer tokens than it saw and does not say which."""

        def __init__(self, layer):
            self.keys, self.values = layer.keys[..., 1:, :], layer.values[..., 1:, :]

        def get_seq_length(self):
            return self.keys.shape[-2]

    from kvlab.inspect.held import held_kv

    cache = Dynamic().build_cache(tiny, 20)
    with torch.inference_mode():
        tiny.model(input_ids=PROMPT, cache=cache, use_cache=True)
    held, reason = held_kv(Evicting(cache.layers[0]), PROMPT.shape[1])
    assert held is None and "does not say which" in reason


@pytest.mark.parametrize("argv,message", [
    (["diverge", "--prompt", " ", "--strategy", "sink"], "the prompt is empty"),
    (["diverge", "--prompt", "hi", "--strategy", "mystery"], "unknown strategy 'mystery'"),
    (["diverge", "--prompt", "hi", "--strategy", "sink", "--reference", "sink"], "--reference must be an exact"),
    (["diverge", "--prompt", "hi", "--strategy", "sink", "--steps", "0"], "--steps must be from 1 to"),
])
def test_the_diverge_command_refuses_bad_input_before_loading_a_model(argv, message, capsys):
    from kvlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab diverge: ") and message in err


def test_the_diverge_document_has_per_step_per_layer_records(tiny):
    import json

    from kvlab.cli.diverge import step_line
    from kvlab.inspect.diverge_run import diverge_record, parse_strategy

    session, records = lockstep(tiny, parse_strategy("loop:full_sequence"),
                                settings=GenerationSettings(max_new_tokens=3, stop_at_eos=False))
    data = json.loads(json.dumps(diverge_record(session, {"text": "x"}, {"name": "tiny"})))
    assert len(data["steps"]) == 3 and len(data["steps"][1]["layers"]) == 2
    assert data["steps"][1]["layers"][0]["kv_error"] is None and data["steps"][1]["layers"][0]["reasons"]
    assert data["explanation"] and data["reference"] == "dynamic"
    assert "cache 21/11 tokens" in step_line(records[1])  # 10 prompt slots + 11 fed again


@pytest.mark.parametrize("spec", [{"strategy": "knorm", "compression_ratio": 0.5},
                                  {"strategy": "tova", "compression_ratio": 0.5, "compress_every": 3}])
def test_an_eviction_cache_is_measured_on_every_layer_from_the_positions_it_holds(tiny, spec):
    """A scored-eviction layer says which positions it holds, so KV error and attention lost are measured (not
    None): layer 0's held keys are exact, and the attention the evicted positions had is lost from step 0."""
    prompt = torch.arange(10, 50)[None]
    _, records = lockstep(tiny, make_strategy(spec), prompt)
    for record in records:
        assert record.cache_length < record.seen_tokens
        for layer in record.layers:
            for name in PER_LAYER:
                assert getattr(layer, name) is not None, (record.index, layer.layer, name, layer.reasons)
            assert layer.attention_lost > 0 and layer.held_tokens < layer.reference_held_tokens
        assert record.layers[0].kv_error < FLOAT32_ATOL
