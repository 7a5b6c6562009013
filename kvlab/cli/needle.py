"""`kvlab needle`: passkey retrieval per cache strategy on a grid of lengths x depths x seeds, headless.

Prints one progress line per cell on stderr, then each column's grid of hits (depth x length) and the summary
on stdout; `--json` / `--csv` write the record (`kvlab.needle.record`). Bad input (a preset that fails its
schema, an empty grid, more cells than the cap, an unknown model) exits 2 with one line on stderr; a value
left out of the grid or a column that cannot run is reported on stderr while the rest runs; exit 1 when no
cell finished. Registration: `add_parser(subparsers, parents)` and `run(args)`.
"""

from __future__ import annotations

import functools
import json
import sys
import threading

PROG = "kvlab needle"
DEFAULT_PRESET = "needle_passkey"


def add_parser(sub, parents) -> None:
    """Add the `needle` subcommand; `parents` holds the shared `--model/--dtype/--device` parent (the preset's
    model where a flag is not given)."""
    p = sub.add_parser("needle", parents=list(parents),
                       help="passkey retrieval per cache strategy over context lengths x needle depths")
    p.add_argument("--preset", help=f"needle preset YAML file or name in presets/ (default {DEFAULT_PRESET})")
    p.add_argument("--strategies", help="comma list, knobs after colons, as in compare (overrides the preset's)")
    p.add_argument("--lengths", help="context lengths in tokens, e.g. 512,1k,2k (overrides the preset's)")
    p.add_argument("--depths", help="needle depths in [0, 1], e.g. 0,0.5,1 (overrides the preset's)")
    p.add_argument("--seeds", help="seeds (each a different key and filler offset), e.g. 0,1,2")
    p.add_argument("--new-tokens", type=int, help="greedy tokens per answer")
    p.add_argument("--json", help="write the record (every cell, its prompt, answer and scores) here")
    p.add_argument("--csv", help="write one CSV row per cell here")
    p.set_defaults(func=run)


def _plan(args):
    """(preset, column specs, grid values) from the preset and the flags. Raises PresetError / ValueError."""
    from ..columns import Column
    from ..needle.preset import load_needle_preset
    from ..strategies.base import split_strategy_list

    preset = load_needle_preset(args.preset or DEFAULT_PRESET)
    specs = preset.columns
    if args.strategies is not None:
        items = split_strategy_list(args.strategies)
        if not items:
            raise ValueError("--strategies is empty: name at least one, e.g. dynamic,sink:window_length=128")
        specs = [Column.from_text(item) for item in items]
    grid = preset.grid
    values = {"lengths": args.lengths or grid.lengths, "depths": args.depths or grid.depths,
              "seeds": args.seeds or grid.seeds,
              "new_tokens": args.new_tokens if args.new_tokens is not None else grid.new_tokens}
    return preset, specs, values


def hits_table(record: dict) -> str:
    """Each column's hits per (depth, length) over its seeds, `g` marking cells the dense gate left out."""
    grid = record["grid"]
    lines = []
    for index, column in enumerate(record["columns"]):
        cells = [c for c in record["cells"] if c["column"] == index and c["status"] == "ok"]
        lines.append(f"{column['name']}" + (f"  ({column['message']})" if column["message"] else ""))
        lines.append("  depth \\ tokens " + " ".join(f"{n:>7}" for n in grid["lengths"]))
        for depth in grid["depths"]:
            row = []
            for length in grid["lengths"]:
                mine = [c for c in cells if c["target_tokens"] == length and c["depth"] == depth]
                hits = sum(1 for c in mine if c["hit"])
                gated = any(c["gated"] for c in mine)
                row.append(f"{hits}/{len(mine)}{'g' if gated else ' '}" if mine else "-")
            lines.append(f"  {depth:>14} " + " ".join(f"{cell:>7}" for cell in row))
    return "\n".join(lines)



def _line(event) -> None:
    """Print a needle event's line on stderr: the grid's problems when it starts, each cell, each column that
    cannot run."""
    from ..needle.runner import NeedleCell
    from ..protocol import ColumnFailed, RunStarted

    if isinstance(event, RunStarted):
        for problem in event.plan.problems:
            print(f"{PROG}: {problem}", file=sys.stderr)
    elif isinstance(event, NeedleCell):
        r = event.record
        print(f"[cell] {r.strategy}: {r.context_tokens} tokens, depth {r.depth}, seed {r.seed}: "
              f"{'hit' if r.hit else 'miss'} {r.answer_text!r}", file=sys.stderr, flush=True)
    elif isinstance(event, ColumnFailed):
        print(f"{PROG}: column {event.column + 1} ({event.name}): {event.status}: {event.message}", file=sys.stderr)

def run(args) -> int:
    from ..models.loading import ModelLoadError, ModelSpec, load_model
    from ..needle.grid import GridError, parse_grid
    from ..needle.prompt import key_tokens, min_context_tokens
    from ..needle.record import format_summary, records_to_csv
    from ..needle.runner import max_positions, run_needle
    from ..presets import PresetError
    from ..protocol import collect
    from .outputs import StopOnInterrupt, check_writable, write_outputs

    stop = threading.Event()
    try:
        preset, specs, values = _plan(args)
        check_writable(args.json)
        check_writable(args.csv, "--csv")
        model = preset.model.model_dump()
        for flag, key in (("model", "source"), ("dtype", "dtype"), ("device", "device")):
            model[key] = getattr(args, flag, None) or model[key]
        loaded = load_model(ModelSpec(**model),
                            progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
        grid = parse_grid(values["lengths"], values["depths"], values["seeds"], values["new_tokens"],
                          max_positions=max_positions(loaded), min_tokens=min_context_tokens(loaded.tokenizer),
                          key_tokens=functools.partial(key_tokens, loaded.tokenizer))
        with StopOnInterrupt(stop, PROG):
            done = collect(run_needle(loaded, specs, grid, stop), _line)
    except (PresetError, GridError, ModelLoadError, ValueError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was written", file=sys.stderr)
        return 130
    print(hits_table(done.record))
    print()
    print(format_summary(done.record["summary"]))
    print(f"wall time {done.wall_s:.1f} s for {len(grid.cells)} cells x {len(specs)} columns"
          + (" (stopped: the finished cells are kept)" if done.stopped else ""), file=sys.stderr)
    if write_outputs(PROG, [(args.json, "--json", lambda: json.dumps(done.record, indent=1)),
                            (args.csv, "--csv", lambda: records_to_csv(done.results))]):
        return 2
    if done.stopped:
        return 130
    return 0 if any(r.status == "ok" for r in done.results) else 1
