"""The schema of needle presets (`presets/needle_*.yaml`): a model, a grid and the columns.

A needle preset carries `task: needle`, which keeps it out of Compare's preset list
(`kvlab.compare.preset.list_presets` lists comparison presets only). Columns are checked as Compare's are (`kvlab.compare.preset.Preset`): each needs a
`strategy:` and valid knobs. The grid's values are checked against the model when a run starts
(`kvlab.needle.grid.parse_grid`). This module validates; it does not run anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..columns import MAX_COLUMNS, Column
from ..presets import ModelSection, PresetError, presets_dir, read_preset_yaml
from ..strategies import STRATEGIES, StrategyError
from .grid import DEFAULT_DEPTHS, DEFAULT_NEW_TOKENS, MAX_NEW_TOKENS

TASK = "needle"


class GridSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lengths: list[int | str] = Field(min_length=1)
    depths: list[float] = Field(default=list(DEFAULT_DEPTHS), min_length=1)
    seeds: list[int] = Field(default=[0], min_length=1)
    new_tokens: int = Field(default=DEFAULT_NEW_TOKENS, ge=1, le=MAX_NEW_TOKENS)


class NeedlePreset(BaseModel):
    """`task: needle`, name, description, model, grid (lengths such as 512 or `1k`, depths, seeds, new_tokens)
    and columns (as in a comparison preset)."""

    model_config = ConfigDict(extra="forbid")
    task: Literal["needle"]
    name: str
    description: str = ""
    model: ModelSection = ModelSection()
    grid: GridSection
    columns: list[dict] = Field(min_length=1, max_length=MAX_COLUMNS)

    @field_validator("columns")
    @classmethod
    def _columns_valid(cls, columns: list[dict]) -> list[dict]:
        for i, spec in enumerate(columns):
            if not isinstance(spec, dict) or "strategy" not in spec:
                raise ValueError(f"column {i + 1} needs a `strategy:` (one of {', '.join(STRATEGIES)})")
            try:
                Column.from_spec(spec)
            except (StrategyError, ValueError) as err:
                raise ValueError(f"column {i + 1}: {err}") from err
        return columns


def load_needle_preset(path: str | Path) -> NeedlePreset:
    """Read and validate a needle preset (a name like `needle_passkey` looks in `presets_dir()`).

    Raises:
        PresetError: missing file, not YAML, or a field that fails the schema (the message names it).
    """
    path, data = read_preset_yaml(path)
    try:
        return NeedlePreset.model_validate(data)
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in item['loc']) or '(top level)'}: "
                    f"{item['msg'].removeprefix('Value error, ')}" for item in err.errors()]
        raise PresetError(f"{path.name}: " + "; ".join(problems)) from None


def list_needle_presets() -> dict[str, Path]:
    """Preset name -> path for every `*.yaml` in `presets_dir()` whose mapping says `task: needle`."""
    found = {}
    for path in sorted(presets_dir().glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and data.get("task") == TASK:
            found[path.stem] = path
    return found
