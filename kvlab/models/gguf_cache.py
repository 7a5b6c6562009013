"""The convert-once cache for GGUF models: de-quantize a `.gguf` file once into a float32 safetensors folder.

transformers reads a GGUF file by de-quantizing every tensor (and, for the
tokenizer, rebuilding it from the file's vocabulary), which takes 20-70 s on 2
cores. `convert_gguf` does it once and keeps the result in the user cache folder
(`KVLAB_CACHE_DIR`, default `~/.cache/kvlab`, falling back to a per-user folder
under the system's temporary folder when that cannot be written), so later
loads read plain safetensors in seconds. `check_gguf` refuses a file that is not
a complete GGUF file before anything slow runs. Used for the bundled models
(`kvlab.models.bundled`) and for any local `.gguf` file (`kvlab.models.load_model`).
This module converts; it does not load models for inference.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .sources import safe_line

CONVERTED_FORMAT_VERSION = "1"
FALLBACK_CACHE_PREFIX = "kvlab-cache"
GGUF_MAGIC = b"GGUF"
HASH_CHUNK_BYTES = 1 << 20
HASH_PREFIX_CHARS = 16
"""Hex characters of a file's sha256 that name its converted folder."""
TICK_S = 3.0
"""How often a long conversion step reports the seconds it has taken so far."""

ProgressFn = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """The model spec could not be resolved or loaded; the message says why."""


def cache_dir() -> Path:
    """User cache folder for converted models: `KVLAB_CACHE_DIR` or `~/.cache/kvlab`."""
    return Path(os.environ.get("KVLAB_CACHE_DIR") or Path.home() / ".cache" / "kvlab")


def fallback_cache_dir() -> Path:
    """Where converted models go when `~/.cache/kvlab` cannot be written and `KVLAB_CACHE_DIR` is unset: a
    per-user folder under the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"{FALLBACK_CACHE_PREFIX}-{os.getuid() if hasattr(os, 'getuid') else 0}"


def is_file(path: Path) -> bool:
    """Whether `path` is a file; a folder on the way that cannot be read counts as no."""
    try:
        return path.is_file()
    except OSError:
        return False


def write_problem(folder: Path) -> str | None:
    """Why `folder` cannot be created and written (the OS error text), or None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kvlab-write-test-"):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def writable_cache_dir(notify: ProgressFn) -> Path:
    """The folder a converted model can be written to: `cache_dir()` when writable; when it is not and
    `KVLAB_CACHE_DIR` is unset, `fallback_cache_dir()`, said through `notify` in one line.

    Raises:
        ModelLoadError: `KVLAB_CACHE_DIR` is set to a folder that cannot be written, or neither folder can;
            the message names the folder, the reason and the setting that fixes it.
    """
    preferred = cache_dir()
    problem = write_problem(preferred)
    if problem is None:
        return preferred
    if os.environ.get("KVLAB_CACHE_DIR"):
        raise ModelLoadError(f"cannot write the model cache folder {preferred} ({problem}); set KVLAB_CACHE_DIR "
                             "to a writable folder")
    fallback = fallback_cache_dir()
    fallback_problem = write_problem(fallback)
    if fallback_problem is not None:
        raise ModelLoadError(f"cannot write the model cache folder {preferred} ({problem}) nor {fallback} "
                             f"({fallback_problem}); set KVLAB_CACHE_DIR to a writable folder")
    notify(0.02, f"{preferred} cannot be written ({problem}): converting into {fallback} instead; set "
                 "KVLAB_CACHE_DIR to keep converted models elsewhere")
    return fallback


def converted_folder(folder_name: str) -> Path | None:
    """The finished converted folder `models/<folder_name>` in the cache folder or its fallback, or None."""
    for root in (cache_dir(), fallback_cache_dir()):
        if is_file(root / "models" / folder_name / "ready"):
            return root / "models" / folder_name
    return None


def check_gguf(path: Path) -> None:
    """Refuse `path` unless it is a complete GGUF file: the magic bytes, a header the `gguf` reader parses, and
    every tensor's data inside the file.

    No message quotes the file's content (its first bytes could be a secret's) or a folder above it.

    Raises:
        ModelLoadError: not a file, cannot be read, not GGUF, or truncated / damaged (says which).
    """
    if not is_file(path):
        raise ModelLoadError(f"{path.name} is not a file")
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
        size = path.stat().st_size
    except OSError as err:
        raise ModelLoadError(f"{path.name} cannot be read ({err.strerror or type(err).__name__})") from None
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"{path.name} is not a GGUF file: it does not start with the GGUF magic bytes")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as err:  # noqa: BLE001 - the reader fails in many ways on a damaged file; all mean the same
        raise ModelLoadError(f"{path.name} is not a complete GGUF file (truncated or damaged: "
                             f"{type(err).__name__})") from err
    if end > size:
        raise ModelLoadError(f"{path.name} is truncated: its tensors need {end:,} bytes, the file has {size:,}")


def content_hash(path: Path) -> str:
    """The sha256 of a file's content, hex (reads it in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_folder_name(path: Path) -> str:
    """The converted folder's name for a local GGUF file, keyed by its content: `<stem>-<sha256 prefix>-v<N>`."""
    return f"{path.stem}-{content_hash(path)[:HASH_PREFIX_CHARS]}-v{CONVERTED_FORMAT_VERSION}"


@contextmanager
def ticking(notify: ProgressFn, start: float, end: float, expected_s: float, message: str):
    """While the block runs, report `message` with the seconds so far every TICK_S, the fraction moving from
    `start` towards `end` (reached at `expected_s` seconds, and kept after)."""
    done = threading.Event()
    began = time.monotonic()

    def tick():
        while not done.wait(TICK_S):
            elapsed = time.monotonic() - began
            share = elapsed / (elapsed + expected_s)
            notify(start + (end - start) * 2 * min(share, 0.5), f"{message}: {elapsed:.0f} s")

    thread = threading.Thread(target=tick, daemon=True, name="kvlab-convert-progress")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def convert_gguf(gguf_path: Path, folder_name: str, display_name: str, notify: ProgressFn,
                 expected_s: float = 60.0) -> Path:
    """De-quantize `gguf_path` into `models/<folder_name>` of the cache folder, once; returns the folder.

    The GGUF flag is dropped from the config (transformers refuses to `save_pretrained` a GGUF-flagged
    model); weights are written with safetensors' shared-tensor-aware `save_model` (tied embeddings are
    kept once). The folder is written under a temporary name and renamed when complete, so an interrupted
    conversion leaves nothing that looks finished.

    Raises:
        ModelLoadError: no cache folder can be written, or transformers cannot read the file.
    """
    from safetensors.torch import save_model
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = writable_cache_dir(notify) / "models" / folder_name
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    source, name = gguf_path.parent, gguf_path.name
    try:
        with ticking(notify, 0.1, 0.7, expected_s, f"first load: de-quantizing {display_name} once "
                                                   f"(about {expected_s:.0f} s on 2 cores)"):
            tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(source, gguf_file=name, dtype=torch.float32)
        notify(0.75, f"saving a converted copy of {display_name} for the next loads")
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.name_or_path = display_name
        config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        (staging / "ready").write_text(name + "\n")
    except BaseException as err:  # also Ctrl-C: no half-written folder is left behind
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, (OSError, ValueError, KeyError, RuntimeError)):
            raise ModelLoadError(f"could not convert {name}: {type(err).__name__}: {safe_line(str(err))}") \
                from err
        raise
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
