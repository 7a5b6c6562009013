"""`python -m benchmarks [flags of python -m kvlab bench]`: kvlab's bench with the repository's app and warm
sections registered (`--only app` or `--only warm` runs one alone)."""

from __future__ import annotations

import sys

from kvlab.bench.harness import register_section
from kvlab.cli import main

from .app_section import bench_app
from .app_text import app_lines
from .warm_section import bench_warm, warm_lines


def run(argv: list[str]) -> int:
    """Register the app and warm sections, then run the bench with `argv`; returns its exit status."""
    register_section("app", bench_app, ("paths", app_lines))
    register_section("warm", bench_warm, ("apps", warm_lines))
    return main(["bench", *argv], prog="python -m benchmarks")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
