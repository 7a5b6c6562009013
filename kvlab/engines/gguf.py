"""The GGUF file a loaded model came from, for the engines that run GGUF weights (llama.cpp).

A bundled model's file ships in its package (Gemma's is assembled from its chunk packages into a staging folder
of the cache folder, removed once the engine has read it); a local `.gguf` source is its own file. A hub id or
a folder of safetensors has no GGUF: `gguf_refusal` says so in one line. This module finds files; it loads
nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..models.bundled import bundled_model, gguf_path
from ..models.gguf_cache import ModelLoadError

GGUF_SUFFIX = ".gguf"
NO_GGUF = ("needs the model as a GGUF file, and {source!r} has none: load a bundled model or a local .gguf file "
           "(llama.cpp runs GGUF weights only)")


def gguf_refusal(source: str) -> str | None:
    """Why a model loaded from `source` has no GGUF file for llama.cpp (one line), or None when it has one."""
    text = (source or "").strip()
    try:
        if bundled_model(text) is not None:
            return None
    except ModelLoadError as err:
        return str(err)
    if text.lower().endswith(GGUF_SUFFIX):
        return None
    return NO_GGUF.format(source=text)


@contextlib.contextmanager
def gguf_file(source: str) -> Iterator[Path]:
    """While open, the GGUF file of a model loaded from `source` (a bundled key or a local `.gguf` path); a file
    assembled for the purpose is removed on exit (an engine that mapped it keeps its pages).

    Raises:
        ModelLoadError: no GGUF file (the `gguf_refusal` line), a missing package or file, or a Gemma file that
            could not be assembled.
    """
    reason = gguf_refusal(source)
    if reason:
        raise ModelLoadError(reason)
    text = source.strip()
    model = bundled_model(text)
    if model is None:
        path = Path(text).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"{text!r}: no such file")
        yield path
        return
    path, scratch = gguf_path(model, lambda fraction, message: None)
    try:
        yield path
    finally:
        if scratch is not None:
            scratch.discard()
