"""Files the command lines write (`--json`, `--markdown`): checked before any work starts, written whole.

`check_writable` opens the path for appending before a model loads, so a run
that could never save its record is refused at once (exit 2, one line) instead
of failing after the work; `write_text` writes through a temporary file beside
the target, so an interrupt never leaves half a file. Neither decides what a
record holds. `StopOnInterrupt` turns a first Ctrl-C into a stop request, so
a run ends within a step and its partial record is still written. `write_outputs` is every subcommand's
one way of writing its files and saying so (or saying in one line why not).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path


class OutputError(ValueError):
    """An output file cannot be written; the message names the flag, the path and the reason in one line."""


def _reason(err: OSError) -> str:
    return err.strerror or str(err).splitlines()[0] or type(err).__name__


def check_writable(path: str | None, flag: str = "--json") -> None:
    """Check that `path` (nothing when None or empty) can be written: a folder or a file inside a missing
    folder is refused, and the file is opened for appending (a file that did not exist before is removed
    again).

    Raises:
        OutputError: `path` is a folder, its folder does not exist, or it cannot be opened for writing.
    """
    if not path:
        return
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputError(f"{flag} {path}: is a folder, not a file")
    if not target.parent.is_dir():
        raise OutputError(f"{flag} {path}: no such folder {str(target.parent)!r}")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as err:
        raise OutputError(f"{flag} {path}: cannot be written ({_reason(err)})") from None
    if not existed:
        target.unlink(missing_ok=True)


def write_text(path: str, text: str, flag: str = "--json") -> None:
    """Write `text` to `path` through `path.partial`, replaced in one step.

    Raises:
        OutputError: the file cannot be written (the partial file is removed).
    """
    target = Path(path).expanduser()
    partial = target.with_name(target.name + ".partial")
    try:
        partial.write_text(text)
        os.replace(partial, target)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise OutputError(f"{flag} {path}: cannot be written ({_reason(err)})") from None


EXIT_USAGE = 2
"""The exit status of bad input, or of a file that cannot be written."""


def write_outputs(prog: str, outputs, note: str = "") -> int:
    """Write each `(path, flag, text)` of `outputs` whose path is set (`text`: a callable giving the file's text,
    called only then) and say `wrote PATH{note}` on stderr for each. Returns 0, or EXIT_USAGE after one line
    on stderr (`prog: --flag PATH: cannot be written (...)`) at the first file that cannot be written."""
    try:
        for path, flag, text in outputs:
            if path:
                write_text(path, text(), flag)
                print(f"wrote {path}{note}", file=sys.stderr)
    except OutputError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_USAGE
    return 0


class StopOnInterrupt:
    """While active, the first Ctrl-C (SIGINT) sets `stop` and says so in one line on stderr, so the run ends
    within a step and its partial record is kept; a second Ctrl-C raises KeyboardInterrupt. The previous
    handler is put back on exit (main thread only; elsewhere nothing is installed).

    Args:
        stop: the run's stop event.
        prog: the command's name for the line (`kvlab compare`).
    """

    def __init__(self, stop: threading.Event, prog: str):
        self.stop, self.prog, self.previous = stop, prog, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def _interrupt(self, signum, frame):
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        print(f"{self.prog}: stopping after the current step (Ctrl-C again to quit without a record)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
