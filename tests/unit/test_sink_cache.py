"""Unit tests of the attention-sink cache (StreamingLLM) on tensors and tiny random models built in-process."""

import threading

import pytest
import torch
from transformers import (
    DynamicCache,
    GPT2Config,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from kvlab.accounting import cache_bytes
from kvlab.columns import Column
from kvlab.models.loading import LoadedModel, ModelSpec
from kvlab.quality.perplexity import ppl_by_segment, run_perplexity
from kvlab.quality.report import TokenScored
from kvlab.caches.rotary import KeyRerotator, inv_freq_from_config, unsupported_reason
from kvlab.caches.sink import SinkCache, SinkLayer, prefill_in_chunks
from kvlab.strategies import make_strategy

VOCAB = 128
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024)
HEAD_DIM = 16
KV_HEADS = 2


def tiny_model(cls=LlamaForCausalLM, config_cls=LlamaConfig, seed=0, **overrides):
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **overrides})
    return cls(config).eval()


@pytest.fixture(scope="module")
def llama():
    return tiny_model()


def as_loaded(model) -> LoadedModel:
    """`model` as the engine takes it (no tokenizer needed to stream ids)."""
    return LoadedModel(ModelSpec(source="tiny-llama", device="cpu"), model, None, torch.device("cpu"), 0.0, "tiny")


def random_ids(n, seed=1):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def rope(raw, positions, inv_freq):
    """Reference RoPE: `raw` (batch, heads, seq, head_dim) rotated at `positions` (seq,), in float64."""
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    half = raw.shape[-1] // 2
    work = raw.double()
    rotated = torch.cat([-work[..., half:], work[..., :half]], dim=-1)
    return (work * angles.cos() + rotated * angles.sin()).to(raw.dtype)


# --- knobs and support -------------------------------------------------------------------------

@pytest.mark.parametrize("window", [0, -3, 2.5, True, "8", None])
def test_window_length_must_be_positive_int(window):
    with pytest.raises(ValueError, match=r"window_length must be an integer >= 1") as err:
        SinkLayer(window, 0)
    assert repr(window) in str(err.value)


@pytest.mark.parametrize("sinks", [-1, 8, 9, 1.5, False])
def test_num_sink_tokens_must_be_below_window(sinks):
    with pytest.raises(ValueError, match=r"0 <= num_sink_tokens < window_length \(0\.\.7 for window_length=8\)") as err:
        SinkLayer(8, sinks)
    assert str(err.value).endswith(f"got {sinks!r}")


def test_sink_cache_validates_knobs_before_model():
    with pytest.raises(ValueError, match="num_sink_tokens"):
        SinkCache(GPT2Config(), 4, 4)


@pytest.mark.parametrize("config, reason", [
    (GPT2Config(), "model_type 'gpt2' is not one of"),
    (MistralConfig(sliding_window=4096), "config.sliding_window is 4096"),
    (Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=1, num_hidden_layers=2),
     r"layers other than full attention \(sliding_attention\)"),
    (LlamaConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'dynamic' is not one of"),
    (LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor is 0.5"),
], ids=["gpt2", "mistral-sliding", "qwen2-sliding-layers", "rope-dynamic", "partial-rotary"])
def test_unservable_models_are_refused_with_reason(config, reason):
    assert unsupported_reason(config) is not None
    with pytest.raises(ValueError, match="SinkCache cannot serve this model: .*" + reason):
        SinkCache(config, 16, 4)


def test_supported_model_has_no_reason_and_one_layer_per_decoder_layer(llama):
    assert unsupported_reason(llama.config) is None
    cache = SinkCache.from_model(llama, 16, 4)
    assert len(cache.layers) == TINY["num_hidden_layers"]
    assert all(isinstance(layer, SinkLayer) for layer in cache.layers)
    assert cache.get_max_length() == 16


def test_rotary_module_of_unsupported_type_is_refused(llama):
    rotary = LlamaRotaryEmbedding(llama.config)
    rotary.rope_type = "longrope"
    with pytest.raises(ValueError, match="rotary embedding type 'longrope'"):
        SinkCache(llama.config, 16, 4, rotary=rotary)


def test_inv_freq_of_wrong_size_is_refused(llama):
    with pytest.raises(ValueError, match="expected head_dim // 2 = 8"):
        SinkCache(llama.config, 16, 4, rotary=torch.ones(5))


# --- re-rotation ---------------------------------------------------------------------------------

ROPE_CONFIGS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 128},
}


