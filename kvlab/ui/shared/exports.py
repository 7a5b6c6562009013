"""Where the page's downloadable files go: one fresh folder per export under `EXPORTS_DIR`, kept a day.

Every tab's PNG, report and needle exports live here; a Compare result's record and CSV (its share link) are
kept longer, where a restart finds them (`kvlab.ui.compare.kept_runs`), in folders named the same way. Each
folder is `<prefix><token>`, the token EXPORT_TOKEN_BYTES random bytes from `secrets` in hex (`export_id`),
so a folder, and the share id that names a Compare result's folder, cannot be guessed; folders are made
readable by this user only. Gradio never serves this folder: it serves its own copies of the files a component shows, under its
cache folder, by a hash of their content (`gradio_api/file=`), and lists no folder. No gradio.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

EXPORTS_DIR = Path(tempfile.gettempdir()) / "kvlab-exports"
EXPORTS_KEEP_S = 24 * 3600
"""Exported files (PNG, report, needle) stay this long on the server (seconds)."""
EXPORT_TOKEN_BYTES = 16
"""Random bytes in an export folder's name (128 bits, written as 32 hex digits)."""
_TOKEN = f"[0-9a-f]{{{2 * EXPORT_TOKEN_BYTES}}}"


def export_id_pattern(prefix: str) -> re.Pattern:
    """The exact form of a folder name `fresh_export_folder(prefix)` makes: `prefix` and 32 hex digits."""
    return re.compile(re.escape(prefix) + _TOKEN)


def fresh_export_folder(prefix: str) -> Path:
    """A new folder `<prefix><token>` under EXPORTS_DIR (the token: EXPORT_TOKEN_BYTES from `secrets`, in
    hex; the folder readable by this user only), after removing folders older than EXPORTS_KEEP_S."""
    EXPORTS_DIR.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - EXPORTS_KEEP_S
    for old in EXPORTS_DIR.iterdir():
        if old.is_dir() and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)
    folder = EXPORTS_DIR / f"{prefix}{secrets.token_hex(EXPORT_TOKEN_BYTES)}"
    folder.mkdir(mode=0o700)
    return folder


def offered_copies(paths: list[str]) -> list[str]:
    """Copies of kept files (`kvlab.ui.compare.kept_runs`: a folder gradio will not take, e.g. ~/.local/share or a
    Space's /data) in a fresh folder under EXPORTS_DIR, the system's temporary folder, from which gradio copies
    what a component offers into its cache; the kept files stay where they are, and their folder stays the share
    id. Paths already under the temporary folder are returned as they are."""
    temporary = Path(tempfile.gettempdir()).resolve()
    if all(Path(path).resolve().is_relative_to(temporary) for path in paths):
        return list(paths)
    folder = fresh_export_folder("offer-")
    return [str(shutil.copy2(path, folder / Path(path).name)) for path in paths]
