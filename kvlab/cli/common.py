"""What the subcommands of `kvlab` share: one parent parser for `--model/--dtype/--device`.

Every subcommand that loads a model's weights takes `model_parent()` as a parent
and states its own defaults with `model_defaults(...)`; `fill_model_defaults`
(called once by `kvlab.cli.main`) puts them in where a flag was not given.
The flags default to None in the parser so that a subcommand without defaults
(`compare`, whose preset decides) can tell "not given" apart. This module
declares flags and tidies the command line before and after argparse (`prepare_argv`, `check_lists`); it does
not load models.
"""

from __future__ import annotations

import argparse
import re

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


NEGATIVE_VALUE = re.compile(r"^-\.?[0-9]")
"""A value that starts like a negative number (`-0.5,1.5`, `-1k`, `-.5`), which argparse would take for a flag."""

LIST_FLAGS = ("strategies", "lengths", "depths", "seeds", "columns", "only")
"""Comma-list options (by dest): given empty, one line and exit 2 instead of falling back to a default."""

REMOVED_FLAGS = {
    ("compare", "--no-retime"): "live timing without a quiet re-timing pass is the default now "
                                "(--timing quiet opts in)",
}
"""(subcommand, flag) -> what replaced it: an old script's flag is dropped with one line, and the run goes on."""


def prepare_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv argparse can read, notes for stderr). A value that starts with '-' and a digit after a `--flag`
    (`--depths -0.5,1.5`) is joined to it (`--depths=-0.5,1.5`) so kvlab's own range check sees it, for every
    option; a removed flag (`REMOVED_FLAGS`) is dropped with a note saying what replaced it."""
    command = next((a for a in argv if not a.startswith("-")), "")
    out, notes = [], []
    for arg in argv:
        if (command, arg) in REMOVED_FLAGS:
            notes.append(f"kvlab {command}: {arg} is removed: {REMOVED_FLAGS[(command, arg)]}; ignoring it")
            continue
        previous = out[-1] if out else ""
        if NEGATIVE_VALUE.match(arg) and previous.startswith("--") and "=" not in previous:
            out[-1] = f"{previous}={arg}"
            continue
        out.append(arg)
    return out, notes


def check_lists(args: argparse.Namespace) -> str | None:
    """The one-line complaint about a comma-list option given with no item (`--lengths ""`), or None."""
    for dest in LIST_FLAGS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not any(item.strip() for item in value.split(",")):
            return (f"kvlab {args.command}: --{dest.replace('_', '-')} is empty: give at least one item, or leave "
                    "the flag out for the default")
    return None
