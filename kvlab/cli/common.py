"""What the subcommands of `kvlab` share: one parent parser for `--model/--dtype/--device`.

Every subcommand that loads a model's weights takes `model_parent()` as a parent
and states its own defaults with `model_defaults(...)`; `fill_model_defaults`
(called once by `kvlab.cli.main`) puts them in where a flag was not given.
The flags default to None in the parser so that a subcommand without defaults
(`compare`, whose preset decides) can tell "not given" apart. This module
declares flags; it does not load models.
"""

from __future__ import annotations

import argparse

from ..models.bundled import SOURCE_HELP

DTYPE_CHOICES = ("float32", "bfloat16", "float16")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
WEIGHTS_DEFAULTS = {"model": "bundled", "dtype": "float32", "device": "auto"}
"""The defaults of a subcommand that runs the model (chat, prefix, inspect, perplexity)."""
MODEL_FLAGS = tuple(WEIGHTS_DEFAULTS)


def model_parent() -> argparse.ArgumentParser:
    """The parent parser holding `--model`, `--dtype` and `--device` (each None unless given)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--model", help=SOURCE_HELP)
    parent.add_argument("--dtype", choices=DTYPE_CHOICES)
    parent.add_argument("--device", choices=DEVICE_CHOICES)
    return parent


def model_defaults(parser: argparse.ArgumentParser, defaults: dict[str, str]) -> None:
    """Record a subcommand's own defaults for the model flags (kept apart from the shared parent's actions)."""
    parser.set_defaults(model_flag_defaults=dict(defaults))


def fill_model_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Replace the model flags left at None by the subcommand's own defaults (in place; returns `args`)."""
    defaults = getattr(args, "model_flag_defaults", {})
    for flag in MODEL_FLAGS:
        if getattr(args, flag, None) is None and flag in defaults:
            setattr(args, flag, defaults[flag])
    return args
