"""`python -m kvlab plan`: the exact KV-cache memory of a model at several contexts, without its weights.

Prints one row per strategy and context (cache, weights and total GiB, whether it
fits the budget, the longest context that does), then each strategy's explanation
and notes; `--json FILE` writes the full plan. Bad input (a context or batch below
1, an unknown model or strategy, a folder without config.json) prints the reason on
stderr and exits with status 2; a strategy the model cannot use is reported in its
rows. `--list-models` prints the catalog's hub ids.
"""

from __future__ import annotations

import json
import sys

DEFAULT_CONTEXTS = "1024,32768,131072"


def add_parser(sub, parents) -> None:
    """Add the `plan` subcommand. It loads no weights and has no device, so it declares its own `--model`
    (catalog ids too) and `--dtype` instead of taking the shared parent in `parents`."""
    p = sub.add_parser("plan", help="plan the exact KV-cache bytes of any model at any context, without its weights")
    p.add_argument("--model", default="bundled", help="'bundled', 'bundled:gemma-3-270m', a catalog hub id (see "
                   "--list-models), a folder with config.json, or a hub id (where the hub is reachable)")
    p.add_argument("--context", default=DEFAULT_CONTEXTS, help=f"comma list of context lengths in tokens, "
                   f"k = 1024 as the Plan tab reads them: 1k,32k,128k (default {DEFAULT_CONTEXTS})")
    p.add_argument("--batch", default="1", help="sequences in the batch (default 1)")
    p.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | float16 (default bfloat16)")
    p.add_argument("--strategies", default="dynamic",
                   help="comma list as Compare takes it: dynamic,quantized:backend=quanto:nbits=4,sink:window_length=1024")
    p.add_argument("--budget-gib", help="accelerator memory for weights + cache, GiB (2^30 bytes); activations and "
                   "framework overhead are not counted")
    p.add_argument("--prefill", help="prompt tokens (k = 1024) prefilled in one forward; the rest of each context is decoded "
                   "one token at a time (default: the whole context is the prompt)")
    p.add_argument("--json", help="write the full plan to this file")
    p.add_argument("--list-models", action="store_true", help="print the catalog's hub ids and exit")
    p.set_defaults(func=cmd_plan)


def _integers(text: str, name: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be whole numbers separated by commas, got {text!r}") from None
    if not values:
        raise ValueError(f"--{name} is empty: give at least one number")
    return values


def _token_counts(text: str, flag: str) -> tuple[int, ...]:
    """Token counts as the Plan tab reads them (`1k, 32k`; `kvlab.plan.token_counts`); ValueError names `flag`."""
    from ..plan.token_counts import parse_token_counts

    try:
        return parse_token_counts(text)
    except ValueError as err:
        raise ValueError(f"{flag}: {err}") from None


def build_request(args):
    """The `PlanRequest` of the parsed arguments. Raises ValueError with the reason (bad numbers or strategies)."""
    from ..plan.budget_input import budget_bytes
    from ..plan.planner import PlanRequest
    from ..strategies.base import parse_strategy_list

    budget = None
    if args.budget_gib is not None:
        budget = budget_bytes(args.budget_gib, "--budget-gib")
    specs = parse_strategy_list(args.strategies)
    if not specs:
        raise ValueError("--strategies is empty: name at least one, e.g. dynamic")
    return PlanRequest(
        model=args.model, contexts=_token_counts(args.context, "--context"),
        batch=_integers(args.batch, "batch")[0], dtype=args.dtype, strategies=tuple(specs), budget_bytes=budget,
        prefill_tokens=None if args.prefill is None else _token_counts(args.prefill, "--prefill")[0])


def format_plan(result) -> str:
    """The plan as a text table plus one explanation (and notes) per strategy."""
    from ..plan.planner import gib

    rows = []
    for strategy in result.strategies:
        for cell in strategy.cells:
            bound = "unbounded" if strategy.max_context_unbounded else strategy.max_context_in_budget
            rows.append({
                "strategy": strategy.name, "context": f"{cell.context:,}",
                "cache GiB": "-" if cell.cache_bytes is None else f"{gib(cell.cache_bytes):.4f}",
                "weights GiB": f"{gib(cell.weights_bytes):.2f}",
                "total GiB": "-" if cell.total_bytes is None else f"{gib(cell.total_bytes):.2f}",
                "fits": "-" if cell.fits is None else ("yes" if cell.fits else "no"),
                "max context": "-" if bound is None else (f"{bound:,}" if isinstance(bound, int) else bound),
                "status": cell.error or strategy.status,
            })
    model = result.model
    lines = [f"{model['name']} ({model['origin']}, {model['model_class']}): {model['layers']} layers "
             f"{model['layer_groups']}, {model['parameters']:,} parameters", _table(rows), ""]
    for strategy in result.strategies:
        lines.append(f"- {strategy.explanation}")
        lines.extend(f"  note: {note}" for note in strategy.notes)
    lines.extend(f"model note: {note}" for note in model["notes"])
    return "\n".join(lines)


def _table(rows: list[dict]) -> str:
    """Rows (dicts with the same keys) as aligned plain text; the last column is left as is."""
    if not rows:
        return ""
    keys = list(rows[0])
    widths = {key: max(len(key), *(len(str(row[key])) for row in rows)) for key in keys[:-1]}
    lines = ["  ".join([key.rjust(widths[key]) for key in keys[:-1]] + [keys[-1]])]
    lines += ["  ".join([str(row[key]).rjust(widths[key]) for key in keys[:-1]] + [str(row[keys[-1]])])
              for row in rows]
    return "\n".join(lines)


def cmd_plan(args) -> int:
    from ..plan.catalog import ConfigError, known_models
    from ..plan.planner import PlanError, plan
    from .outputs import check_writable, write_outputs

    if args.list_models:
        try:
            print("\n".join(known_models()))
        except ConfigError as err:
            print(f"kvlab plan: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        check_writable(args.json)
        result = plan(build_request(args))
    except (PlanError, ValueError) as err:
        print(f"kvlab plan: {err}", file=sys.stderr)
        return 2
    print(format_plan(result))
    return write_outputs("kvlab plan", [(args.json, "--json", lambda: json.dumps(result.to_json(), indent=1))])
