"""`python -m kvlab perplexity`: stream a long text through dense, window and sink
caches (and the model's own sliding window where it has one) and report the
per-token NLL, perplexity per segment and cache bytes, as in StreamingLLM's
central figure (Xiao et al. 2023, arXiv:2309.17453)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from .perplexity import DEFAULT_MAX_TOKENS, STRATEGY_NAMES, cache_makers, default_text, ppl_by_segment, stream_many


def add_parser(sub) -> None:
    p = sub.add_parser("perplexity", help="long-text perplexity under dense, window and sink caches")
    p.add_argument("--text", help="UTF-8 text file (default: Python's own help topics, pydoc_data.topics)")
    p.add_argument("--strategies", default="dense,window,sink", help=f"comma list of {', '.join(STRATEGY_NAMES)}")
    p.add_argument("--window", type=int, default=256, help="window_length of the window and sink caches (tokens)")
    p.add_argument("--sinks", type=int, default=4, help="num_sink_tokens of the sink cache")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens of the text to stream")
    p.add_argument("--segment", type=int, help="tokens per perplexity segment (default: the window)")
    p.add_argument("--model", default="bundled")
    p.add_argument("--json", help="write nll, ppl_by_segment and cache_bytes per strategy here")
    p.set_defaults(func=cmd_perplexity)


def cmd_perplexity(args) -> int:
    from .models import ModelLoadError, ModelSpec, load_model

    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    segment = args.window if args.segment is None else args.segment
    try:
        if not names:
            raise ValueError(f"--strategies is empty; pick from {', '.join(STRATEGY_NAMES)}")
        if segment < 1:
            raise ValueError(f"--segment must be at least 1 token, got {segment}")
        text = Path(args.text).read_text(encoding="utf-8") if args.text else default_text()
        if args.max_tokens < 2:
            raise ValueError(f"--max-tokens must be at least 2, got {args.max_tokens}")
        loaded = load_model(ModelSpec(source=args.model))
        ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"][:, :args.max_tokens]
        if ids.shape[1] < 2:
            raise ValueError("the text has fewer than 2 tokens")
        makers = cache_makers(loaded, names, args.window, args.sinks)
    except (OSError, ValueError, ModelLoadError) as err:
        print(f"kvlab perplexity: {err}", file=sys.stderr)
        return 2
    results = {name: {"nll": [], "cache_bytes": []} for name in makers}
    for name, _, nll, size in stream_many(loaded.model, ids, makers):
        results[name]["nll"].append(nll)
        results[name]["cache_bytes"].append(size)
    print(f"{ids.shape[1]} tokens, window {args.window}, sinks {args.sinks}; perplexity per {segment}-token segment")
    for name, data in results.items():
        data["ppl_by_segment"] = ppl_by_segment(data["nll"], segment)
        late = data["nll"][2 * args.window:]
        data["late_ppl"] = math.exp(sum(late) / len(late)) if late else None
        data["peak_cache_bytes"] = max(data["cache_bytes"], default=0)
        print(f"{name:>14}: " + " ".join(f"{s['ppl']:.1f}" for s in data["ppl_by_segment"])
              + (f" | after 2x window: {data['late_ppl']:.2f}" if late else "")
              + f" | peak cache {data['peak_cache_bytes']:,} B")
    if args.json:
        record = {"model": loaded.info(), "tokens": ids.shape[1], "window": args.window, "sinks": args.sinks,
                  "segment": segment, "strategies": results}
        Path(args.json).write_text(json.dumps(record))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
