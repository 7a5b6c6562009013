"""`kvlab compare` (or `python -m kvlab compare`): one prompt under several cache strategies, headless.

`compare` runs a preset (or strategies named on the command line) headless,
prints one summary row per column and optionally writes JSON. A column may
carry a cache budget (`dynamic:budget_mib=4`) and `--fallback` names the
chain of smaller caches a budgeted column falls back to (`kvlab.budget`). A column that
cannot run (a bad knob, an error while running) is reported in its row and on
stderr while the others run; the exit status is 2 when the run cannot start
(bad preset or settings, model not found, a folder that cannot be written),
with the reason in one line on stderr, 1 when no column finished, else 0.
"""

from __future__ import annotations

import json
import sys
import threading

from ..compare.summary import (
    FIDELITY_COLUMNS,
    SUMMARY_COLUMNS,
    TEACHER_FORCED,
    format_table,
    run_record,
    summary_rows,
)
from ..generation import encode_prompt
from ..measure import POLICIES
from ..strategies.base import split_strategy_list


def add_parser(sub, parents) -> None:
    """Add the `compare` subcommand; `parents` holds the shared `--model/--dtype/--device` parent."""
    p = sub.add_parser("compare", parents=parents, help="run one prompt under several cache strategies, side by side")
    p.add_argument("--preset", help="preset YAML file (or the name of one in presets/)")
    p.add_argument("--prompt", help="prompt text (overrides the preset's)")
    p.add_argument("--system", help="system prompt for chat models")
    p.add_argument("--plain", action="store_true", help="tokenize the prompt as plain text, without the chat template")
    p.add_argument("--strategies", help="comma list, knobs after colons: dynamic,quantized:backend=hqq:nbits=4; "
                                        "budget_mib=N gives a column a cache budget (dynamic:budget_mib=4)")
    p.add_argument("--fallback", help="fallback chain for budgeted columns that name none, items joined by '>': "
                                      "\"quantized:backend=hqq:nbits=4:residual_length=32>sink:window_length=64\" "
                                      "(default: [offloaded on CUDA >] quantized hqq int4 > sink)")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--no-fidelity", action="store_true", help="skip the teacher-forced fidelity scoring")
    p.add_argument("--timing", choices=list(POLICIES),
                   help="how timing figures are taken (default live: the live run after a warm-up; see docs/timing.md)")
    p.add_argument("--mode", choices=["fair", "parallel", "sequential"])
    p.add_argument("--json", help="write the full record to this file")
    p.add_argument("--replay", metavar="FILE",
                   help="show a record written by --json (or the page's export) again, as it was measured; runs nothing")
    p.set_defaults(func=cmd_compare)


def resolve_compare(args) -> dict:
    """Merge preset and flags into {preset, model spec, settings, columns}.

    Columns named with `--strategies` are parsed one by one: a bad one becomes a rejected column that reports
    its reason in its own row while the others run (as a bad column in the app does); when every one is bad,
    nothing could run and the reasons are raised before any model loads. A preset file's own columns are
    validated with the file.

    Raises PresetError / ValueError with the reason (the caller prints it).
    """
    from ..compare.preset import parse_preset, strategy_columns
    from ..models.loading import ModelSpec

    preset = _base_preset(args)
    data = preset.model_dump()
    _apply_flags(data, args)
    preset = parse_preset(data, preset.name, lenient_columns=bool(args.strategies))
    if args.strategies:  # when nothing could run, say so before the model loads
        columns = strategy_columns(split_strategy_list(args.strategies), args.fallback)
    else:
        columns = preset.build_columns()
    return {"preset": preset, "model": ModelSpec(**preset.model.model_dump()), "settings": preset.settings(),
            "columns": columns}


def _base_preset(args):
    from ..compare.preset import load_preset, strategies_preset

    if args.strategies is not None and not split_strategy_list(args.strategies):
        raise ValueError("--strategies is empty: name at least one, e.g. dynamic,static")
    if args.preset:
        return load_preset(args.preset)
    if args.prompt is None or args.strategies is None:
        raise ValueError("give --preset FILE, or both --prompt and --strategies")
    return strategies_preset(args.prompt, split_strategy_list(args.strategies), "command line")


def _apply_flags(data: dict, args) -> None:
    """Write the command-line flags over a preset's data (in place)."""
    if args.prompt is not None:
        data["prompt"]["text"] = args.prompt
    if args.system is not None:
        data["prompt"]["system"] = args.system
    if args.plain:
        data["prompt"]["chat"] = False
    for flag, key in (("model", "source"), ("dtype", "dtype"), ("device", "device")):
        if getattr(args, flag):
            data["model"][key] = getattr(args, flag)
    generation = data["generation"]
    for flag in ("max_new_tokens", "temperature", "top_p", "top_k", "seed"):
        if getattr(args, flag) is not None:
            generation[flag] = getattr(args, flag)
    if args.sample:
        generation["do_sample"] = True
    if args.ignore_eos:
        generation["stop_at_eos"] = False
    if args.no_fidelity:
        generation["fidelity"] = False
    if args.timing:
        generation["timing_policy"] = args.timing
    if args.mode:
        data["mode"] = args.mode
    if args.fallback:
        for column in data["columns"]:
            if "budget_mib" in column and "fallback" not in column:
                column["fallback"] = args.fallback


