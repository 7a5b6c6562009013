"""What the stepping subcommands (`inspect`, `diverge`) share: open a session, print a line per step, write
the JSON record, each with one line on stderr where it fails or is interrupted.

A subcommand gives `open_session` a function that checks its flags, loads the model and returns
(loaded model, session); the session's `steps(n)` yields one record per step. This module runs no model
itself and decides nothing about what a record holds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def open_session(prog: str, build: Callable[[], tuple]):
    """`build()` -> (loaded, session), or the exit status after one line on stderr: EXIT_USAGE for bad input
    (ValueError, e.g. StrategyError) or a model that does not load, EXIT_INTERRUPTED for Ctrl-C."""
    from ..models.loading import ModelLoadError

    try:
        return build()
    except (ValueError, ModelLoadError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED


def print_steps(prog: str, session, steps: int, line: Callable) -> list:
    """Run `session.steps(steps)` on kvlab's compute thread and print `line(record)` for each; a Ctrl-C ends
    the loop with one line on stderr. Returns the records of the steps that finished."""
    from ..compute import compute_iter

    records = []
    try:
        for record in compute_iter(session.steps(steps)):
            records.append(record)
            print(line(record))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted after {len(records)} steps; the record keeps them", file=sys.stderr)
    return records


def write_record(prog: str, path: str | None, document: dict) -> int:
    """Write `document` as JSON to `path` (nothing when None); 0, or EXIT_USAGE after one line on stderr."""
    from .outputs import write_outputs

    return write_outputs(prog, [(path, "--json", lambda: json.dumps(document, indent=1))])
