"""ZeroGPU, the shared GPUs of Hugging Face Spaces: the GPU-bound entry points wrapped with `spaces.GPU`.

ZeroGPU works only in Gradio-SDK Spaces: a function decorated with
`@spaces.GPU(duration=...)` gets a GPU for at most `duration` seconds per call
(a callable duration receives the same arguments as the function, so a call
asks for what it needs; a shorter ask is served sooner). The decorator is
effect-free outside ZeroGPU, and the `spaces` package exists only on Spaces:
where it cannot be imported, `gpu()` returns the function unchanged and
everything behaves as without this module. ZeroGPU does not support
`torch.compile`, so `hidden_knobs()` hides static's `compile` knob there.

Durations: `estimate_s` sizes a call from its columns × tokens with a fixed
start-up allowance, clamped to [MIN_DURATION_S, MAX_DURATION_S]. This module
imports neither gradio nor torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

MIN_DURATION_S = 30
MAX_DURATION_S = 300
"""ZeroGPU's own bounds on one call (seconds); a larger ask is cut to this."""
START_S = 20.0
"""Allowance per call for moving the model to the GPU and warming up (seconds)."""
SECONDS_PER_TOKEN = 0.05
"""GPU seconds one generated token of one column is given (a 135M-parameter model decodes a token in about 20 ms
on a shared GPU; this leaves room for larger ones)."""
HIDDEN_ON_ZEROGPU = {"static": frozenset({"compile"})}
"""Knobs not offered on ZeroGPU, per strategy."""


def spaces_module():
    """The `spaces` package when it can be imported (on Hugging Face Spaces), else None."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def available() -> bool:
    """Whether the entry points are wrapped for ZeroGPU here."""
    return spaces_module() is not None


def estimate_s(columns: int, tokens: int) -> int:
    """GPU seconds to ask for a call generating `tokens` tokens in each of `columns` columns."""
    wanted = START_S + max(1, columns) * max(1, tokens) * SECONDS_PER_TOKEN
    return int(min(MAX_DURATION_S, max(MIN_DURATION_S, wanted)))


def gpu(fn: Callable, duration: Callable[..., int]) -> Callable:
    """`fn` wrapped with `spaces.GPU(duration=duration)` where `spaces` is importable, else `fn` itself.

    Args:
        fn: a gradio event function (plain or generator).
        duration: called with `fn`'s arguments; returns the seconds to ask for.
    """
    spaces = spaces_module()
    if spaces is None:
        return fn
    return spaces.GPU(duration=duration)(fn)


def hidden_knobs() -> dict[str, frozenset[str]]:
    """Strategy name -> knobs the cards leave out here (static's `compile` on ZeroGPU, nothing elsewhere)."""
    return dict(HIDDEN_ON_ZEROGPU) if available() else {}