def cmd_replay(args) -> int:
    """Print a recorded run's label and summary table; 2 when the file cannot be replayed."""
    from ..compare.replay import RecordError, load_record

    others = [flag for flag in ("preset", "prompt", "strategies", "model") if getattr(args, flag)]
    try:
        if others:
            raise RecordError(f"--replay shows a recorded run and takes no --{others[0].replace('_', '-')}")
        replayed = load_record(args.replay)
    except RecordError as err:
        print(f"kvlab compare: {err}", file=sys.stderr)
        return 2
    print(replayed.label)
    print(format_table(summary_rows(replayed.done.results)))
    return 0


def summary_first(events, out=None):
    """Pass a run's events through, printing the summary table to `out` (stdout) as soon as every column
    finished (`SummaryReady`), before the fidelity pass; without the teacher-forced columns when that pass
    follows (`fidelity_table` prints them after it)."""
    from ..compare.events import SummaryReady

    for event in events:
        if isinstance(event, SummaryReady):
            keys = [k for k in SUMMARY_COLUMNS if k not in TEACHER_FORCED] if event.to_score else None
            print(format_table(summary_rows(event.results), keys), file=out or sys.stdout, flush=True)
        yield event


def fidelity_table(done) -> str | None:
    """After the fidelity pass: each column's agreement, first divergence, top-1 agreement, KL and whether it
    was scored; None when the pass scored nothing."""
    if not (done.record.get("fidelity") or {}).get("to_score"):
        return None
    rows = [row for row in summary_rows(done.results) if row["fidelity_status"]]
    return "fidelity against the baseline (teacher-forced):\n" + format_table(rows, FIDELITY_COLUMNS)


def progress(events, out=None):
    """Pass a run's events through, writing one progress line per column start and end, per phase and per
    scored column to `out` (stderr): `[column 2] quantized hqq int4: done, 64 tokens`,
    `[fidelity] 2 of 5 columns scored: quantized quanto int4, top-1 96.9%, KL 0.0123`. Tables go to stdout."""
    from ..compare.events import ColumnDone, ColumnStarted, FidelityScored, RunPhase, SummaryReady
    from ..protocol import ColumnFailed

    out = out or sys.stderr
    for event in events:
        line = None
        if isinstance(event, ColumnStarted):
            line = f"[column {event.column + 1}] {event.name}: running" + (f" ({event.note})" if event.note else "")
        elif isinstance(event, ColumnDone):
            line = f"[column {event.column + 1}] {event.result.name}: done, {len(event.result.token_ids)} tokens"
        elif isinstance(event, ColumnFailed):
            line = f"[column {event.column + 1}] {event.name}: {event.status}: {event.message}"
        elif isinstance(event, RunPhase):
            line = f"[run] {event.phase.replace('_', ' ')}" + (f": {event.detail}" if event.detail else "")
        elif isinstance(event, SummaryReady):
            line = f"[run] summary ready after {event.wall_s:.1f} s" + (
                f"; fidelity: scoring {event.to_score} columns" if event.to_score else "")
        elif isinstance(event, FidelityScored):
            line = f"[fidelity] {event.scored} of {event.to_score} columns scored: {_scored(event.result)}"
        if line:
            print(line, file=out, flush=True)
        yield event


def _scored(result) -> str:
    """`quantized quanto int4, top-1 96.9%, KL 0.0123` (or the reason it was not scored)."""
    if result.fidelity_status != "scored":
        return f"{result.name}, {result.fidelity_status}"
    return f"{result.name}, top-1 {100 * result.top1_agreement:.1f}%, KL {result.mean_kl:.4f}"


def cmd_compare(args) -> int:
    """Run the comparison; 2 when it cannot start (the --json path is checked before the model loads), 130
    when interrupted (the first Ctrl-C keeps the partial record; before a record exists one line says nothing
    was written), else 0 or 1 (see above)."""
    from ..compare.runner import run_preset
    from ..models.loading import ModelLoadError, load_model
    from ..protocol import collect
    from ..recurrent.runner import run_recurrent_preset
    from .outputs import StopOnInterrupt, check_writable, write_outputs

    if args.replay:
        return cmd_replay(args)
    try:
        plan = resolve_compare(args)
        check_writable(args.json)
    except ValueError as err:
        print(f"kvlab compare: {err}", file=sys.stderr)
        return 2
    preset, stop = plan["preset"], threading.Event()
    try:
        loaded = load_model(plan["model"], progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
        runner = run_recurrent_preset if loaded.is_recurrent else run_preset  # a recurrent model's own runner
        events = runner(loaded, preset, stop, plan["columns"])
        with StopOnInterrupt(stop, "kvlab compare"):
            done = collect(summary_first(progress(events)))
    except (ModelLoadError, ValueError) as err:
        print(f"kvlab compare: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvlab compare: interrupted; nothing was written", file=sys.stderr)
        return 130
    record = done.record
    if record["summary_s"] is None:  # the run ended before its summary: show what there is
        print(format_table(summary_rows(done.results)))
    scored = fidelity_table(done)
    if scored:
        print(scored)
    if record["timing"].get("note"):
        print(f"kvlab compare: {record['timing']['note']}", file=sys.stderr)
    for result in done.results:
        if result.warning:
            print(f"kvlab compare: column {result.index + 1} ({result.name}): {result.warning}", file=sys.stderr)
        if result.status == "error":
            print(f"kvlab compare: column {result.index + 1} ({result.name}): {result.message}", file=sys.stderr)
    if write_outputs("kvlab compare", [(args.json, "--json", lambda: json.dumps(record, indent=1))],
                     " (stopped: a partial record)" if done.stopped else ""):
        return 2
    if done.stopped:
        return 130
    return 0 if any(result.status == "ok" for result in done.results) else 1

