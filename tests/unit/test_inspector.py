"""Inspect on the tiny random Llama: the engine's traced steps, stepping to the end equals a Compare column,
the per-layer table and token strip for each kind of cache, the reference top-5 and KL, layer-part bytes,
refusals, and the `inspect` command's input checks."""

import json

import pytest
import torch

from kvlab.accounting import LAYER_PARTS, layer_bytes_by_device, layer_parts
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.inspect.inspector import MAX_INSPECT_STEPS, InspectError, InspectSession, layer_rows
from kvlab.strategies import make_strategy

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404, 405, 406, 407, 408]])
SETTINGS = GenerationSettings(max_new_tokens=16, stop_at_eos=False)
PER_TOKEN = 2 * 1 * 64 * 4  # keys + values, 1 KV head x 64 dims, fp32, per layer
SINK = {"strategy": "sink", "window_length": 8, "num_sink_tokens": 2}
QUANTIZED = {"strategy": "quantized", "backend": "hqq", "nbits": 4, "residual_length": 4}


def session(tiny, spec, settings=SETTINGS, **kwargs):
    return InspectSession(tiny, make_strategy(spec), PROMPT, settings, **kwargs)


@pytest.mark.parametrize("spec", [{"strategy": "dynamic"}, SINK, QUANTIZED])
def test_stepping_to_the_end_gives_the_compare_columns_tokens(tiny, spec):
    inspect = session(tiny, spec)
    records = list(inspect.steps(MAX_INSPECT_STEPS))
    column = collect(run_compare(tiny, PROMPT, [spec], SETTINGS)).results[0]
    assert [r.token_id for r in records] == column.token_ids == inspect.token_ids
    assert [r.cache_bytes for r in records] == column.cache_bytes
    assert inspect.finished and inspect.stop_reason == "length" and inspect.step() is None


def test_steps_report_what_each_forward_was_given(tiny):
    records = list(session(tiny, {"strategy": "dynamic"}).steps(3))
    prefill, decode = records[0], records[2]
    assert prefill.input_shape == (1, 10) and prefill.last.position_ids == (0, 9)
    assert prefill.last.cache_position == (0, 9) and prefill.mask_shape == (1, 1, 10, 10)
    assert decode.input_shape == (1, 1) and decode.last.past_tokens == 11
    assert decode.last.position_ids == decode.last.cache_position == (11, 11)
    assert decode.mask_shape == (1, 1, 1, 12) and decode.seen_tokens == 12
    record = decode.to_json()
    json.dumps(record)
    assert record["position_ids"] == (11, 11) and record["attention_mask_shape"] == (1, 1, 1, 12)
    assert len(record["top"]) == 5 and record["top"][0]["token_id"] == decode.token_id


def test_a_sink_prefill_is_fed_in_window_sized_chunks_at_positions_inside_the_window(tiny):
    records = list(session(tiny, SINK).steps(2))
    chunks = records[0].forwards
    assert [f.new_tokens for f in chunks] == [6, 4]  # window 8 - 2 sinks per chunk
    assert all(f.position_ids == (f.past_tokens, f.past_tokens + f.new_tokens - 1) for f in chunks)
    assert records[1].last.position_ids == (8, 8) and records[1].mask_shape == (1, 1, 1, 8)


def test_the_layer_table_of_a_dynamic_cache(tiny):
    record = list(session(tiny, {"strategy": "dynamic"}).steps(4))[-1]
    assert record.layer_count == 2 and [row.layers for row in record.layers] == [(0, 0), (1, 1)]
    row = record.layers[0]
    assert (row.layer_type, row.class_name) == ("full_attention", "DynamicLayer")
    assert (row.held_tokens, row.capacity) == (13, None)
    assert row.key_shape == row.value_shape == (1, 1, 13, 64) and row.dtype == "float32"
    assert row.bytes == row.parts["keys_values"] == 13 * PER_TOKEN and row.devices == {"cpu": 13 * PER_TOKEN}
    assert row.strip == (("held", 0, 13),)
    assert record.cache_bytes == 2 * row.bytes
    assert record.reference_top is None and record.kl_nats is None


def test_a_sink_cache_shows_its_sinks_its_window_and_the_evicted_tokens(tiny):
    records = list(session(tiny, SINK).steps(6))
    row = records[-1].layers[0]
    assert (row.class_name, row.held_tokens, row.capacity) == ("SinkLayer", 8, 8)
    seen = records[-1].seen_tokens
    assert row.strip == (("sink", 0, 2), ("evicted", 2, seen - 6), ("held", seen - 6, seen))
    assert records[-1].reference_top is not None and records[-1].kl_nats >= 0


def test_a_quantized_cache_splits_packed_data_scales_and_residual(tiny):
    records = list(session(tiny, QUANTIZED).steps(3))
    row = records[-1].layers[0]
    assert row.class_name == "HQQQuantizedLayer" and row.held_tokens == records[-1].seen_tokens == 12
    assert row.key_shape == (1, 1, 2, 64) and row.quantized_shape == (1, 1, 10, 64)
    assert row.strip == (("quantized", 0, 10), ("residual", 10, 12))
    assert row.parts["residual"] == 2 * PER_TOKEN and row.parts["packed"] > 0 and row.parts["scales"] > 0
    assert sum(row.parts.values()) == row.bytes
    assert records[0].kl_nats is not None and records[0].reference_top[0].prob > 0


