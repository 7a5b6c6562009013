"""Files and folders written whole: a later reader (this process, another one, the next start) sees the old
version or the new one, never a part.

- `write_atomic(path, data)` writes to a temporary name in the same folder (`.<name>.tmp-<random>`), flushes
  and fsyncs it, renames it over `path` with `os.replace` (one step on POSIX) and fsyncs the folder, so a
  crash, SIGKILL or power cut leaves either no `path`, the old one or the complete new one.
- `staging_folder(parent, name)` makes a folder `<name>.tmp-<random>` under `parent` for a many-file result
  (a converted model) and holds an exclusive lock on its `.lock` file while the writer lives;
  `publish_folder` fsyncs every file in it and renames it to its final name.
- `remove_stale_staging(parent)` deletes the staging folders under `parent` whose writer is gone (its lock
  is free: the kernel drops a lock when its process ends, SIGKILL included), and `remove_stale_temps(path)`
  the temporaries `write_atomic` left beside `path`.

Readers therefore only ever look for final names; what a killed writer leaves behind is a temporary name
nothing reads, removed by the next sweep. This module writes and sweeps; what the files hold is the caller's.
Locks are `fcntl.flock` (POSIX); where `fcntl` is missing a staging folder is never treated as stale.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, no sweeping of other writers' folders
    fcntl = None

TEMP_MARK = ".tmp-"
"""What a temporary name carries: `.<name>.tmp-<random>` for a file, `<name>.tmp-<random>` for a folder."""
STAGING_NAME = re.compile(r".+\.tmp(-[A-Za-z0-9_]+|\d+)")
"""A staging folder's name: `<name>.tmp-<random>`, or `<name>.tmp<pid>` as earlier versions named them."""
LOCK_NAME = ".lock"
"""The file inside a staging folder whose lock its writer holds."""
NEW_FILE_MODE = 0o644
"""The mode of a file `write_atomic` creates (an existing file's mode is kept)."""
UNLOCKED_GRACE_S = 60.0
"""A staging folder without its lock file is another writer's for this long after it was made (the instant
between making the folder and locking it); older, it is stale (seconds)."""


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable (fsync on the folder itself; a no-op where folders
    cannot be opened, e.g. on Windows)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` whole: temporary name in the same folder, fsync, `os.replace`.

    A new file gets NEW_FILE_MODE, an existing one keeps its mode. Returns the path. Raises OSError (the folder cannot be written, the disk is full...); the temporary file is
    removed then and `path` is as it was.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mode = NEW_FILE_MODE
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TEMP_MARK}")
    try:
        os.chmod(temporary, mode)
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return path


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Delete the temporaries `write_atomic` left beside `path` (a writer killed between writing and
    renaming); returns what was removed. Call it where only one writer of `path` can be alive (a process's
    start)."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f".{path.name}{TEMP_MARK}*"))
    except OSError:
        return removed
    for stale in candidates:
        try:
            stale.unlink()
            removed.append(stale)
        except OSError:
            pass
    return removed


class StagingFolder:
    """A folder `<name>.tmp-<random>` under `parent`, locked by this writer until `publish` or `discard`."""

    def __init__(self, parent: Path, name: str):
        parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=f"{name}{TEMP_MARK}", dir=parent))
        self._lock = os.open(self.path / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        if fcntl is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX)

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def publish(self, target: Path) -> Path:
        """fsync every file in the folder, then rename it to `target` (an older `target` is removed first);
        returns `target`. Raises OSError."""
        (self.path / LOCK_NAME).unlink(missing_ok=True)
        for file in self.path.rglob("*"):
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_folder(self.path)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(self.path, target)
        fsync_folder(target.parent)
        self._release()
        return target

    def discard(self) -> None:
        """Remove the folder and what is in it (after a failure)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._release()


def staging_folder(parent: Path, name: str) -> StagingFolder:
    """A new locked staging folder for the many-file result `name` under `parent` (see `StagingFolder`).

    Raises OSError: `parent` cannot be written."""
    return StagingFolder(parent, name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


def _writer_gone(folder: Path) -> bool:
    """Whether the staging `folder`'s writer is gone: its lock can be taken; without a lock file, a folder named
    `<name>.tmp<pid>` whose process has ended (or that is this process's pid), or any other older than
    UNLOCKED_GRACE_S."""
    try:
        handle = os.open(folder / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        suffix = folder.name.rpartition(".tmp")[2]
        if suffix.isdigit():  # earlier versions' name: this process never writes one (in a container it may
            return int(suffix) == os.getpid() or not _pid_alive(int(suffix))  # have the killed one's pid)
        try:
            return time.time() - folder.stat().st_mtime > UNLOCKED_GRACE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        if fcntl is None:
            return False
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(handle)


def remove_stale_staging(parent: Path) -> list[Path]:
    """Delete the staging folders (`STAGING_NAME`) under `parent` whose writer is gone (killed mid-write: SIGKILL,
    a crash, a power cut); a live writer's folder is left alone. Returns what was removed; a `parent` that
    does not exist or cannot be read removes nothing."""
    removed = []
    try:
        candidates = [entry for entry in parent.iterdir() if STAGING_NAME.fullmatch(entry.name) and entry.is_dir()]
    except OSError:
        return removed
    for folder in candidates:
        if _writer_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
