"""Where the page's downloadable files go: one fresh folder per export under `EXPORTS_DIR`, kept a day.

Compare's record and CSV (and so its share links) and every tab's PNG exports live here; gradio serves its own
copies of the files. No gradio.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

EXPORTS_DIR = Path(tempfile.gettempdir()) / "kvlab-exports"
EXPORTS_KEEP_S = 24 * 3600
"""Exported files of a run (and so its share link) stay this long on the server (seconds)."""


def fresh_export_folder(prefix: str) -> Path:
    """A new folder `<prefix><random>` under EXPORTS_DIR, after removing folders older than EXPORTS_KEEP_S."""
    EXPORTS_DIR.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - EXPORTS_KEEP_S
    for old in EXPORTS_DIR.iterdir():
        if old.is_dir() and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=EXPORTS_DIR))
