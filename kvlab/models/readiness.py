"""Tell a watching process when a model finished loading, through a file named by an environment variable.

A process that launches kvlab (the benchmark's start-up section launches `python
app.py`) sets `KVLAB_READY_FILE` to a path; `announce()` then adds one JSON
line per finished load to that file:
`{"state": "ready" | "error", "name": ..., "load_s": ..., "message": ..., "time": ...}`
(`load_s` in seconds, `time` in seconds since the epoch, `time.time()`). The
watcher reads it back with `read_announcements()`. Without the variable nothing
is written.

The file holds this process's lines only and is replaced whole at each write
(`kvlab.models.atomic.write_atomic`), so a watcher never reads a torn line and a
start killed mid-write leaves the previous version. `reset()` (called by `python
app.py` before its model starts loading) empties it and removes temporaries a
killed start left, so lines from an earlier start never make a new one look
ready. A failed write never reaches the caller: it is logged once per
process. This module writes and reads the file; it does not load models or
import gradio, and it does not replace the log lines kept for humans.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from .atomic import remove_stale_temps, write_atomic

READY_FILE_ENV = "KVLAB_READY_FILE"
READY = "ready"
ERROR = "error"
STATES = (READY, ERROR)

logger = logging.getLogger(__name__)
_write_failed = threading.Event()
_write_lock = threading.Lock()
_lines: dict[Path, list[str]] = {}
"""The lines this process announced, per ready file: each write puts exactly these in the file."""


def ready_file() -> Path | None:
    """The file named by `KVLAB_READY_FILE`, or None when it is unset or empty."""
    value = os.environ.get(READY_FILE_ENV, "")
    return Path(value) if value else None


def announce(state: str, name: str = "", load_s: float | None = None, message: str = "") -> bool:
    """Add one JSON line about a finished load to the ready file, if one is named (the file is rewritten whole
    with this process's lines).

    Args:
        state: `"ready"` (the model loaded) or `"error"` (it could not load).
        name: the model's name (or the source that failed).
        load_s: seconds the load took, when known.
        message: what went wrong, for `"error"`.

    Returns True when a line was written; False when no file is named or the write
    failed (the first failure in this process is logged as a warning).

    Raises:
        ValueError: `state` is not one of `STATES` (a programming error, not an I/O one).
    """
    if state not in STATES:
        raise ValueError(f"state must be one of {list(STATES)}, got {state!r}")
    path = ready_file()
    if path is None:
        return False
    line = json.dumps({"state": state, "name": name, "load_s": load_s, "message": message, "time": time.time()})
    with _write_lock:
        lines = _lines.setdefault(path, [])
        lines.append(line + "\n")
        return _write(path, "".join(lines))


def _write(path: Path, text: str) -> bool:
    try:
        write_atomic(path, text)
    except (OSError, ValueError) as err:
        if not _write_failed.is_set():
            _write_failed.set()
            logger.warning("could not write the ready file %s (named by %s): %s", path, READY_FILE_ENV, err)
        return False
    return True


def reset() -> bool:
    """At a start: empty the ready file, if one is named, and remove the temporaries a killed start left beside
    it, so an earlier start's lines do not make this one look ready. Returns True when the file was emptied;
    False when none is named or the write failed (logged as in `announce`)."""
    path = ready_file()
    if path is None:
        return False
    with _write_lock:
        remove_stale_temps(path)
        _lines[path] = []
        return _write(path, "")


def read_announcements(path: str | Path) -> list[dict]:
    """The complete lines `announce()` wrote to `path`, oldest first.

    A line still being written (no newline yet) and lines that are not JSON
    objects are skipped; a missing file gives an empty list. A watcher that
    reuses a ready file also skips lines whose `time` is before it launched the
    app: the app empties the file only once its interpreter has started (`reset`).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("state") in STATES:
            records.append(record)
    return records