@pytest.mark.parametrize("rope_type", sorted(ROPE_CONFIGS))
def test_rerotated_keys_equal_keys_rotated_fresh_at_new_position(rope_type):
    config = LlamaConfig(**{**TINY, "rope_parameters": ROPE_CONFIGS[rope_type]})
    rotary = LlamaRotaryEmbedding(config)
    assert torch.allclose(inv_freq_from_config(config), rotary.inv_freq)
    raw = torch.randn(1, KV_HEADS, 6, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    old = torch.tensor([[5, 17, 100, 250, 600, 900]])
    shift = -37
    cos, sin = rotary(raw, old)
    _, at_old = apply_rotary_pos_emb(raw, raw, cos, sin)
    cos, sin = rotary(raw, old + shift)
    _, fresh = apply_rotary_pos_emb(raw, raw, cos, sin)

    moved = KeyRerotator(rotary.inv_freq).rotate(at_old, shift)

    assert not torch.allclose(at_old, fresh, atol=1e-2)
    torch.testing.assert_close(moved, fresh, atol=2e-5, rtol=1e-5)


def test_rotation_by_zero_is_identity_and_head_dim_is_checked():
    rerotator = KeyRerotator(torch.ones(HEAD_DIM // 2))
    keys = torch.randn(1, KV_HEADS, 3, HEAD_DIM)
    assert rerotator.rotate(keys, 0) is keys
    with pytest.raises(ValueError, match="head_dim 12 but the rotary embedding covers 16"):
        rerotator.rotate(torch.randn(1, 1, 2, 12), 1)


# --- eviction and cache positions on synthetic keys ---------------------------------------------

INV_FREQ = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))


def feed(layer, raw_keys, chunks, explicit_positions=False):
    """Feed raw (unrotated) keys chunk by chunk the way a model would, checking every step.

    Values carry the token index so what is kept can be read back. With `explicit_positions`
    the tokens are rotated at their index in the stream and the positions are passed on, as
    `generate()` does; otherwise at the cache's length, the model's default.
    """
    seen = 0
    for size in chunks:
        held = layer.get_seq_length()
        start = seen if explicit_positions else held
        positions = torch.arange(start, start + size)
        new_raw = raw_keys[..., seen:seen + size, :]
        values = torch.arange(seen, seen + size, dtype=torch.float32).view(1, 1, size, 1).expand(
            1, KV_HEADS, size, HEAD_DIM)
        kv_length, kv_offset = layer.get_mask_sizes(size)
        kwargs = {"kwargs": {"position_ids": positions[None]}} if explicit_positions else {}

        keys, values_out = layer.update(rope(new_raw, positions, INV_FREQ), values, **kwargs)

        attended = values_out[0, 0, :, 0].long()
        assert keys.shape[-2] == values_out.shape[-2] == kv_length
        assert kv_offset + kv_length == held + size, "new keys must line up with queries at held + i"
        # Returned keys sit in the queries' frame: the last new token at its own position, others packed before it.
        expected_positions = torch.arange(kv_length) + (start + size - kv_length)
        torch.testing.assert_close(keys, rope(raw_keys[..., attended, :], expected_positions, INV_FREQ),
                                   atol=1e-5, rtol=1e-5)
        stored = layer.values[0, 0, :, 0].long()
        torch.testing.assert_close(layer.keys, rope(raw_keys[..., stored, :], torch.arange(len(stored)), INV_FREQ),
                                   atol=1e-5, rtol=1e-5)
        seen += size
    return seen


@pytest.mark.parametrize("chunks", [[1] * 40, [3] * 13 + [1], [25, 1, 1, 10, 1], [40], [2, 30, 5, 3]])
@pytest.mark.parametrize("sinks", [0, 1, 4])
@pytest.mark.parametrize("explicit_positions", [False, True])
def test_eviction_keeps_first_sinks_and_last_tokens_at_cache_positions(chunks, sinks, explicit_positions):
    window = 12
    layer = SinkLayer(window, sinks, KeyRerotator(INV_FREQ))
    raw = torch.randn(1, KV_HEADS, sum(chunks), HEAD_DIM, generator=torch.Generator().manual_seed(3))

    seen = feed(layer, raw, chunks, explicit_positions)

    expected = list(range(sinks)) + list(range(seen - (window - sinks), seen))
    assert layer.values[0, 0, :, 0].long().tolist() == expected
    assert layer.get_seq_length() == window
    assert layer.seen_tokens == seen
    assert layer.evicted_tokens == seen - window


def test_single_token_step_attends_to_exactly_window_keys():
    layer = SinkLayer(8, 2, KeyRerotator(INV_FREQ))
    raw = torch.randn(1, KV_HEADS, 30, HEAD_DIM)
    feed(layer, raw, [8])
    assert layer.get_mask_sizes(1) == (8, 1)
    keys, _ = layer.update(rope(raw[..., 8:9, :], torch.tensor([8]), INV_FREQ), torch.zeros(1, KV_HEADS, 1, HEAD_DIM))
    assert keys.shape[-2] == 8


def test_short_stream_is_kept_whole():
    layer = SinkLayer(16, 4, KeyRerotator(INV_FREQ))
    raw = torch.randn(1, KV_HEADS, 10, HEAD_DIM)
    feed(layer, raw, [3, 1, 6])
    assert layer.values[0, 0, :, 0].long().tolist() == list(range(10))
    assert layer.evicted_tokens == 0


def test_rows_at_different_positions_are_refused():
    layer = SinkLayer(8, 2, KeyRerotator(INV_FREQ))
    keys = torch.randn(2, KV_HEADS, 3, HEAD_DIM)
    with pytest.raises(ValueError, match=r"same positions \(no padding\); got start positions \[0, 2\]"):
        layer.update(keys, keys, kwargs={"position_ids": torch.tensor([[0, 1, 2], [2, 3, 4]])})


def test_reset_empties_and_crop_is_refused():
    layer = SinkLayer(8, 2, KeyRerotator(INV_FREQ))
    feed(layer, torch.randn(1, KV_HEADS, 10, HEAD_DIM), [10])
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        layer.crop(-1)
    layer.reset()
    assert layer.get_seq_length() == 0 and layer.seen_tokens == 0 and layer.evicted_tokens == 0


# --- on tiny random models -------------------------------------------------------------------------

def greedy_loop(model, prompt, new_tokens, cache):
    """Manual greedy decode with the model's default positions; returns (token ids, per-step logits)."""
    out = model(input_ids=prompt, cache=cache, use_cache=True)
    tokens, logits = [], [out.logits[:, -1]]
    for _ in range(new_tokens - 1):
        tokens.append(int(logits[-1].argmax(-1)))
        out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True)
        logits.append(out.logits[:, -1])
    tokens.append(int(logits[-1].argmax(-1)))
    return tokens, logits


