"""The speech wing without the real model: CTranslate2's file layout read back, the Whisper name mapping and
unfusing on a tiny random Whisper, word error rate, the shipped clips, and the refusals of strategies that do
not apply to an encoder-decoder cache."""

import json
import struct

import numpy as np
import pytest
import torch

from kvlab.models.ctranslate2 import Ct2FormatError, read_model_bin
from kvlab.models.whisper import whisper_config, whisper_state_dict
from kvlab.speech.clips import SAMPLE_RATE, list_clips, read_samples, word_error_rate, word_errors
from kvlab.speech.runner import (EVICTION_REASON, SINK_REASON, DecoderView, cross_bytes_predicted,
                                 speech_refusal)
from kvlab.strategies import make_strategy

DTYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
MAX_CLIP_BYTES = 150_000


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_model_bin(path, spec: str, variables: dict, aliases: dict) -> None:
    """A model.bin as CTranslate2's `ModelSpec.save` lays it out (binary version 6)."""
    out = [struct.pack("<I", 6), _string(spec), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, array in variables.items():
        array = np.array(array, order="C")  # (ascontiguousarray would make a scalar 1-d)
        out += [_string(name), struct.pack("<B", array.ndim), *[struct.pack("<I", d) for d in array.shape],
                struct.pack("<B", DTYPE_IDS[array.dtype]), struct.pack("<I", array.nbytes), array.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, name in aliases.items():
        out += [_string(alias), _string(name)]
    path.write_bytes(b"".join(out))


def test_the_reader_gives_back_every_variable_and_alias(tmp_path):
    variables = {"a/weight": np.arange(6, dtype=np.float16).reshape(2, 3), "a/num_heads": np.array(6, np.int16),
                 "b/bias": np.array([1.5, -2.0], np.float32)}
    write_model_bin(tmp_path / "model.bin", "ToySpec", variables, {"c/weight": "a/weight"})
    model = read_model_bin(tmp_path / "model.bin")
    assert (model.spec, model.revision, set(model.variables)) == ("ToySpec", 3, set(variables))
    for name, array in variables.items():
        assert model.get(name).dtype == array.dtype and np.array_equal(model.get(name), array)
    assert np.array_equal(model.get("c/weight"), variables["a/weight"]) and model.option("a/num_heads") == 6


def test_a_truncated_or_foreign_file_is_refused_with_where_it_stopped(tmp_path):
    write_model_bin(tmp_path / "model.bin", "ToySpec", {"a": np.zeros(4, np.float32)}, {})
    data = (tmp_path / "model.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-10])
    with pytest.raises(Ct2FormatError, match="truncated"):
        read_model_bin(tmp_path / "cut.bin")
    (tmp_path / "v9.bin").write_bytes(struct.pack("<I", 9) + data[4:])
    with pytest.raises(Ct2FormatError, match="binary version 9"):
        read_model_bin(tmp_path / "v9.bin")


def _ct2_from_transformers(model) -> dict:
    """A tiny WhisperForConditionalGeneration's weights fused and named as CTranslate2's Whisper converter does."""
    sd = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    zeros = np.zeros_like(sd["model.encoder.layers.0.self_attn.q_proj.bias"])
    out = {"encoder/num_heads": np.array(2, np.int16), "decoder/num_heads": np.array(2, np.int16)}
    for ours, theirs in [("conv1", "conv1"), ("conv2", "conv2")]:
        out[f"encoder/{theirs}/weight"], out[f"encoder/{theirs}/bias"] = (sd[f"model.encoder.{ours}.weight"],
                                                                          sd[f"model.encoder.{ours}.bias"])
    out["encoder/position_encodings/encodings"] = sd["model.encoder.embed_positions.weight"]
    out["decoder/position_encodings/encodings"] = sd["model.decoder.embed_positions.weight"]
    out["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    for part in ("encoder", "decoder"):
        out[f"{part}/layer_norm/gamma"], out[f"{part}/layer_norm/beta"] = (sd[f"model.{part}.layer_norm.weight"],
                                                                           sd[f"model.{part}.layer_norm.bias"])
        for i in range(2):
            p, t = f"model.{part}.layers.{i}", f"{part}/layer_{i}"
            attn = [(f"{p}.self_attn", f"{t}/self_attention")] + (
                [(f"{p}.encoder_attn", f"{t}/attention")] if part == "decoder" else [])
            for ours, theirs in attn:
                q, k, v, o = f"{ours}.q_proj", f"{ours}.k_proj", f"{ours}.v_proj", f"{ours}.out_proj"
                if theirs.endswith("self_attention"):
                    out[f"{theirs}/linear_0/weight"] = np.concatenate([sd[f"{q}.weight"], sd[f"{k}.weight"], sd[f"{v}.weight"]])
                    out[f"{theirs}/linear_0/bias"] = np.concatenate([sd[f"{q}.bias"], zeros, sd[f"{v}.bias"]])
                    out[f"{theirs}/linear_1/weight"], out[f"{theirs}/linear_1/bias"] = sd[f"{o}.weight"], sd[f"{o}.bias"]
                else:
                    out[f"{theirs}/linear_0/weight"], out[f"{theirs}/linear_0/bias"] = sd[f"{q}.weight"], sd[f"{q}.bias"]
                    out[f"{theirs}/linear_1/weight"] = np.concatenate([sd[f"{k}.weight"], sd[f"{v}.weight"]])
                    out[f"{theirs}/linear_1/bias"] = np.concatenate([zeros, sd[f"{v}.bias"]])
                    out[f"{theirs}/linear_2/weight"], out[f"{theirs}/linear_2/bias"] = sd[f"{o}.weight"], sd[f"{o}.bias"]
                norm = f"{p}.{'self_attn' if theirs.endswith('self_attention') else 'encoder_attn'}_layer_norm"
                out[f"{theirs}/layer_norm/gamma"], out[f"{theirs}/layer_norm/beta"] = sd[f"{norm}.weight"], sd[f"{norm}.bias"]
            out[f"{t}/ffn/layer_norm/gamma"], out[f"{t}/ffn/layer_norm/beta"] = (sd[f"{p}.final_layer_norm.weight"],
                                                                                 sd[f"{p}.final_layer_norm.bias"])
            for j, fc in enumerate(("fc1", "fc2")):
                out[f"{t}/ffn/linear_{j}/weight"], out[f"{t}/ffn/linear_{j}/bias"] = sd[f"{p}.{fc}.weight"], sd[f"{p}.{fc}.bias"]
    return out


def test_the_mapping_unfuses_a_tiny_whisper_back_to_its_own_weights(tmp_path):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=96, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_source_positions=20, max_target_positions=16, pad_token_id=0, bos_token_id=0,
                           eos_token_id=0, decoder_start_token_id=1)
    model = WhisperForConditionalGeneration(config).eval()
    write_model_bin(tmp_path / "model.bin", "WhisperSpec", _ct2_from_transformers(model),
                    {"decoder/projection/weight": "decoder/embeddings/weight"})
    ct2 = read_model_bin(tmp_path / "model.bin")
    mapped = whisper_config(ct2, {"suppress_ids": [1, 2], "suppress_ids_begin": [3]})
    assert (mapped.encoder_layers, mapped.decoder_layers, mapped.d_model, mapped.encoder_attention_heads,
            mapped.max_source_positions, mapped.max_target_positions) == (2, 2, 32, 2, 20, 16)
    state = whisper_state_dict(ct2, mapped)
    expected = {k: v for k, v in model.state_dict().items() if k != "proj_out.weight"}
    assert set(state) == set(expected)
    for name, tensor in expected.items():  # the test's fusing went through float16
        assert torch.equal(state[name], tensor.half().float()), name


def test_a_key_projection_with_a_bias_is_refused(tmp_path):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(vocab_size=96, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_source_positions=20, max_target_positions=16, pad_token_id=0, bos_token_id=0,
                           eos_token_id=0, decoder_start_token_id=1)
    variables = _ct2_from_transformers(WhisperForConditionalGeneration(config))
    variables["encoder/layer_0/self_attention/linear_0/bias"][40] = 1.0  # inside the key's third
    write_model_bin(tmp_path / "model.bin", "WhisperSpec", variables, {})
    ct2 = read_model_bin(tmp_path / "model.bin")
    with pytest.raises(Ct2FormatError, match="key projection has a bias"):
        whisper_state_dict(ct2, whisper_config(ct2, {}))


@pytest.mark.parametrize("reference, hypothesis, errors", [
    ("Find it and memorize it.", "find it and memorize it", 0),
    ("Find it and memorize it.", "Find it, memorise it!", 2),  # one deletion, one substitution
    ("the sky is blue", "the sky is very blue", 1),  # one insertion
    ("It's blue.", "its blue", 1),
])
def test_word_errors_count_substitutions_deletions_and_insertions(reference, hypothesis, errors):
    assert word_errors(reference, hypothesis)[0] == errors
    assert word_error_rate(reference, hypothesis) == errors / len(reference.split())


def test_the_shipped_clips_are_small_16_khz_mono_and_speak_a_shipped_sentence():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    clips = list_clips()
    assert 3 <= len(clips) <= 5
    for clip in clips.values():
        samples = read_samples(clip.path)
        assert clip.path.stat().st_size < MAX_CLIP_BYTES
        assert abs(len(samples) / SAMPLE_RATE - clip.seconds) < 0.01 and 0.05 < np.abs(samples).max() <= 1
        assert clip.text.rstrip(".") in " ".join((root / clip.source).read_text(encoding="utf-8").split())
    index = json.loads((clips[next(iter(clips))].path.parent / "clips.json").read_text())
    assert "espeak-ng" in index["made_with"]


def test_a_clip_that_is_not_16_khz_mono_is_refused_in_one_line(tmp_path):
    import wave

    with wave.open(str(tmp_path / "stereo.wav"), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(44_100)
        out.writeframes(b"\0" * 400)
    with pytest.raises(ValueError, match="2 channel"):
        read_samples(tmp_path / "stereo.wav")


def _view():
    from transformers import WhisperConfig

    config = WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                           decoder_attention_heads=6, max_source_positions=1500)
    return DecoderView(config, torch.nn.Linear(1, 1), torch.device("cpu"))


@pytest.mark.parametrize("spec, reason", [
    ("snapkv", EVICTION_REASON), ("knorm", EVICTION_REASON), ("triattention", EVICTION_REASON),
    ("sink", SINK_REASON), ("dynamic", None), ("static", None), ("no_cache", None),
])
def test_eviction_and_sink_are_refused_for_an_encoder_decoder_cache_with_their_reason(spec, reason):
    assert speech_refusal(make_strategy({"strategy": spec}), _view()) == reason


def test_other_strategies_are_refused_naming_what_a_speech_column_runs():
    message = speech_refusal(make_strategy({"strategy": "rotation_quantized"}), _view())
    assert "dynamic, static, quantized" in message and "\n" not in message


def test_the_cross_attention_bytes_are_two_times_layers_positions_width_and_value_bytes():
    assert cross_bytes_predicted(_view().config, torch.float32) == 2 * 4 * 1500 * 384 * 4 == 18_432_000
    assert cross_bytes_predicted(_view().config, torch.float16) == 9_216_000
