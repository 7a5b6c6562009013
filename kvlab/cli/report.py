"""`kvlab report`: the quality report (ΔPPL, KL, top-1, bytes; recall with `--needle`) for cache columns on a text.

Every column is scored against dense `dynamic` token by token (`kvlab.quality.report`); progress lines go to
stderr, the table to stdout, `--json` writes the record and `--csv` the table. `--from RECORD ...` builds the
table from saved report, Compare and Needle records instead (no model), merging rows of one model and column.
`--leaderboard FOLDER` writes the reference leaderboard for both bundled models (`kvlab.quality.leaderboard`).
Bad input exits 2 with one line on stderr; a first Ctrl-C stops after the current token, prints the table of
what was scored, writes the record and exits 130 (a second Ctrl-C quits at once, writing nothing).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

PROG = "kvlab report"
INTERRUPTED = 130


def add_parser(sub, parents) -> None:
    """Add the `report` subcommand; `parents` holds the shared `--model/--dtype/--device` parent."""
    from ..quality.defaults import DEFAULT_COLUMNS
    from ..quality.report import DEFAULT_MAX_TOKENS, DEFAULT_SCORED_TOKENS, PROGRESS_EVERY
    from .common import WEIGHTS_DEFAULTS, model_defaults

    p = sub.add_parser("report", parents=parents,
                       help="quality report: ΔPPL, KL, top-1 and bytes of each cache against dense (llama.cpp's figures)")
    p.add_argument("--text", help="UTF-8 text file (default: the shipped Python Language Reference chapters, PSF-2.0)")
    p.add_argument("--columns", default=DEFAULT_COLUMNS,
                   help="comma list in compare syntax (default: 16 columns, sink/window at 256 and 1024, quanto and "
                        "hqq int2/int4, fp8, the seven eviction methods at 0.5; see docs/report.md)")
    p.add_argument("--scored-tokens", type=int, default=DEFAULT_SCORED_TOKENS,
                   help=f"tokens fed one per forward and scored (default {DEFAULT_SCORED_TOKENS})")
    p.add_argument("--context-tokens", type=int,
                   help="tokens prefilled first (default: the rest of the text after the scored tokens)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens of the text read (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--progress-every", type=int, default=PROGRESS_EVERY, help="a progress line every N tokens")
    p.add_argument("--needle", action="store_true",
                   help="also run a needle grid (1k tokens, depths 0/0.5/1, seeds 0/1/2) per column: hit rate with "
                        "a Wilson 95%% interval")
    p.add_argument("--json", help="write the record here (with --from: the merged table's rows)")
    p.add_argument("--csv", help="write the table here, one row per column")
    p.add_argument("--from", dest="records", nargs="+", metavar="RECORD",
                   help="build the table from saved report / Compare / Needle records (JSON) instead of running")
    p.add_argument("--leaderboard", metavar="FOLDER",
                   help="write FOLDER/<model>.json and .md for both bundled models (every strategy, documented "
                        "settings; --model picks one model)")
    model_defaults(p, WEIGHTS_DEFAULTS)
    p.set_defaults(func=run)


def _say(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _progress(event) -> None:
    """One stderr line per report event worth a line."""
    from ..protocol import ColumnFailed, RunDone, RunStarted
    from ..quality.report import REFERENCE, ReportProgress

    if isinstance(event, RunStarted):
        print(f"[report] {len(event.columns)} columns; {event.plan.context_tokens} context tokens, "
              f"{event.plan.scored_tokens} scored", file=sys.stderr, flush=True)
    elif isinstance(event, ReportProgress):
        f = event.figures
        vs = f" (vs {event.reference})" if event.reference != REFERENCE else ""
        print(f"[{event.scored}] {event.column}{vs}: PPL ratio {f['ppl_ratio']:.4f}, mean KL {f['kld_mean']:.5f}, "
              f"top-1 {f['same_top']:.3f}, {event.cache_bytes:,} B", file=sys.stderr, flush=True)
    elif isinstance(event, ColumnFailed):
        _say(f"column {event.name}: {event.message}")
    elif isinstance(event, RunDone):
        for column in event.record["columns"]:
            if column.get("note"):
                print(f"[note] {column['name']}: {column['note']}", file=sys.stderr, flush=True)


def _write(args, rows: list[dict], record: dict | None) -> None:
    """--json (the record, or the rows with --from) and --csv. Raises OutputError."""
    from ..quality.table import rows_to_csv
    from .outputs import write_text

    if args.json:
        body = record if record is not None else {"kind": "kvlab.report.table", "rows": rows}
        write_text(args.json, json.dumps(body, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.csv:
        write_text(args.csv, rows_to_csv(rows), "--csv")
        print(f"wrote {args.csv}", file=sys.stderr)


def _from_records(args) -> int:
    from ..quality.record import load_record, merge_rows, rows_from_record
    from ..quality.table import format_table
    from .outputs import check_writable

    try:
        check_writable(args.json)
        check_writable(args.csv, "--csv")
        groups = []
        for path in args.records:
            record = load_record(path, path)  # its one-line message names the file
            try:
                groups.append(rows_from_record(record, Path(path).name))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}: {err}") from None
        rows = merge_rows(groups)
        if not rows:
            raise ValueError("no rows: the records hold no columns (give report, Compare or Needle records)")
        print(format_table(rows))
        _write(args, rows, None)
    except ValueError as err:
        _say(str(err))
        return 2
    return 0


def _read_text(args) -> tuple[str, dict]:
    """The text to score and its record info (`--text`'s file, or the shipped one). Raises ValueError for a file
    that is missing, unreadable or not UTF-8, before any model loads."""
    from ..quality.defaults import SHIPPED_TEXT_INFO, shipped_text

    if not args.text:
        return shipped_text(), dict(SHIPPED_TEXT_INFO)
    path = Path(args.text)
    if not path.is_file():
        raise ValueError(f"--text {args.text}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"--text {args.text}: not UTF-8 text (byte {err.start}: {err.reason}); save it as "
                         "UTF-8") from None
    except OSError as err:
        raise ValueError(f"--text {args.text}: {err.strerror or err}") from None
    if not text.strip():
        raise ValueError(f"--text {args.text}: the file is empty")
    return text, {"name": path.name}


def _text_ids(args, loaded):
    text, info = _read_text(args)
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"][:, :args.max_tokens]
    return ids, {**info, "tokens": int(ids.shape[1])}


def _check_flags(args) -> None:
    from ..quality.report import report_columns

    if args.max_tokens < 2 or args.progress_every < 1:
        raise ValueError("--max-tokens must be at least 2 and --progress-every at least 1")
    if args.scored_tokens < 1:
        raise ValueError(f"--scored-tokens must be at least 1, got {args.scored_tokens}")
    if args.context_tokens is None and args.scored_tokens >= args.max_tokens:
        raise ValueError(f"--scored-tokens ({args.scored_tokens}) must be less than --max-tokens "
                         f"({args.max_tokens}): the context needs at least 1 token")
    if args.context_tokens is not None and args.context_tokens < 1:
        raise ValueError(f"--context-tokens must be at least 1, got {args.context_tokens}")
    if args.context_tokens is not None and args.context_tokens + args.scored_tokens > args.max_tokens:
        raise ValueError(f"--context-tokens + --scored-tokens ({args.context_tokens + args.scored_tokens}) is more "
                         f"than --max-tokens ({args.max_tokens})")
    columns = report_columns(args.columns)
    if all(column.strategy is None for column in columns):
        raise ValueError("no column can run: " + "; ".join(f"{c.describe()}: {c.rejected}" for c in columns))
    _read_text(args)


def _report(args, loaded, stop) -> dict:
    """One model's record (the needle grid too with --needle). Raises ValueError for a bad split."""
    from ..protocol import collect
    from ..quality.report import report_columns, run_report

    ids, info = _text_ids(args, loaded)
    record = collect(run_report(loaded, ids, args.columns, scored_tokens=args.scored_tokens,
                                context_tokens=args.context_tokens, stop=stop, progress_every=args.progress_every,
                                text_info=info), _progress).record
    if args.needle and not stop.is_set():
        from ..quality.recall import needle_grid, run_recall

        columns = [(c.describe(), c) for c in report_columns(args.columns) if c.strategy is not None]
        record["needle"] = run_recall(loaded, columns, needle_grid(loaded), stop, _needle_line)
    return record


def _needle_line(event) -> None:
    from ..needle.runner import NeedleCell

    if isinstance(event, NeedleCell):
        r = event.record
        print(f"[needle] {r.strategy}: {r.context_tokens} tokens, depth {r.depth}, seed {r.seed}: "
              f"{'hit' if r.hit else 'miss'}", file=sys.stderr, flush=True)


def run(args) -> int:
    """Run the report (or --from / --leaderboard); see the module docstring for the exit codes."""
    from ..models.loading import ModelLoadError, ModelSpec, load_model
    from ..quality.record import rows_from_record
    from ..quality.table import format_table
    from .outputs import OutputError, StopOnInterrupt, check_writable

    if args.records:
        if args.columns != _default_columns():
            _say("--columns does not apply to --from: the saved records name their columns (leave it out)")
            return 2
        return _from_records(args)
    if args.leaderboard:
        return _leaderboard(args)
    stop = threading.Event()
    try:
        _check_flags(args)
        check_writable(args.json)
        check_writable(args.csv, "--csv")
        loaded = load_model(ModelSpec(args.model, args.dtype, args.device),
                            progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
        with StopOnInterrupt(stop, PROG):
            record = _report(args, loaded, stop)
    except (ModelLoadError, ValueError) as err:
        _say(str(err))
        return 2
    except KeyboardInterrupt:
        _say("interrupted; nothing was written")
        return INTERRUPTED
    rows = rows_from_record(record, args.json or "")
    print(format_table(rows))
    try:
        _write(args, rows, record)
    except OutputError as err:
        _say(str(err))
        return 2
    if stop.is_set():
        _say(f"stopped: kept {min(c['split']['scored_tokens'] for c in record['columns'])} or more scored tokens "
             "per column")
        return INTERRUPTED
    return 0 if any(c["status"] == "ok" for c in record["columns"]) else 1


def _leaderboard(args) -> int:
    """Write the leaderboard folder: one report per bundled model (or `--model`'s)."""
    from ..models.loading import ModelLoadError, ModelSpec, load_model
    from ..quality.defaults import LEADERBOARD_COLUMNS, LEADERBOARD_MODELS
    from ..quality.leaderboard import write_entry
    from .outputs import StopOnInterrupt

    folder = Path(args.leaderboard)
    if folder.exists() and not folder.is_dir():
        _say(f"--leaderboard {folder}: is a file, not a folder")
        return 2
    sources = LEADERBOARD_MODELS if args.model == "bundled" else (args.model,)
    if args.columns == _default_columns():
        args.columns = LEADERBOARD_COLUMNS
    stop = threading.Event()
    try:
        _check_flags(args)
        for source in sources:
            loaded = load_model(ModelSpec(source, args.dtype, args.device),
                                progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
            with StopOnInterrupt(stop, PROG):
                record = _report(args, loaded, stop)
            paths = write_entry(folder, source, record, _command(args))
            print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)
            if stop.is_set():
                return INTERRUPTED
    except (ModelLoadError, ValueError, OSError) as err:
        _say(str(err))
        return 2
    except KeyboardInterrupt:
        _say("interrupted; the models finished before are written")
        return INTERRUPTED
    return 0


def _command(args) -> str:
    """The command line that makes this leaderboard again (the columns when not the leaderboard's)."""
    from ..quality.defaults import LEADERBOARD_COLUMNS

    parts = ["kvlab report --leaderboard", str(args.leaderboard), f"--scored-tokens {args.scored_tokens}",
             f"--max-tokens {args.max_tokens}"]
    if args.context_tokens is not None:
        parts.append(f"--context-tokens {args.context_tokens}")
    if args.columns != LEADERBOARD_COLUMNS:
        parts.append(f"--columns {args.columns}")
    if args.model != "bundled":
        parts.append(f"--model {args.model}")
    return " ".join(parts + (["--needle"] if args.needle else []))


def _default_columns() -> str:
    from ..quality.defaults import DEFAULT_COLUMNS

    return DEFAULT_COLUMNS
