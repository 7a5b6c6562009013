"""`python -m kvlab ...`: see `kvlab.cli`."""

import sys

from .cli import main

sys.exit(main(prog="python -m kvlab"))
