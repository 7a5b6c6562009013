"""`python -m kvlab perplexity`: stream a long text through several caches (by default dynamic, window
attention and attention sinks) and report the per-token NLL, perplexity per segment and cache bytes, as in
StreamingLLM's central figure (Xiao et al. 2023, arXiv:2309.17453). Strategies are named and configured
exactly as in `compare --strategies`; the work is `kvlab.quality.perplexity.run_perplexity`'s (the quality
report with a one-token context and its per-token curve)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..quality.perplexity import DEFAULT_SINKS, DEFAULT_STRATEGIES, DEFAULT_WINDOW, perplexity_columns, ppl_by_segment
from ..quality.report import DEFAULT_MAX_TOKENS
from .common import WEIGHTS_DEFAULTS, model_defaults


def add_parser(sub, parents) -> None:
    """Add the `perplexity` subcommand; `parents` holds the shared `--model/--dtype/--device` parent."""
    p = sub.add_parser("perplexity", parents=parents, help="long-text perplexity under several caches (StreamingLLM's figure)")
    p.add_argument("--text", help="UTF-8 text file (default: the report's shipped text, five of Python's help topics)")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                   help=f"comma list, knobs after colons, as in compare (default {DEFAULT_STRATEGIES}: dense, "
                        "window attention, attention sinks); any strategy that keeps a cache")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help="window_length of sink columns that do not set it (tokens)")
    p.add_argument("--sinks", type=int, default=DEFAULT_SINKS,
                   help="num_sink_tokens of sink columns that do not set it")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens of the text to stream")
    p.add_argument("--segment", type=int, help="tokens per perplexity segment (default: the window)")
    p.add_argument("--json", help="write nll, ppl_by_segment and cache_bytes per strategy here")
    model_defaults(p, WEIGHTS_DEFAULTS)
    p.set_defaults(func=cmd_perplexity)


def _prepare(args):
    """(loaded model, ids, columns, segment). Raises OSError, ValueError or ModelLoadError."""
    from ..models.loading import ModelSpec, load_model
    from ..quality.defaults import shipped_text
    from ..quality.perplexity import refusals
    from ..strategies import StrategyError
    from .outputs import check_writable

    segment = args.window if args.segment is None else args.segment
    if segment < 1:
        raise ValueError(f"--segment must be at least 1 token, got {segment}")
    if args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    columns = perplexity_columns(args.strategies, args.window, args.sinks)
    check_writable(args.json)
    text = Path(args.text).read_text(encoding="utf-8") if args.text else shipped_text()
    loaded = load_model(ModelSpec(args.model, args.dtype, args.device),
                        progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
    ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"][:, :args.max_tokens]
    if ids.shape[1] < 2:
        raise ValueError("the text has fewer than 2 tokens")
    refused = refusals(loaded, columns, ids.shape[1])
    if refused:
        label, reason = next(iter(refused.items()))
        raise StrategyError(f"{label}: {reason}")
    return loaded, ids, columns, segment


def cmd_perplexity(args) -> int:
    """Stream the text; 2 when it cannot start, 130 after a Ctrl-C (the first one stops the stream and keeps
    the tokens scored so far, printed and written as usual with `stopped: true`), 1 when a cache failed (its
    reason on stderr; the run stops there, what was scored is kept the same way), else 0."""
    import threading

    from ..models.loading import ModelLoadError
    from ..protocol import collect
    from ..quality.perplexity import run_perplexity
    from .outputs import StopOnInterrupt, write_outputs

    try:
        loaded, ids, columns, segment = _prepare(args)
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"kvlab perplexity: {err}", file=sys.stderr)
        return 2
    results = {c.describe(): {"strategy": c.strategy.name, "knobs": c.strategy.knobs(), "nll": [], "cache_bytes": []}
               for c in columns}
    stop, failed = threading.Event(), []
    print(f"[run] streaming {ids.shape[1]} tokens through {len(columns)} caches", file=sys.stderr, flush=True)
    with StopOnInterrupt(stop, "kvlab perplexity"):
        collect(run_perplexity(loaded, ids, columns, stop), lambda event: _follow(event, results, stop, failed))
    _print_results(results, ids.shape[1], segment, args.window)
    record = {"model": loaded.info(), "tokens": ids.shape[1], "window": args.window, "sinks": args.sinks,
              "segment": segment, "strategies": results, "stopped": stop.is_set()}
    if write_outputs("kvlab perplexity", [(args.json, "--json", lambda: json.dumps(record))]):
        return 2
    if failed:
        return 1
    if stop.is_set():
        scored = min(len(data["nll"]) for data in results.values())
        print(f"kvlab perplexity: stopped after {scored} of {ids.shape[1] - 1} scored tokens; they are kept",
              file=sys.stderr)
        return 130
    return 0


def _follow(event, results: dict, stop, failed: list) -> None:
    """One event of the run into `results` (label -> its curves); a cache that fails ends the run, its reason
    on stderr and in `failed`."""
    from ..protocol import ColumnFailed
    from ..quality.report import TokenScored

    if isinstance(event, TokenScored):
        data = results[list(results)[event.column]]
        data["nll"].append(event.nll)
        data["cache_bytes"].append(event.cache_bytes)
    elif isinstance(event, ColumnFailed):
        print(f"kvlab perplexity: {event.name}: {event.message}", file=sys.stderr)
        failed.append(event.message)
        stop.set()


def _print_results(results: dict, tokens: int, segment: int, window: int) -> None:
    """Fill in each strategy's segments, late perplexity and peak bytes (in place) and print one line each."""
    print(f"{tokens} tokens; perplexity per {segment}-token segment")
    for label, data in results.items():
        data["ppl_by_segment"] = ppl_by_segment(data["nll"], segment)
        late = data["nll"][2 * window:]
        data["late_ppl"] = math.exp(sum(late) / len(late)) if late else None
        data["peak_cache_bytes"] = max(data["cache_bytes"], default=0)
        print(f"{label:>24}: " + " ".join(f"{s['ppl']:.1f}" for s in data["ppl_by_segment"])
              + (f" | after 2x window: {data['late_ppl']:.2f}" if late else "")
              + f" | peak cache {data['peak_cache_bytes']:,} B")
