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

A conversion is written into a locked staging folder and renamed into place when
complete (`kvlab.models.atomic`); a reader only takes a folder holding its `ready`
marker, so a conversion killed at any instant (SIGTERM, SIGKILL, a full disk) is
never read, and the next load of a GGUF model removes the staging folders whose
writer is gone (`remove_stale_conversions`). A folder that cannot be written,
read-only or without room for the converted copy (checked before the slow part),
is one line naming it and `KVLAB_CACHE_DIR`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .atomic import remove_stale_staging, staging_folder
from .sources import safe_line

CONVERTED_FORMAT_VERSION = "1"
FALLBACK_CACHE_PREFIX = "kvlab-cache"
GGUF_MAGIC = b"GGUF"
HASH_CHUNK_BYTES = 1 << 20
HASH_PREFIX_CHARS = 16
"""Hex characters of a file's sha256 that name its converted folder."""
CONVERTED_EXTRA_BYTES = 16 << 20
"""Room a converted copy needs beyond its float32 tensors (tokenizer, configs), bytes."""
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
FULL_DISK_TEXT = {"No space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC,
                  "Disk quota exceeded": errno.EDQUOT, "Read-only file system": errno.EROFS}
"""How a full or read-only disk shows in errors that carry no errno (safetensors' SafetensorError)."""
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


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.0f} MiB"


def write_problem(folder: Path, needed_bytes: int = 0) -> str | None:
    """Why `folder` cannot be created and written (the OS error text), or hold `needed_bytes` more (free and
    needed space, MiB), or None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kvlab-write-test-"):
            pass
        free = shutil.disk_usage(folder).free
    except OSError as err:
        return err.strerror or str(err)
    if free < needed_bytes:
        return f"{os.strerror(errno.ENOSPC)}: {_mib(free)} free, about {_mib(needed_bytes)} needed"
    return None


def refusal(folder: Path, problem: str) -> ModelLoadError:
    """The one-line error for a cache folder that cannot take a converted model."""
    return ModelLoadError(f"cannot write the model cache folder {folder} ({problem}); set KVLAB_CACHE_DIR to a "
                          "writable folder")


def disk_full_reason(err: BaseException) -> str | None:
    """The reason text when `err` says the disk is full, over quota or read-only, else None."""
    if isinstance(err, OSError) and err.errno in FULL_DISK_ERRNOS:
        return err.strerror or os.strerror(err.errno)
    text = str(err)
    return next((os.strerror(code) for marker, code in FULL_DISK_TEXT.items() if marker in text), None)


def writable_cache_dir(notify: ProgressFn, needed_bytes: int = 0) -> Path:
    """The folder a converted model (`needed_bytes` of it) can be written to: `cache_dir()` when it can be
    written and has the room; when not and `KVLAB_CACHE_DIR` is unset, `fallback_cache_dir()`, said through
    `notify` in one line.

    Raises:
        ModelLoadError: `KVLAB_CACHE_DIR` is set to a folder that cannot be written (read-only, full, not a
            folder), or neither folder can; the message names the folder, the reason and the setting that fixes it.
    """
    preferred = cache_dir()
    problem = write_problem(preferred, needed_bytes)
    if problem is None:
        return preferred
    if os.environ.get("KVLAB_CACHE_DIR"):
        raise refusal(preferred, problem)
    fallback = fallback_cache_dir()
    fallback_problem = write_problem(fallback, needed_bytes)
    if fallback_problem is not None:
        raise ModelLoadError(f"cannot write the model cache folder {preferred} ({problem}) nor {fallback} "
                             f"({fallback_problem}); set KVLAB_CACHE_DIR to a writable folder")
    notify(0.02, f"{preferred} cannot be written ({problem}): converting into {fallback} instead; set "
                 "KVLAB_CACHE_DIR to keep converted models elsewhere")
    return fallback


def remove_stale_conversions() -> list[Path]:
    """Remove what killed conversions left in the cache folder and its fallback: staging folders under `models/`
    and `gguf/` whose writer is gone (`kvlab.models.atomic.remove_stale_staging`); a live writer's are kept, and
    a folder that cannot be read or written is left as it is. Returns what was removed."""
    removed = []
    for root in (cache_dir(), fallback_cache_dir()):
        for part in ("models", "gguf"):
            removed += remove_stale_staging(root / part)
    return removed


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


def converted_bytes(path: Path) -> int:
    """About how many bytes the float32 copy of GGUF file `path` takes on disk (0 when it cannot be read)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        return sum(int(tensor.n_elements) for tensor in reader.tensors) * 4 + CONVERTED_EXTRA_BYTES
    except Exception:  # noqa: BLE001 - check_gguf says what is wrong with a damaged file; no estimate then
        return 0


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


def _write_converted(gguf_path: Path, staging: Path, display_name: str, notify: ProgressFn, expected_s: float) -> None:
    """De-quantize `gguf_path` and save the float32 copy (config, generation config, weights, tokenizer and the
    `ready` marker last) into `staging`."""
    from safetensors.torch import save_model
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, name = gguf_path.parent, gguf_path.name
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


def convert_gguf(gguf_path: Path, folder_name: str, display_name: str, notify: ProgressFn,
                 expected_s: float = 60.0) -> Path:
    """De-quantize `gguf_path` into `models/<folder_name>` of the cache folder, once; returns the folder.

    The GGUF flag is dropped from the config (transformers refuses to `save_pretrained` a GGUF-flagged
    model); weights are written with safetensors' shared-tensor-aware `save_model` (tied embeddings are
    kept once). The folder is written under a locked temporary name, fsynced and renamed when complete
    (`kvlab.models.atomic`), so an interrupted conversion leaves nothing that looks finished (callers remove
    what killed ones left: `remove_stale_conversions`). Whether the folder has room for the copy is checked before
    the slow part.

    Raises:
        ModelLoadError: no cache folder can be written (read-only, or too full for the copy: one line naming
            the folder and KVLAB_CACHE_DIR), or transformers cannot read the file.
    """
    cache = writable_cache_dir(notify, converted_bytes(gguf_path))
    root, target = cache / "models", cache / "models" / folder_name
    try:
        staging = staging_folder(root, folder_name)
    except OSError as err:
        raise refusal(cache, err.strerror or str(err)) from err
    try:
        _write_converted(gguf_path, staging.path, display_name, notify, expected_s)
        return staging.publish(target)
    except BaseException as err:  # also Ctrl-C and SIGTERM's SystemExit: no half-written folder is left behind
        staging.discard()
        full = disk_full_reason(err)
        if full is not None:
            raise refusal(cache, full) from err
        if isinstance(err, OSError) and converted_folder(folder_name) == target:
            return target  # another process published the same conversion first
        if isinstance(err, (OSError, ValueError, KeyError, RuntimeError)):
            raise ModelLoadError(f"could not convert {gguf_path.name}: {type(err).__name__}: "
                                 f"{safe_line(str(err))}") from err
        raise