@torch.inference_mode()
def test_greedy_equals_dynamic_while_under_window(llama):
    prompt = random_ids(10)
    window = 48
    dense, _ = greedy_loop(llama, prompt, 30, DynamicCache(config=llama.config))
    sink, _ = greedy_loop(llama, prompt, 30, SinkCache.from_model(llama, window, 4))
    assert sink == dense
    by_generate = llama.generate(prompt, max_new_tokens=30, do_sample=False,
                                 cache=SinkCache.from_model(llama, window, 4))
    assert by_generate[0, 10:].tolist() == dense


@torch.inference_mode()
def test_generate_past_window_equals_manual_loop(llama):
    """generate() rotates queries at stream positions, the manual loop at cache positions; the cache
    puts returned keys in the query's frame, so both see the same relative distances."""
    prompt = random_ids(20)
    out = llama.generate(prompt, max_new_tokens=60, do_sample=False, cache=SinkCache.from_model(llama, 16, 4),
                         output_logits=True, return_dict_in_generate=True)
    tokens, logits = greedy_loop(llama, prompt, 60, SinkCache.from_model(llama, 16, 4))
    assert out.sequences[0, 20:].tolist() == tokens
    for step, (a, b) in enumerate(zip(out.logits, logits)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {step}")


@torch.inference_mode()
def test_past_window_length_and_bytes_stay_constant(llama):
    window, sinks = 16, 4
    cache = SinkCache.from_model(llama, window, sinks)
    llama(input_ids=random_ids(5), cache=cache, use_cache=True)
    full_bytes = 2 * TINY["num_hidden_layers"] * KV_HEADS * window * HEAD_DIM * 4
    token = torch.tensor([[7]])
    sizes = []
    for step in range(60):
        out = llama(input_ids=token, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        sizes.append((cache.get_seq_length(), cache_bytes(cache)))
    after_full = sizes[window - 5:]
    assert all(size == (window, full_bytes) for size in after_full)
    assert cache.seen_tokens == 65 and cache.evicted_tokens == 65 - window


@pytest.mark.parametrize("cls, config_cls, extra", [
    (LlamaForCausalLM, LlamaConfig, {}),
    (MistralForCausalLM, MistralConfig, {"sliding_window": None}),
    (Qwen2ForCausalLM, Qwen2Config, {}),
    (Qwen3ForCausalLM, Qwen3Config, {"head_dim": HEAD_DIM}),
], ids=["llama", "mistral", "qwen2", "qwen3"])
@torch.inference_mode()
def test_first_layer_cache_equals_fresh_forward_of_kept_tokens(cls, config_cls, extra):
    """Layer-0 keys depend only on the token and its position, so after the window slides they
    must equal a fresh dense forward of the kept tokens (sinks + most recent) at positions 0..W-1."""
    model = tiny_model(cls, config_cls, **extra)
    window, sinks, total = 16, 4, 45
    ids = random_ids(total)
    cache = SinkCache.from_model(model, window, sinks)
    prefill_in_chunks(model, ids[:, :9], cache, chunk_size=4)
    for t in range(9, total):
        model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)

    kept = torch.cat([ids[:, :sinks], ids[:, total - (window - sinks):]], dim=-1)
    fresh = DynamicCache(config=model.config)
    model(input_ids=kept, cache=fresh, use_cache=True)

    torch.testing.assert_close(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.layers[0].values, fresh.layers[0].values, atol=1e-6, rtol=1e-6)


@torch.inference_mode()
def test_window_attention_equals_dense_with_band_mask(llama):
    """With no sinks, RoPE's relative positions make streaming window attention equal to a dense
    forward whose mask lets each token see itself and the previous window-1 tokens."""
    window, total = 12, 40
    ids = random_ids(total)
    idx = torch.arange(total)
    band = (idx[None, :] <= idx[:, None]) & (idx[None, :] > idx[:, None] - window)
    reference = llama(input_ids=ids, attention_mask=band[None, None]).logits[0]

    cache = SinkCache.from_model(llama, window, 0)
    streamed = torch.cat([llama(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True).logits[0]
                          for t in range(total)])

    torch.testing.assert_close(streamed, reference, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_prefill_in_chunks_of_one_equals_token_by_token(llama):
    ids = random_ids(30)
    chunked_cache = SinkCache.from_model(llama, 10, 2)
    last = prefill_in_chunks(llama, ids, chunked_cache, chunk_size=1)
    cache = SinkCache.from_model(llama, 10, 2)
    for t in range(30):
        out = llama(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
    torch.testing.assert_close(last.logits, out.logits)
    assert chunked_cache.get_seq_length() == 10


def test_prefill_in_chunks_validates_arguments(llama):
    cache = SinkCache.from_model(llama, 10, 2)
    with pytest.raises(ValueError, match=r"chunk_size must be an integer >= 1 \(tokens per forward\); got 0"):
        prefill_in_chunks(llama, random_ids(5), cache, chunk_size=0)
    with pytest.raises(ValueError, match=r"seq >= 1; got shape \(1, 0\)"):
        prefill_in_chunks(llama, torch.zeros(1, 0, dtype=torch.long), cache)


# --- streaming perplexity ------------------------------------------------------------------------

def stream(model, ids, strategy) -> list:
    """The Perplexity view's curve of one cache: its `TokenScored` events, in order."""
    events = run_perplexity(as_loaded(model), ids, [Column(strategy)])
    return [event for event in events if isinstance(event, TokenScored)]


def test_streaming_with_a_dense_cache_equals_the_teacher_forced_nll(llama):
    ids = random_ids(25)
    with torch.inference_mode():
        log_probs = torch.log_softmax(llama(input_ids=ids).logits[0, :-1], dim=-1)
    expected = (-log_probs.gather(-1, ids[0, 1:, None])[:, 0]).tolist()

    seen = stream(llama, ids, make_strategy({"strategy": "dynamic"}))

    assert [e.nll for e in seen] == pytest.approx(expected, abs=1e-4)
    assert [e.position for e in seen] == list(range(1, 25))
    per_token = 2 * TINY["num_hidden_layers"] * KV_HEADS * HEAD_DIM * 4
    assert [e.cache_bytes for e in seen] == [per_token * p for p in range(1, 25)]


def test_streaming_under_a_sink_cache_holds_its_bytes_and_stops_on_its_event(llama):
    stop = threading.Event()
    sink = make_strategy({"strategy": "sink", "window_length": 8, "num_sink_tokens": 2})
    seen = []
    for event in run_perplexity(as_loaded(llama), random_ids(40)[0], [Column(sink)], stop):
        if isinstance(event, TokenScored):
            seen.append(event)
            if event.position == 20:
                stop.set()

    assert len(seen) == 20
    assert {e.cache_bytes for e in seen[8:]} == {2 * TINY["num_hidden_layers"] * KV_HEADS * 8 * HEAD_DIM * 4}


def test_streaming_refuses_a_text_of_one_token(llama):
    with pytest.raises(ValueError, match="at least 2 tokens"):
        stream(llama, torch.tensor([[3]]), make_strategy({"strategy": "dynamic"}))


def test_ppl_by_segment():
    nll = [1.0, 1.0, 3.0, 3.0, 0.5]
    segments = ppl_by_segment(nll, 2)
    assert [(s["start"], s["end"]) for s in segments] == [(0, 2), (2, 4), (4, 5)]
    assert [s["ppl"] for s in segments] == pytest.approx([2.718281828, 20.08553692, 1.648721271])
    with pytest.raises(ValueError, match=r"segment_len must be an integer >= 1 \(tokens\); got 0"):
        ppl_by_segment(nll, 0)
