"""Where shared Compare results are kept, for how long and in how much room, so a share link outlives a restart.

A finished run's record and CSV (what its share link `?run=<id>` opens) go in a folder of their own named
by the share id (`run-` and 32 hex digits from `secrets`, readable by the app's user only) under
`runs_dir()`:

- `KVLAB_RUNS_DIR` when set;
- on a Hugging Face Space with persistent storage, whose volume is mounted at `/data` (`SPACE_STORAGE`)
  and can be written: `/data/kvlab/runs`, which survives restarts and rebuilds;
- else `kvlab/runs` in the user's data folder (`$XDG_DATA_HOME`, default `~/.local/share`), which survives
  the app's restarts (on a Space without persistent storage, its disk does not survive a restart).

A result is kept `KVLAB_RUNS_KEEP_DAYS` days (default 7) after it was written; when the kept results take
more than `KVLAB_RUNS_MAX_MB` MiB (default 512), the oldest go first (the newest is always kept). One client
(an address, `kvlab.ui.hosting.turns.client_address`) may keep `KVLAB_RUNS_CLIENT_MB` MiB (default 64): past it
that client's own oldest go first, so one client replaying big records cannot evict every other's results (a
folder names its client by a hash of the address, `owner_tag`, never the address itself). Expired
and evicted folders are removed each time a result is written, and an expired one a link asks for is
removed then. `policy_text` words both limits for the page, where the link is shown and where a link finds
nothing. A share id is checked against its exact form (`kvlab.ui.compare.records.valid_share_id`) before
anything here touches a path. No gradio.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from kvlab.sharing.limits import whole_setting

from ..shared.exports import EXPORT_TOKEN_BYTES

logger = logging.getLogger(__name__)

RUNS_DIR_ENV = "KVLAB_RUNS_DIR"
KEEP_DAYS_ENV = "KVLAB_RUNS_KEEP_DAYS"
DEFAULT_KEEP_DAYS = 7
MAX_MB_ENV = "KVLAB_RUNS_MAX_MB"
DEFAULT_MAX_MB = 512
"""MiB the kept results may take before the oldest go (a record is at most `KVLAB_MAX_RECORD_MB`)."""
CLIENT_MAX_MB_ENV = "KVLAB_RUNS_CLIENT_MB"
DEFAULT_CLIENT_MAX_MB = 64
"""MiB one client's kept results may take before that client's own oldest go (four of the largest records)."""
OWNER_FILE = ".owner"
"""The file in a kept folder that holds its client's `owner_tag` (absent: no client known, such as the CLI's)."""
SPACE_STORAGE = Path("/data")
"""Where a Hugging Face Space's persistent storage is mounted (at run time only, when it is turned on)."""
DAY_S = 24 * 3600
MIB = 1 << 20
_lock = threading.Lock()



def keep_days() -> int:
    """Days a shared result is kept (`KVLAB_RUNS_KEEP_DAYS`, default 7).

    Raises:
        ValueError: the setting is not a whole number >= 1; the message names it and its value.
    """
    return whole_setting(KEEP_DAYS_ENV, DEFAULT_KEEP_DAYS)


def max_bytes() -> int:
    """Bytes the kept results may take (`KVLAB_RUNS_MAX_MB` MiB, default 512).

    Raises:
        ValueError: the setting is not a whole number >= 1; the message names it and its value.
    """
    return whole_setting(MAX_MB_ENV, DEFAULT_MAX_MB) * MIB


def client_max_bytes() -> int:
    """Bytes one client's kept results may take (`KVLAB_RUNS_CLIENT_MB` MiB, default 64).

    Raises:
        ValueError: the setting is not a whole number >= 1; the message names it and its value.
    """
    return whole_setting(CLIENT_MAX_MB_ENV, DEFAULT_CLIENT_MAX_MB) * MIB


def owner_tag(address: str) -> str:
    """What a kept folder stores of its client's address: the first 32 hex digits of its SHA-256."""
    return hashlib.sha256(address.encode("utf-8", "replace")).hexdigest()[:32]


def _owner(folder: Path) -> str | None:
    try:
        return (folder / OWNER_FILE).read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def runs_dir() -> Path:
    """The folder the shared results are kept in (see the module docstring for the order it is chosen in)."""
    chosen = os.environ.get(RUNS_DIR_ENV, "").strip()
    if chosen:
        return Path(chosen)
    if _on_space() and SPACE_STORAGE.is_dir() and os.access(SPACE_STORAGE, os.W_OK):
        return SPACE_STORAGE / "kvlab" / "runs"
    return user_data_dir() / "kvlab" / "runs"


def user_data_dir() -> Path:
    """The user's data folder: `$XDG_DATA_HOME`, else `~/.local/share` (the XDG base directory rule)."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def fallback_runs_dir() -> Path:
    """Where results go when the default folder cannot be written (`KVLAB_RUNS_DIR` unset): a per-user folder
    under the system's temporary folder, which does not outlive the machine."""
    return Path(tempfile.gettempdir()) / f"kvlab-runs-{os.getuid() if hasattr(os, 'getuid') else 0}"


