"""The registry of quantization backends: backend name -> the backend object (`kvlab.caches.quant.base.QuantBackend`).

`register_backend` adds an object (each backend module registers its own; `kvlab/caches/quant/__init__.py`
imports the modules in the order the knob messages list them); `quantized_backend` answers
`quantized:backend=<name>`; `backend_of_layer` says which backend made a cache layer (accounting, Inspect and the
planner ask it). This module keeps the table; it knows no backend by name.
"""

from __future__ import annotations

BACKENDS: dict = {}
"""Backend name -> backend object, in registration order."""


def register_backend(backend):
    """Add `backend` (a `QuantBackend`) under its `name`, replacing one of that name; returns it."""
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str):
    """The backend registered as `name`.

    Raises:
        KeyError: no backend has that name (the message lists the registered ones).
    """
    if name not in BACKENDS:
        raise KeyError(f"no quantization backend {name!r}; registered: {list(BACKENDS)}")
    return BACKENDS[name]


def quantized_backend_names() -> list[str]:
    """Names the `quantized` strategy's `backend` knob takes, in registry order."""
    return [name for name, backend in BACKENDS.items() if backend.in_quantized]


def quantized_backend(name):
    """The backend `quantized:backend=<name>` stands for.

    Raises:
        ValueError: `name` is not one of `quantized_backend_names()` (the message lists them).
    """
    names = quantized_backend_names()
    if name not in names:
        raise ValueError(f"backend must be one of {names}, got {name!r}")
    return BACKENDS[name]


def backend_of_layer(layer):
    """The backend whose layer class `layer` is an instance of (a subclass counts, e.g. an eviction's
    `Pruned<layer>`), or None for a layer no backend made (plain, static, sliding, sink layers)."""
    for backend in BACKENDS.values():
        if backend.owns(layer):
            return backend
    return None


def parse_quantize(text: str):
    """(backend, layer knobs) of the first backend that answers to the `quantize=` value `text`, or None."""
    for backend in BACKENDS.values():
        knobs = backend.parse_quantize(text)
        if knobs is not None:
            return backend, knobs
    return None


def quantize_choices() -> str:
    """The `quantize=` values every backend answers to, in registry order (for messages)."""
    return ", ".join(backend.quantize_choices() for backend in BACKENDS.values())
