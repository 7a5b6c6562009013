"""`python -m kvlab bench ...`: the sub-command's flags, their checks, and the run from flags to files.

`cmd_bench` refuses bad flags and unwritable outputs before measuring (exit 2,
the reason on stderr), turns SIGTERM into SystemExit so every `finally` runs
(child app stopped, temporary folders removed), writes the JSON record even if
plotting fails, prints the report and optionally writes the Markdown table.
The exit status is 0 whenever the bench ran, whatever its checks say. This
module wires flags to `suite`, `text` and `plots`; it measures nothing itself.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path

from .harness import SIZES, section_names
from .strategy_sets import REPLACED_SECTIONS, parse_strategies
from .text import format_markdown, format_report

DEFAULT_OUTPUT = Path("artifacts") / "bench"


def parse_only(text: str | None) -> list[str]:
    """The sections named in `--only` (comma list), in `section_names()` order; None means all.

    Raises:
        ValueError: an unknown or empty list; the message lists the allowed sections.
    """
    sections = section_names()
    if text is None:
        return list(sections)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in sections]
    if unknown or not names:
        raise ValueError(f"unknown section(s) {unknown or names}; allowed: {','.join(sections)}")
    return [name for name in sections if name in names]


def add_parser(sub, parents=()) -> None:
    """Add the `bench` sub-command to an argparse sub-parsers object (it takes no model flags: `parents` unused)."""
    p = sub.add_parser("bench", help="measure kvlab's own overhead, fairness, scaling, start-up, roofline, planner and "
                                          "the app against the CLI")
    p.add_argument("--size", choices=list(SIZES), default="full",
                   help="smoke: under a minute on 2 idle cores, checks the plumbing; small: a few minutes; "
                        "full (default): the README figures, about half an hour on 2 cores")
    p.add_argument("--only", help=f"comma list of sections: {','.join(section_names())}")
    p.add_argument("--repeats", type=int, help="repeats per figure, scaling included (overrides the size's)")
    p.add_argument("--strategies",
                   help=f"replace the strategies of the {', '.join(REPLACED_SECTIONS)} sections; the syntax of "
                        "`compare --strategies`: dynamic,quantized:backend=hqq:nbits=4")
    p.add_argument("--json", default=str(DEFAULT_OUTPUT / "bench.json"), help="write the record here")
    p.add_argument("--plots", default=str(DEFAULT_OUTPUT / "plots"), help="write PNG plots (and profiles) into this folder")
    p.add_argument("--markdown", help="also write the checks table as Markdown (for the README)")
    p.set_defaults(func=cmd_bench)


def check_outputs(files: list[Path], folder: Path) -> None:
    """Create the output folders and make sure each file can be written, before a run that may take half an hour.

    Raises:
        OSError: a folder cannot be created or a file cannot be opened for writing.
    """
    for path in files:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "a"):
            pass
        if not existed:
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def resolve_flags(args) -> dict:
    """{only, size, strategies} from the flags.

    Raises:
        ValueError: a bad flag; the message says which and what is allowed.
    """
    only = parse_only(args.only)
    size = SIZES[args.size]
    if args.repeats is not None:
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        size = dataclasses.replace(size, repeats=args.repeats, scaling_repeats=args.repeats,
                                   startup_repeats=args.repeats)
    if args.markdown and Path(args.markdown).resolve() == Path(args.json).resolve():
        raise ValueError("--json and --markdown name the same file; give them different paths")
    strategies = parse_strategies(args.strategies) if args.strategies is not None else None
    return {"only": only, "size": size, "strategies": strategies}


def command_line(args, only: list[str]) -> str:
    """The command that reproduces this run (as recorded and shown in the Markdown)."""
    return " ".join([f"python -m kvlab bench --size {args.size}"]
                    + ([f"--only {','.join(only)}"] if args.only is not None else [])
                    + ([f"--repeats {args.repeats}"] if args.repeats is not None else [])
                    + ([f"--strategies {args.strategies}"] if args.strategies is not None else []))


def _say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwinds the `finally` blocks: child app.py stopped, temp folders removed


def cmd_bench(args) -> int:
    """Run the bench from parsed flags; returns the exit status (2: nothing measured, 0: the bench ran)."""
    from ..models.loading import ModelLoadError
    from .suite import run_bench

    # 1. Flags and outputs, refused before anything is measured.
    try:
        plan = resolve_flags(args)
    except ValueError as err:
        print(f"kvlab bench: {err}", file=sys.stderr)
        return 2
    plots = Path(args.plots)
    try:
        check_outputs([Path(args.json)] + ([Path(args.markdown)] if args.markdown else []), plots)
    except OSError as err:
        print(f"kvlab bench: cannot write the results where asked ({err}); nothing was measured", file=sys.stderr)
        return 2
    if plan["strategies"] is not None and not set(REPLACED_SECTIONS) & set(plan["only"]):
        _say(f"--strategies only changes the {', '.join(REPLACED_SECTIONS)} sections, and none of them runs")
    # 2. The measurement, with SIGTERM turned into SystemExit so every `finally` runs.
    previous_handler = signal.signal(signal.SIGTERM, _terminate)
    try:
        record = run_bench(plan["size"], plan["only"], _say, profile_dir=plots, strategies=plan["strategies"])
    except ModelLoadError as err:
        print(f"kvlab bench: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    # 3. The files and the report; the JSON is written even if plotting fails.
    record["command"] = command_line(args, plan["only"])
    write_outputs(record, args, plots)
    return 0


def write_outputs(record: dict, args, plots: Path) -> None:
    """Draw the plots, write the JSON (even when plotting fails), print the report, write the Markdown."""
    from .plots import draw_all

    try:
        record["plots"] = [str(path) for path in draw_all(record, plots)]
    finally:
        Path(args.json).write_text(json.dumps(record, indent=1))
    print(format_report(record))
    print(f"wrote {args.json} and {len(record['plots'])} plots in {plots}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(record))
        print(f"wrote {args.markdown}", file=sys.stderr)