def check_settings() -> None:
    """Check the four settings before the app serves: the numbers, and that a `KVLAB_RUNS_DIR` that is set can
    be created and written.

    Raises:
        ValueError: one line naming the setting, its value and what is wrong.
    """
    keep_days()
    max_bytes()
    client_max_bytes()
    chosen = os.environ.get(RUNS_DIR_ENV, "").strip()
    if chosen:
        try:
            Path(chosen).mkdir(parents=True, exist_ok=True, mode=0o700)
            with tempfile.NamedTemporaryFile(dir=chosen, prefix=".kvlab-write-test-"):
                pass
        except OSError as err:
            raise ValueError(f"{RUNS_DIR_ENV} must be a folder the app can write, got {chosen!r} "
                             f"({err.strerror or err})") from None


def policy_text() -> str:
    """The keeping rule in words, for the page: 'kept on this server for 7 days; past 512 MiB of kept runs,
    the oldest go first'."""
    days = keep_days()
    return (f"kept on this server for {days} day{'s' if days != 1 else ''}; past {max_bytes() // MIB:,} MiB of "
            "kept runs, the oldest go first")


def new_run_folder(prefix: str, owner: str | None = None) -> Path:
    """A new folder `<prefix><token>` under `runs_dir()` (the token: EXPORT_TOKEN_BYTES from `secrets` in hex;
    readable by this user only); the fallback folder, said in the log, when the default cannot be written.
    `owner`: the address of the client it is kept for (only its `owner_tag` is written, in OWNER_FILE).

    Raises:
        OSError: `KVLAB_RUNS_DIR` is set and the folder cannot be made there.
    """
    root = runs_dir()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        if os.environ.get(RUNS_DIR_ENV, "").strip():
            raise
        logger.warning("cannot keep shared runs in %s (%s); using %s, which does not outlive the machine",
                       root, err.strerror or err, fallback_runs_dir())
        root = fallback_runs_dir()
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = root / f"{prefix}{secrets.token_hex(EXPORT_TOKEN_BYTES)}"
    folder.mkdir(mode=0o700)
    if owner:
        try:
            (folder / OWNER_FILE).write_text(owner_tag(owner), encoding="ascii")
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    return folder


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _expired(folder: Path, now: float) -> bool:
    return now - folder.stat().st_mtime > keep_days() * DAY_S


def prune(prefix: str, keep: Path | None = None, now: float | None = None) -> list[str]:
    """Remove the kept `<prefix>` folders that expired, then the oldest of `keep`'s client's while they take more
    than `client_max_bytes()`, then the oldest others while all of them take more than `max_bytes()`; `keep`
    (the result just written) is never removed. A folder that vanishes meanwhile (another app pruning the same
    folder) is skipped. Returns the names removed."""
    now = time.time() if now is None else now
    removed = []
    with _lock:
        roots = {runs_dir(), keep.parent if keep is not None else runs_dir()}
        folders = [f for root in roots if root.is_dir() for f in root.iterdir()
                   if f.is_dir() and f.name.startswith(prefix)]
        alive = []
        for folder in folders:
            try:  # another app on the same folder may remove one meanwhile: it is simply gone
                if folder != keep and _expired(folder, now):
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder.name)
                else:
                    alive.append((folder.stat().st_mtime, folder, _size(folder)))
            except FileNotFoundError:
                continue
        alive.sort(key=lambda item: item[0])
        owner = _owner(keep) if keep is not None else None
        if owner is not None:
            alive = _prune_client(alive, owner, keep, removed)
        total = sum(size for _, _, size in alive)
        for _, folder, size in alive:
            if total <= max_bytes():
                break
            if folder != keep:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
                total -= size
    if removed:
        logger.info("removed %d kept run(s) past the keeping rule (%s)", len(removed), policy_text())
    return removed


def _prune_client(alive: list, owner: str, keep: Path, removed: list[str]) -> list:
    """`alive` (oldest first) less `owner`'s oldest folders while its folders take more than `client_max_bytes()`
    (never `keep`); the names removed are added to `removed`."""
    mine = sum(size for _, folder, size in alive if _owner(folder) == owner)
    left = []
    for item in alive:
        _, folder, size = item
        if mine > client_max_bytes() and folder != keep and _owner(folder) == owner:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
            mine -= size
        else:
            left.append(item)
    return left


def kept_folder(run_id: str, now: float | None = None) -> Path | None:
    """The kept folder named `run_id` (a share id its caller has already checked), or None when there is none
    or it expired (then it is removed)."""
    now = time.time() if now is None else now
    for root in (runs_dir(), fallback_runs_dir()):
        folder = root / run_id
        if not folder.is_dir():
            continue
        if _expired(folder, now):
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return folder
    return None
