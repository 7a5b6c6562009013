"""Which model sources this server accepts, decided from the text alone, and error lines that leak nothing.

- Public mode (`public_mode`): on when the app runs on a Hugging Face Space (`SPACE_ID` set) or with
  `KVLAB_PUBLIC=1`; `KVLAB_PUBLIC=0` turns it off. In public mode local files and folders are off unless
  `KVLAB_ALLOW_LOCAL=1` turns them on (`allow_local_folders`), and model-load messages are stripped of server
  paths (`safe_line`).
- With local sources off, a source is a bundled model or a well-formed hub id (`is_hub_id`: `owner/name` in
  the hub's characters); anything else (a path, `file://`, `~`, `..`, a backslash, a `.gguf` name, a bare
  name) gets one refusal line (`local_refusal`), the same for every refused source and decided before
  anything touches the file system, so a reply says nothing about the server's files.
- A file uploaded to the app (gradio's upload folder, `upload_folder`) is never a model source, whatever the
  settings (`in_upload_folder`).
- A hub model's weights, loaded, may take at most `max_model_mb` MiB (`KVLAB_MAX_MODEL_MB`; on by default on a
  public server, where one visitor typing a 70B id would otherwise download it and take the machine's memory);
  `hub_size.check_hub_size` reads the size from the hub before anything is downloaded.
- `safe_line` reduces an error text (transformers', huggingface_hub's, the OS's) to one short line with
  absolute paths, home paths and `file://` addresses replaced by `<path>`.

This module decides and words; it reads, loads and downloads nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

PUBLIC_ENV = "KVLAB_PUBLIC"
ALLOW_LOCAL_ENV = "KVLAB_ALLOW_LOCAL"
ALLOW_HUB_ENV = "KVLAB_ALLOW_HUB"
MAX_MODEL_MB_ENV = "KVLAB_MAX_MODEL_MB"
PUBLIC_MAX_MODEL_MB = 4096
"""`KVLAB_MAX_MODEL_MB`'s default on a public server: about a 1B-parameter model in float32."""
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
HUB_ID_MAX_CHARS = 96
"""The hub's longest repository id (huggingface_hub's `validate_repo_id`)."""
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
HUB_ID = re.compile(rf"{_HUB_PART}/{_HUB_PART}")
"""`owner/name` in the hub's characters (ASCII letters, digits, `_`, `-`, `.`; no `-` or `.` at either end)."""
SAFE_LINE_CHARS = 300
"""Longest error line `safe_line` hands on, characters."""
PATH_MARK = "<path>"
_PATH_CHARS = r"[^\s'\"`<>|,;()\[\]{}]"
_PATHS = re.compile(
    rf"file:/{_PATH_CHARS}*"                           # file:// addresses
    rf"|(?<![\w.:/~-])~[\w.-]*/{_PATH_CHARS}*"          # ~/x, ~user/x
    rf"|(?<![\w.:/~-])/{_PATH_CHARS}+"                  # /absolute/path (not the slashes of a URL or owner/name)
    rf"|\b[A-Za-z]:\\{_PATH_CHARS}*"                    # C:\windows\path
    rf"|\\\\{_PATH_CHARS}+",                            # \\share\path
    re.IGNORECASE)