def test_a_rotation_quantized_cache_shows_codes_norms_tables_and_the_shape_they_stand_for(tiny):
    records = list(session(tiny, {"strategy": "rotation_quantized", "key_bits": 4, "value_bits": 2,
                                  "residual_length": 4}).steps(3))
    first, second = records[-1].layers[0], records[-1].layers[1]
    assert first.class_name == "RotationQuantizedLayer" and first.quantized_shape == (1, 1, 10, 64)
    assert first.strip == (("quantized", 0, 10), ("residual", 10, 12))
    assert first.parts["packed"] == 10 * (32 + 16) and first.parts["scales"] == 10 * 2 * 2
    assert first.parts["residual"] == 2 * PER_TOKEN and first.parts["other"] == 4 * (64 * 64 + 31 + 7)
    assert second.parts["other"] == 0 and sum(first.parts.values()) == first.bytes  # the tables once per cache
    assert records[0].kl_nats is not None


def test_a_static_cache_shows_its_unused_slots_and_collapses_identical_layers(tiny):
    record = list(session(tiny, {"strategy": "static"}, max_shown=1).steps(2))[-1]
    (row,) = record.layers
    assert row.layers == (0, 1) and row.count == 2
    assert row.capacity == 26 and row.strip == (("held", 0, 11), ("unused", 11, 26))
    assert row.parts["other"] > 0  # the position counter


def test_no_cache_has_no_layers(tiny):
    record = list(session(tiny, {"strategy": "no_cache"}).steps(2))[-1]
    assert record.layers == () and record.cache_bytes == 0 and record.input_shape == (1, 11)


def test_reset_starts_over_with_the_same_tokens(tiny):
    inspect = session(tiny, SINK)
    first = [r.token_id for r in inspect.steps(5)]
    inspect.reset()
    assert inspect.records == [] and [r.token_id for r in inspect.steps(5)] == first


@pytest.mark.parametrize("spec", [{"strategy": "dynamic"}, QUANTIZED, SINK, {"strategy": "static"},
                                  {"strategy": "quantized", "backend": "quanto"},
                                  {"strategy": "quantized", "backend": "fp8"}, {"strategy": "rotation_quantized"}])
def test_layer_parts_add_up_to_the_layer_bytes(tiny, spec):
    strategy = make_strategy(spec)
    cache = strategy.build_cache(tiny, 40)
    Decoder(tiny, strategy, cache, PROMPT, GenerationSettings(max_new_tokens=7, stop_at_eos=False)).run()
    for layer in cache.layers:
        parts = layer_parts(layer)
        assert set(parts) == set(LAYER_PARTS)
        counted = sum(sum(by_device.values()) for by_device in parts.values())
        assert counted == sum(layer_bytes_by_device(layer).values())
    assert layer_rows(cache, tiny.config, 17)


@pytest.mark.parametrize("spec,settings,message", [
    ({"strategy": "static", "compile": True}, SETTINGS, "turn compile off"),
    ({"strategy": "static", "max_cache_len": 12}, SETTINGS, "static cache too small"),
    ({"strategy": "offloaded"}, SETTINGS, "needs a CUDA GPU"),
    ({"strategy": "dynamic"}, GenerationSettings(max_new_tokens=MAX_INSPECT_STEPS + 1), f"at most {MAX_INSPECT_STEPS}"),
    ({"strategy": "dynamic"}, GenerationSettings(max_new_tokens=0), "max_new_tokens must be between"),
])
def test_sessions_that_cannot_start_say_why(tiny, spec, settings, message):
    with pytest.raises(InspectError, match=message):
        session(tiny, spec, settings)


def test_a_decoder_moved_to_another_cache_refeeds_everything_and_keeps_its_tokens(tiny):
    dynamic, sink = make_strategy({"strategy": "dynamic"}), make_strategy(SINK)
    decoder = Decoder(tiny, dynamic, dynamic.build_cache(tiny, 30), PROMPT, SETTINGS, trace=True)
    before = [next(decoder).token_id for _ in range(3)]
    decoder.replace_cache(sink, sink.build_cache(tiny, 30))
    step = next(decoder)
    assert decoder.token_ids[:3] == before and step.index == 3
    assert step.fed_ids == tuple(PROMPT[0].tolist()) + tuple(before) and step.seen_tokens == 13
    assert sum(f.new_tokens for f in step.trace.forwards) == 13 and decoder.cache.layers[0].keys.shape[-2] == 8
    assert len(next(decoder).fed_ids) == 1


def test_a_failed_step_can_run_again(tiny):
    dynamic = make_strategy({"strategy": "dynamic"})
    reference = Decoder(tiny, dynamic, dynamic.build_cache(tiny, 30), PROMPT, SETTINGS).run().token_ids
    decoder = Decoder(tiny, dynamic, dynamic.build_cache(tiny, 30), PROMPT, SETTINGS)
    next(decoder)
    forward = dynamic.forward
    dynamic.forward = lambda *args: (_ for _ in ()).throw(RuntimeError("transient"))
    with pytest.raises(RuntimeError):
        next(decoder)
    dynamic.forward = forward
    decoder.replace_cache(dynamic, dynamic.build_cache(tiny, 30))
    assert decoder.run().token_ids == reference


@pytest.mark.parametrize("argv,message", [
    (["inspect", "--prompt", " "], "the prompt is empty"),
    (["inspect", "--prompt", "hi", "--strategy", "sink:window_length=0"], "window_length must be an integer >= 1"),
    (["inspect", "--prompt", "hi", "--strategy", "mystery"], "unknown strategy 'mystery'"),
    (["inspect", "--prompt", "hi", "--steps", str(MAX_INSPECT_STEPS + 1)], f"--steps must be from 1 to {MAX_INSPECT_STEPS}"),
    (["inspect", "--prompt", "hi", "--steps", "0"], "--steps must be from 1 to"),
])
def test_the_inspect_command_refuses_bad_input_before_loading_a_model(argv, message, capsys):
    from kvlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab inspect: ") and message in err
