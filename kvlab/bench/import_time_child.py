"""Import-time probe run by the bench: prints the seconds a fresh python takes to import one module.

`python -P kvlab/bench/import_time_child.py MODULE` imports MODULE by name
(`importlib.import_module`) and prints the wall seconds it took, one number on
one line. The start-up section runs it for the web UI's framework, by path and
with `-P`, so that nothing else is imported first: `python -m
kvlab.bench.import_time_child MODULE` also works, but imports the `kvlab`
package (torch, transformers) first, and modules shared with those would then
look faster. This module measures; it judges and formats nothing.
"""

import importlib
import sys
import time


def main(argv: list[str]) -> int:
    """Import the module named in `argv[0]` and print the seconds it took; returns the exit status."""
    if len(argv) != 1:
        print("usage: import_time_child.py MODULE", file=sys.stderr)
        return 2
    started = time.time()
    importlib.import_module(argv[0])
    print(time.time() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