def _switch(name: str, default: bool, unknown: bool) -> bool:
    """An on/off environment setting: 1/true/yes/on or 0/false/no/off; `default` when unset or empty,
    `unknown` (the safe side) for any other text."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    return unknown


def public_mode() -> bool:
    """Whether this server is public: `KVLAB_PUBLIC` when set (any value but 0/false/no/off counts as on), else
    on exactly on a Hugging Face Space (`SPACE_ID` set)."""
    return _switch(PUBLIC_ENV, bool(os.environ.get("SPACE_ID")), unknown=True)


def allow_local_folders() -> bool:
    """Whether local model folders and `.gguf` files may be loaded: `KVLAB_ALLOW_LOCAL` when set (a value that
    is not 1/true/yes/on or 0/false/no/off counts as off), else on exactly when the server is not public."""
    return _switch(ALLOW_LOCAL_ENV, not public_mode(), unknown=False)


def allow_hub() -> bool:
    """Whether hub ids may be loaded: off only with `KVLAB_ALLOW_HUB=0` (or false/no/off)."""
    return _switch(ALLOW_HUB_ENV, True, unknown=True)


def max_model_mb() -> int:
    """MiB a hub model's weights may take once loaded (`KVLAB_MAX_MODEL_MB`; 0 = no cap): by default
    PUBLIC_MAX_MODEL_MB on a public server, else 0.

    Raises:
        ValueError: the setting is not a whole number >= 0; the message names it and its value.
    """
    text = os.environ.get(MAX_MODEL_MB_ENV, "").strip()
    if not text:
        return PUBLIC_MAX_MODEL_MB if public_mode() else 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{MAX_MODEL_MB_ENV} must be a whole number >= 0 (0 = no cap), got {text!r}")
    return value


def too_big(source: str, need_bytes: int | None, cap_mb: int) -> str:
    """The one line refusing hub model `source` whose loaded weights take `need_bytes` (None: the hub does not
    say) against a cap of `cap_mb` MiB."""
    size = "its size is not on the hub" if need_bytes is None else f"its weights take {need_bytes / 2**20:,.0f} MiB"
    return (f"{source!r} is too big for this server: {size}, and a hub model may take at most {cap_mb:,} MiB here "
            f"({MAX_MODEL_MB_ENV})")


def is_hub_id(text: str) -> bool:
    """Whether `text` is a well-formed hub id `owner/name`: the hub's characters, at most `HUB_ID_MAX_CHARS`,
    no `--` or `..`, not ending in `.git` or `.gguf`. Decided from the text alone."""
    return (isinstance(text, str) and len(text) <= HUB_ID_MAX_CHARS and HUB_ID.fullmatch(text) is not None
            and "--" not in text and ".." not in text and not text.lower().endswith((".git", ".gguf")))


def local_refusal(bundled: Iterable[str]) -> str:
    """The one line every source refused while local sources are off gets (it names no path and echoes
    nothing), given the bundled models' keys."""
    return (f"only a bundled model ({', '.join(bundled)}) or a Hugging Face hub id (owner/name) can be used "
            f"here: local files and folders are off ({ALLOW_LOCAL_ENV}=0)")


def hub_not_found(source: str) -> str:
    """The line for a hub id the hub cannot provide; also given for an id that names a folder on this server
    while local sources are off (transformers would read that folder), so the two cannot be told apart."""
    return (f"could not load {source!r}: not found in the local Hugging Face cache and the hub could not "
            "provide it (no network, or no such model)")


UPLOAD_REFUSAL = "a file uploaded to this app cannot be used as a model: give a bundled model or a hub id"


def upload_folder() -> Path:
    """Where gradio keeps visitors' uploads: `GRADIO_TEMP_DIR`, else `gradio` in the system's temporary folder
    (the rule of gradio's `utils.get_upload_folder`, read here without importing gradio)."""
    return Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")


def in_upload_folder(source: str) -> bool:
    """Whether the path `source` names lies in gradio's upload folder (symbolic links followed)."""
    try:
        target = os.path.realpath(os.path.expanduser(source.strip()))
        folder = os.path.realpath(upload_folder())
    except (OSError, ValueError):
        return False
    return target == folder or target.startswith(folder.rstrip(os.sep) + os.sep)


def safe_line(text: str, limit: int = SAFE_LINE_CHARS) -> str:
    """The first non-empty line of `text` with absolute and home paths and `file:` addresses replaced by
    `<path>`, cut to `limit` characters (an ellipsis marks the cut)."""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    line = _PATHS.sub(PATH_MARK, line)
    return line if len(line) <= limit else line[:limit - 1] + "…"
