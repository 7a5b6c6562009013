"""Model configs for the planner: the shipped catalog, the bundled model, a local folder or a hub id.

The catalog is `presets/models/*.yaml`, one public model per file: its hub id,
where its values come from, and the fields of its `config.json` that shape the
KV cache and the parameter count (everything else keeps transformers'
defaults, as it would when loading that `config.json`). Entries are addressed
by hub id everywhere. `resolve_config` turns a model source into a transformers
config without loading any weights: a folder's or a hub repository's config.json
is read through `kvlab.plan.config_limits` (size- and shape-capped before any
config is built), and with local sources off (`kvlab.models.sources`) only
bundled names, catalog ids and hub ids pass, decided before anything touches the
file system. This module reads configs; it does not build models or plan.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config_limits import ConfigError, read_config_file

CONFIG_FILE = "config.json"
CATALOG_DIR: Path | None = None
"""The catalog folder; None (the default) means `models/` in `kvlab.presets.presets_dir()` (the source
checkout's `presets/models`, or `<prefix>/share/kvlab/presets/models` after a regular install)."""


def catalog_dir() -> Path:
    """Where the catalog files are read from (see `CATALOG_DIR`)."""
    from ..presets import presets_dir

    return CATALOG_DIR if CATALOG_DIR is not None else presets_dir() / "models"


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

    A hub id outside the catalog has its config.json fetched with huggingface_hub (never read as a local
    folder) where the hub is reachable, else taken from the local Hugging Face cache. A folder's or the hub's
    config.json goes through `kvlab.plan.config_limits.read_config_file` before a config is built.

    Raises:
        ConfigError: empty source, a path to no folder ("no such folder"), a folder without config.json, a
            config.json over a limit or not valid, local folders off (one line for every refused source,
            whether or not it exists) or hub ids disabled (KVLAB_ALLOW_LOCAL / KVLAB_ALLOW_HUB), a file in
            the app's upload folder, or a name that is neither in the catalog nor reachable; the message lists
            the catalog's hub ids.
    """
    from ..models.loading import (BUNDLED, UPLOAD_REFUSAL, allow_hub, allow_local_folders, in_upload_folder,
                                  looks_like_path)

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
    if not allow_local_folders():
        return _hub_only(name)
    if in_upload_folder(name):
        raise ConfigError(UPLOAD_REFUSAL)
    folder = Path(name).expanduser()
    if _is_dir(folder):
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{name!r} is not a model folder: it has no config.json")
        return ResolvedConfig(config_from_file(folder / "config.json"), folder.name, "folder")
    if looks_like_path(name):
        raise ConfigError(f"{name!r}: no such folder")
    if "/" not in name:
        raise ConfigError(f"unknown model {name!r}: not a local folder and not in the catalog; known: {_known_text()}")
    if not allow_hub():
        raise ConfigError(f"{name!r} is not in the catalog and hub ids are disabled here (KVLAB_ALLOW_HUB=0); "
                          f"known: {_known_text()}")
    return ResolvedConfig(_hub_config(name), name, "hub")


def _is_dir(folder: Path) -> bool:
    try:
        return folder.is_dir()
    except (OSError, ValueError):
        return False


def _hub_only(name: str) -> ResolvedConfig:
    """The config of hub id `name` while local sources are off; anything else gets the one refusal line."""
    from ..models.bundled import MODELS
    from ..models.loading import allow_hub, is_hub_id, local_refusal

    if not is_hub_id(name):
        raise ConfigError(f"{local_refusal(MODELS)}; the catalog: {_known_text()}")
    if not allow_hub():
        raise ConfigError(f"{name!r} is not in the catalog and hub ids are disabled here (KVLAB_ALLOW_HUB=0); "
                          f"known: {_known_text()}")
    return ResolvedConfig(_hub_config(name), name, "hub")


def config_from_file(path: Path):
    """The transformers config of a config.json file, read through `kvlab.plan.config_limits` (size and shape
    capped) and built with its model type's config class (`from_dict`; no remote code).

    Raises:
        ConfigError: the file over a limit or not valid, no model_type, a model_type transformers does not
            know, or a config class refusing a field (one line, no paths).
    """
    return config_from_dict(read_config_file(path))


def config_from_dict(data: dict):
    """`config_from_file` for an already parsed and checked config.json object."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from ..models.sources import safe_line

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("config.json has no model_type: not a transformers model config")
    try:
        config_class = CONFIG_MAPPING[model_type]
    except KeyError:
        raise ConfigError(f"transformers does not know model_type {model_type[:60]!r}") from None
    try:
        return config_class.from_dict(data)
    except Exception as err:  # noqa: BLE001 - a config class refuses odd fields in many ways; one line each
        raise ConfigError(f"config.json does not build a {model_type} config: {type(err).__name__}: "
                          f"{safe_line(str(err))}") from None


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
    """The config of a hub id outside the catalog, from its config.json (see `_hub_config_file`).

    Raises:
        ConfigError: the hub cannot provide the file (the reason's first line off a public server), or the
            file is over a limit or not valid.
    """
    from ..models.loading import hub_reachable, public_mode
    from ..models.sources import safe_line

    online = hub_reachable()
    try:
        path = _hub_config_file(hub_id, online)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - huggingface_hub's many errors (not found, gated, offline) read alike
        where = "the hub did not provide it" if online else "the hub is unreachable from here (no network)"
        details = "" if public_mode() else f". Details: {safe_line(str(err) or type(err).__name__)}"
        raise ConfigError(f"{hub_id!r} is not in kvlab's catalog and {where}; known: {_known_text()}"
                          f"{details}") from None
    return config_from_file(path)


def _hub_config_file(hub_id: str, online: bool) -> Path:
    """The local copy of a hub repository's config.json: its size asked first when online (a file over
    `MAX_CONFIG_BYTES` is not downloaded), else the local Hugging Face cache's copy."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    from .config_limits import MAX_CONFIG_BYTES, TOO_LARGE

    if online:
        size = get_hf_file_metadata(hf_hub_url(hub_id, CONFIG_FILE)).size
        if size is not None and size > MAX_CONFIG_BYTES:
            raise ConfigError(TOO_LARGE)
    return Path(hf_hub_download(hub_id, CONFIG_FILE, local_files_only=not online))


def _auto_config(name: str, local_only: bool, **kwargs):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name, local_files_only=local_only, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        from ..models.sources import safe_line

        raise ConfigError(safe_line(str(err)) or type(err).__name__) from err
