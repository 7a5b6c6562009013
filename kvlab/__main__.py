"""`python -m kvlab ...` and the `kvlab` command: see `kvlab.cli`.

`entry` runs the command line so that a package missing from the environment
(a set-up that did not run) is reported in one line naming it and the set-up
command, not as a traceback, and a Ctrl-C during the imports ends with one line and exit status 130.
"""

import sys

from kvlab import SETUP_HINT


def entry(prog: str = "kvlab") -> int:
    """Run the command line; exit status 2 with one line on stderr when a required package is missing."""
    try:
        from kvlab.cli import main

        return main(prog=prog)
    except KeyboardInterrupt:  # during the imports, before a subcommand runs
        print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        print(f"kvlab: the package {(err.name or str(err)).split('.')[0]} is not installed here: {SETUP_HINT}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(entry(prog="python -m kvlab"))
