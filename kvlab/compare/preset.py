"""Compare's presets: short YAML files describing one comparison, validated by one schema.

A preset names the model, the prompt, the generation settings, the mode and the
columns (each `strategy:` plus its knobs, and optionally per-column
`generation:` overrides and a cache budget: `budget_mib:` and `fallback:`, see
`kvlab.budget`). Validation errors name the field and the allowed
values. This module parses, validates and lists Compare's presets (the files are found and read by
`kvlab.presets`); running them is `kvlab.compare.runner`'s job.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ..columns import MAX_COLUMNS, Column
from ..generation import GenerationSettings, check_prompt
from ..presets import ModelSection, PresetError, presets_dir, read_preset_yaml
from ..strategies import STRATEGIES, StrategyError
from .columns import MODES

__all__ = ["Preset", "PresetError", "PromptSpec", "list_presets", "load_preset", "parse_preset"]


class PromptSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1)
    system: str = ""
    chat: bool = True


class Preset(BaseModel):
    """The schema of `presets/*.yaml`."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    model: ModelSection = ModelSection()
    prompt: PromptSpec
    generation: GenerationSettings = GenerationSettings()
    mode: Literal[MODES] = "fair"  # type: ignore[valid-type]
    baseline: int | None = None
    columns: list[dict] = Field(min_length=1, max_length=MAX_COLUMNS)

    @field_validator("generation")
    @classmethod
    def _generation_valid(cls, settings: GenerationSettings) -> GenerationSettings:
        settings.check()
        return settings

    @field_validator("columns")
    @classmethod
    def _columns_valid(cls, columns: list[dict], info: ValidationInfo) -> list[dict]:
        if (info.context or {}).get("lenient_columns"):
            return columns
        for i, spec in enumerate(columns):
            if not isinstance(spec, dict) or "strategy" not in spec:
                raise ValueError(f"column {i + 1} needs a `strategy:` (one of {', '.join(STRATEGIES)})")
            overrides = spec.get("generation") or {}
            try:
                Column.from_spec(spec)
                GenerationSettings().with_overrides(overrides)
            except (StrategyError, ValueError) as err:
                raise ValueError(f"column {i + 1}: {err}") from err
        return columns

    @model_validator(mode="after")
    def _baseline_in_range(self):
        if self.baseline is not None and not 0 <= self.baseline < len(self.columns):
            raise ValueError(f"baseline must be a column index 0..{len(self.columns) - 1}, got {self.baseline}")
        return self

    def settings(self) -> GenerationSettings:
        return dataclasses.replace(self.generation)

    def build_columns(self) -> list[Column]:
        return [Column.from_spec(spec) for spec in self.columns]


def parse_preset(data: dict, source: str = "preset", lenient_columns: bool = False) -> Preset:
    """Validate a preset mapping. Raises PresetError naming the field and the problem.

    lenient_columns: accept columns whose knobs are invalid (the caller reports each in its own row, see
    `kvlab.columns.Column.or_rejected`); the rest is checked as usual.
    """
    if not isinstance(data, dict):
        raise PresetError(f"{source}: expected a YAML mapping at the top level")
    try:
        return Preset.model_validate(data, context={"lenient_columns": lenient_columns})
    except ValidationError as err:
        problems = []
        for item in err.errors():
            where = ".".join(str(p) for p in item["loc"]) or "(top level)"
            problems.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
        raise PresetError(f"{source}: " + "; ".join(problems)) from None


def load_preset(path: str | Path) -> Preset:
    """Read and validate one preset file (a name like `quickstart` looks in `presets_dir()`)."""
    path, data = read_preset_yaml(path)
    return parse_preset(data, path.name)


def list_presets() -> dict[str, Path]:
    """Preset name (file stem) -> path, for every `*.yaml` in `presets_dir()` except plain YAML lists and
    presets of another task.

    A file holding a YAML list is an input of another command (`chat --turns`,
    `prefix --prompts`), not a comparison preset; a mapping with a `task:` key (e.g. `task: needle`,
    `kvlab.needle.preset`) is another tab's preset.
    """
    return {p.stem: p for p in sorted(presets_dir().glob("*.yaml")) if not _is_other_input(p)}


def _is_other_input(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, list) or (isinstance(data, dict) and "task" in data)


def strategies_preset(prompt: str, items: list[str], name: str, model: dict | None = None,
                      generation: dict | None = None) -> Preset:
    """The preset of a run asked for as a prompt and a list of strategies in compare syntax (the command line's
    `--prompt/--strategies`, the `compare_strategies` agent tool): each item's strategy name a column, its knobs
    left to `strategy_columns`; `model` and `generation` are the preset's sections (defaults when None).

    Raises:
        ValueError: an empty prompt or one that is not valid Unicode; PresetError: a section that fails the
            schema.
    """
    check_prompt(prompt)
    data = {"name": name, "prompt": {"text": prompt}, "columns": [{"strategy": item.split(":")[0]} for item in items]}
    data.update({key: section for key, section in (("model", model), ("generation", generation)) if section})
    return parse_preset(data, name, lenient_columns=True)


def strategy_columns(items: list[str], fallback: str | None = None) -> list[Column]:
    """One `Column` per item in compare syntax; a bad item is a rejected column that reports in its own place
    (`Column.from_text`; `fallback` as there).

    Raises:
        ValueError: every item is bad, so nothing could run; the message gives each column's reason.
    """
    columns = [Column.from_text(item, fallback) for item in items]
    if all(column.strategy is None for column in columns):
        raise ValueError("; ".join(f"{column.title}: {column.rejected}" for column in columns))
    return columns
