"""Command line: `kvlab compare|chat|prefix|perplexity|plan|inspect|diverge|bench|needle|report` (or `python -m kvlab ...`).

One parser with one subparser per subcommand. Each subcommand module in
`SUBCOMMANDS` exposes `add_parser(subparsers, parents)`, which adds its
subparser(s) and sets `func` to its run function; `parents` holds the shared
`--model/--dtype/--device` parent (`kvlab.cli.common`) for subcommands that load
a model. Registering a new subcommand is one line in `SUBCOMMANDS`. This module
builds and dispatches the parser; the work is each subcommand module's. Before argparse, a negative value
after a flag is joined to it and a removed flag is dropped with a note; after it, an empty comma list is
refused in one line (exit 2); see `kvlab.cli.common`.

Ctrl-C: a subcommand keeps what it finished in its own handler (compare's partial record, chat's finished
turns, needle's finished cells); any Ctrl-C that reaches `main` (a model load, a warm-up, a run without its
own handler, a write) ends the command with one line on stderr and exit status 130 (`INTERRUPTED`).
"""

from __future__ import annotations

import argparse
import importlib

from .common import check_lists, fill_model_defaults, model_parent, prepare_argv

INTERRUPTED = 130
"""Exit status of a command ended by Ctrl-C (128 + SIGINT, as a shell reports it)."""

SUBCOMMANDS = (
    "kvlab.cli.compare",
    "kvlab.cli.chat",
    "kvlab.cli.perplexity",
    "kvlab.cli.plan",
    "kvlab.cli.inspect",
    "kvlab.cli.diverge",
    "kvlab.bench",
    "kvlab.cli.needle",
    "kvlab.cli.report",
)
"""Modules that each expose `add_parser(subparsers, parents)`, in the order `--help` lists them."""


def build_parser(prog: str = "kvlab") -> argparse.ArgumentParser:
    """The whole command line: one subparser per registered subcommand."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    parents = [model_parent()]
    for name in SUBCOMMANDS:
        importlib.import_module(name).add_parser(sub, parents)
    return parser


def main(argv: list[str] | None = None, prog: str = "kvlab") -> int:
    """Run one subcommand; `prog` is the name usage lines show (`kvlab` or `python -m kvlab`)."""
    import sys

    argv, notes = prepare_argv(sys.argv[1:] if argv is None else list(argv))
    for note in notes:
        print(note, file=sys.stderr)
    args = fill_model_defaults(build_parser(prog).parse_args(argv))
    problem = check_lists(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        interrupted(f"kvlab {args.command}")
        return INTERRUPTED


def interrupted(prog: str) -> None:
    """The one line a Ctrl-C that reached the top leaves on stderr (the subcommand kept nothing more)."""
    import sys

    print(f"{prog}: interrupted; nothing more was written", file=sys.stderr, flush=True)
