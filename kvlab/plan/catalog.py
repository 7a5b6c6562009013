"""Model configs for the planner: the shipped catalog, the bundled model, a local folder or a hub id.

The catalog is `presets/models/*.yaml`, one public model per file: its hub id,
where its values come from, and the fields of its `config.json` that shape the
KV cache and the parameter count (everything else keeps transformers'
defaults, as it would when loading that `config.json`). Entries are addressed
by hub id everywhere. `resolve_config` turns a model source into a transformers
config without loading any weights. This module reads configs; it does not
build models or plan.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

CATALOG_DIR: Path | None = None
"""The catalog folder; None (the default) means `models/` in `kvlab.presets.presets_dir()` (the source
checkout's `presets/models`, or `<prefix>/share/kvlab/presets/models` after a regular install)."""


def catalog_dir() -> Path:
    """Where the catalog files are read from (see `CATALOG_DIR`)."""
    from ..presets import presets_dir

    return CATALOG_DIR if CATALOG_DIR is not None else presets_dir() / "models"


class ConfigError(ValueError):
    """A model source cannot give a config: unknown name, folder without config.json, hub unreachable."""


class CatalogEntry(BaseModel):
    """The schema of `presets/models/*.yaml`.

    hub_id: the model's Hugging Face id (how it is addressed). source: the URL of
    its config.json. cross_checked: where the values were checked a second time.
    notes: what to know when reading its plan. config: config.json fields (with
    `model_type`).
    """

    model_config = ConfigDict(extra="forbid")
    hub_id: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    source: str = Field(pattern=r"^https://huggingface\.co/")
    cross_checked: str = ""
    notes: str = ""
    config: dict

    def build_config(self):
        """The transformers config of this entry (`AutoConfig.for_model`), no download.

        Raises:
            ConfigError: transformers does not know the entry's model_type or refuses a field.
        """
        from transformers import AutoConfig

        fields = dict(self.config)
        model_type = fields.pop("model_type", None)
        try:
            return AutoConfig.for_model(model_type, **fields)
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"catalog entry {self.hub_id!r} does not build a config: {err}") from err


@functools.lru_cache(maxsize=1)
def load_catalog() -> dict[str, CatalogEntry]:
    """hub id -> entry for every `presets/models/*.yaml`, sorted by hub id.

    Raises:
        ConfigError: a file is not valid YAML, fails the schema, or repeats a hub id.
    """
    entries: dict[str, CatalogEntry] = {}
    for path in sorted(catalog_dir().glob("*.yaml")):
        try:
            entry = CatalogEntry.model_validate(yaml.safe_load(path.read_text()))
        except (yaml.YAMLError, ValidationError) as err:
            raise ConfigError(f"catalog file {path.name}: {err}") from err
        if entry.hub_id in entries:
            raise ConfigError(f"catalog file {path.name}: hub id {entry.hub_id!r} appears twice")
        entries[entry.hub_id] = entry
    return dict(sorted(entries.items()))


def known_models() -> list[str]:
    """The catalog's hub ids, sorted."""
    return list(load_catalog())


@dataclass(frozen=True)
class ResolvedConfig:
    """A model config ready to plan. origin: `catalog`, `bundled`, `folder` or `hub`."""

    config: object
    name: str
    origin: str
    notes: str = ""


def resolve_config(source) -> ResolvedConfig:
    """The config of `source`: `bundled`, a catalog hub id, a local folder with config.json, a hub id, a
    transformers config object (used as is), or a `ResolvedConfig` (returned as is: a caller may resolve once,
    away from the thread that plans, since a hub id reads the network).

    A hub id outside the catalog is read with `AutoConfig.from_pretrained` (config.json
    only) where the hub is reachable, else from the local Hugging Face cache.

    Raises:
        ConfigError: empty source, a path to no folder ("no such folder"), a folder without config.json, local folders or hub ids
            disabled (KVLAB_ALLOW_LOCAL / KVLAB_ALLOW_HUB), or a name that is neither in the
            catalog nor reachable; the message lists the catalog's hub ids.
    """
    from ..models.loading import BUNDLED, allow_hub, allow_local_folders, looks_like_path

    if isinstance(source, ResolvedConfig):
        return source
    if hasattr(source, "get_text_config"):
        name = getattr(source, "name_or_path", "") or source.model_type
        return ResolvedConfig(source, name, "config")
    name = (source or "").strip()
    if not name:
        raise ConfigError(f"no model given: use 'bundled', 'bundled:gemma-3-270m', a local folder, or one of "
                          f"{_known_text()}")
    catalog = load_catalog()
    if name == BUNDLED or name.startswith(BUNDLED + ":"):
        return _bundled_config(name)
    if name in catalog:
        entry = catalog[name]
        return ResolvedConfig(entry.build_config(), entry.hub_id, "catalog", entry.notes)
    folder = Path(name).expanduser()
    if folder.exists():
        if not allow_local_folders():
            raise ConfigError("reading local folders is disabled here (KVLAB_ALLOW_LOCAL=0)")
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{name!r} is not a model folder: it has no config.json")
        return ResolvedConfig(_auto_config(str(folder), local_only=True), folder.name, "folder")
    if looks_like_path(name):
        raise ConfigError(f"{name!r}: no such folder")
    if "/" not in name:
        raise ConfigError(f"unknown model {name!r}: not a local folder and not in the catalog; known: {_known_text()}")
    if not allow_hub():
        raise ConfigError(f"{name!r} is not in the catalog and hub ids are disabled here (KVLAB_ALLOW_HUB=0); "
                          f"known: {_known_text()}")
    return ResolvedConfig(_hub_config(name), name, "hub")


def _known_text() -> str:
    return ", ".join(known_models())


def _bundled_config(key: str) -> ResolvedConfig:
    """A bundled model's config: from its converted copy when there is one, else read from its GGUF file (no
    conversion; Gemma's file is assembled from its chunk packages for the read and removed after)."""
    import shutil

    from ..models.bundled import bundled_model, gguf_path
    from ..models.gguf_cache import ModelLoadError, converted_folder

    try:
        model = bundled_model(key)
        folder = converted_folder(model.folder_name)
        if folder is not None:
            return ResolvedConfig(_auto_config(str(folder), local_only=True), model.name, "bundled")
        path, scratch = gguf_path(model, lambda fraction, message: None)
    except ModelLoadError as err:
        raise ConfigError(f"could not read the bundled model's config: {err}") from err
    try:
        config = _auto_config(str(path.parent), local_only=True, gguf_file=path.name)
    except Exception as err:  # noqa: BLE001 - the model loader's errors are many; the message carries it
        raise ConfigError(f"could not read the bundled model's config: {err}") from err
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return ResolvedConfig(config, model.name, "bundled")


def _hub_config(hub_id: str):
    from ..models.loading import hub_reachable

    online = hub_reachable()
    try:
        return _auto_config(hub_id, local_only=not online)
    except ConfigError as err:
        where = "the hub did not provide it" if online else "the hub is unreachable from here (no network)"
        raise ConfigError(f"{hub_id!r} is not in kvlab's catalog and {where}; known: {_known_text()}. "
                          f"Details: {err}") from err


def _auto_config(name: str, local_only: bool, **kwargs):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, local_files_only=local_only, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(str(err).splitlines()[0] if str(err) else type(err).__name__) from err
