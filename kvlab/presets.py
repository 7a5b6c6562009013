"""Preset files: where the short YAML files describing a run live, how one is read, and what every wing's
preset shares (`ModelSection`, `PresetError`).

Each wing owns its preset kind's schema: Compare's (`kvlab.compare.preset`: model, prompt, generation settings,
mode and columns) and the Needle's (`kvlab.needle.preset`). This module finds and reads the files; it validates
no run and imports no wing.

The preset folder is `KVLAB_PRESETS_DIR` when set, else the repository's
`presets/` beside the package (a source checkout or an editable install), else
the copy a regular install puts under `<sys.prefix>/share/kvlab/presets`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

PRESETS_DIR_ENV = "KVLAB_PRESETS_DIR"
SOURCE_ROOT = Path(__file__).resolve().parent.parent
INSTALLED_PRESETS_SUBDIR = Path("share") / "kvlab" / "presets"


def presets_dir() -> Path:
    """The folder holding the preset files, looked up in this order:

    1. `KVLAB_PRESETS_DIR`, when set and not empty;
    2. `presets/` beside the package, when the package sits in a source checkout
       (its parent folder holds `pyproject.toml`), as with an editable install;
    3. `<sys.prefix>/share/kvlab/presets`, where a regular install puts them.

    The third is returned even when it does not exist (`list_presets()` is then empty).
    """
    override = os.environ.get(PRESETS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    source = SOURCE_ROOT / "presets"
    if (SOURCE_ROOT / "pyproject.toml").is_file() and source.is_dir():
        return source
    return Path(sys.prefix) / INSTALLED_PRESETS_SUBDIR


# The folder as found at import, for the UI; the functions below look it up on every call.
PRESETS_DIR = presets_dir()


class PresetError(ValueError):
    """A preset file is missing, not YAML, or fails the schema; the message says which field and why."""


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = "bundled"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"


def read_preset_yaml(path: str | Path) -> tuple[Path, object]:
    """(the file, its parsed YAML) for a preset path or a name like `quickstart` (looked up in `presets_dir()`).

    Raises:
        PresetError: no such file, or not valid YAML.
    """
    path = Path(path)
    named = presets_dir() / f"{path}.yaml"
    if not path.exists() and named.exists():
        path = named
    if not path.is_file():
        raise PresetError(f"preset file not found: {path}")
    try:
        return path, yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise PresetError(f"{path.name}: not valid YAML: {err}") from None
