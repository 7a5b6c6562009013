"""`python -m benchmarks [flags of python -m kvlab bench]`: kvlab's bench with the repository's app section
registered (`--only app` runs it alone)."""

from __future__ import annotations

import sys

from kvlab.bench.harness import register_section
from kvlab.cli import main

from .app_section import bench_app
from .app_text import app_lines


def run(argv: list[str]) -> int:
    """Register the app section, then run the bench with `argv`; returns its exit status."""
    register_section("app", bench_app, ("paths", app_lines))
    return main(["bench", *argv], prog="python -m benchmarks")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
