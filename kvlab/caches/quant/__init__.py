"""Quantization backends, one object each, and their registry: the one home of what kvlab knows about a way of
storing keys and values in fewer bits.

Each backend module defines its object (a `QuantBackend`, `base.py` says what it owns: knobs and their checks,
its cache layer for a model, its byte layout, its code snippet, its refusal reason, its version and its serving
note) and registers it; the import line below is the registry's order. The `quantized` and `rotation_quantized`
strategies and the eviction strategies' `quantize=` knob look a backend up here; `kvlab.accounting`, Inspect and
the planner ask the backend of a layer (`backend_of_layer`). Adding a backend: its module here and its name on
the import line.
"""

from .base import QuantBackend
from .registry import (
    BACKENDS,
    backend_of_layer,
    get_backend,
    parse_quantize,
    quantize_choices,
    quantized_backend,
    quantized_backend_names,
    register_backend,
)
from . import quanto, hqq, fp8, vllm, llamacpp, rotation  # noqa: F401,E402,I001  (registration order)

__all__ = ["BACKENDS", "QuantBackend", "backend_of_layer", "get_backend", "parse_quantize", "quantize_choices",
           "quantized_backend", "quantized_backend_names", "register_backend"]
