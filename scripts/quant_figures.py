"""The figures of kvlab's KV-quantization note, measured on the bundled models (CPU, float32).

`kl`: teacher-forced mean KL(dense || column) of quantized caches on the bundled SmolLM2-135M, the text being
kvlab's default (Python's help topics): a `--prefill`-token prompt in one forward, then `--tokens` tokens fed one at
a time through each column's cache (so residuals fill and flush as in decoding), every next-token distribution
scored against the dense cache's with `kvlab.quality.stats` (llama.cpp's `--kl-divergence` figures). Prints
each column's mean KL, its standard error, top-1 agreement and its cache bytes after the last token.

`gemma`: cache bytes of quantized caches on the bundled Gemma 3 270M after one `--prompt-tokens` prefill, against
dynamic's, measured and as Plan predicts them.

    python scripts/quant_figures.py kl --strategies "quantized:backend=quanto:nbits=4,rotation_quantized"
    python scripts/quant_figures.py gemma --prompt-tokens 4000

Prints one line per column; not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from kvlab.accounting import cache_bytes, cache_bytes_by_layer_type
from kvlab.accounting import layer_types_and_windows
from kvlab.models.loading import ModelSpec, load_model
from kvlab.quality.stats import quality_figures, score_tokens
from kvlab.strategies import make_strategy
from kvlab.strategies.base import parse_strategy_list

KL_DEFAULT = ("quantized:backend=quanto:nbits=4,rotation_quantized,quantized:backend=quanto:nbits=2,"
              "rotation_quantized:key_bits=4:value_bits=2")


def measured_text() -> str:
    """The text docs/strategies.md's figures were measured on: every one of Python's help topics
    (`pydoc_data.topics`), joined."""
    from pydoc_data.topics import topics

    return "\n".join(topics.values())


def text_ids(loaded, count: int) -> torch.Tensor:
    ids = loaded.tokenizer(measured_text(), return_tensors="pt")["input_ids"][:, :count]
    if ids.shape[1] < count:
        raise SystemExit(f"the text has only {ids.shape[1]} tokens")
    return ids.to(loaded.device)


def teacher_forced(loaded, strategy, ids: torch.Tensor, prefill: int) -> tuple[torch.Tensor, int]:
    """(logits (T, vocab) predicting ids[prefill:], cache bytes after the last token fed)."""
    cache = strategy.build_cache(loaded, ids.shape[1])
    rows = []
    with torch.inference_mode():
        rows.append(strategy.forward(loaded, cache, ids[:, :prefill], prefill)[0].float())
        for end in range(prefill + 1, ids.shape[1]):
            rows.append(strategy.forward(loaded, cache, ids[:, :end], 1)[0].float())
    return torch.stack(rows), cache_bytes(cache)


def run_kl(args) -> None:
    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.prefill + args.tokens)
    targets = ids[0, args.prefill:]
    started = time.perf_counter()
    base, base_bytes = teacher_forced(loaded, make_strategy({"strategy": "dynamic"}), ids, args.prefill)
    print(f"dynamic: {base_bytes:,} B ({time.perf_counter() - started:.0f} s)", flush=True)
    results = []
    for spec in parse_strategy_list(args.strategies):
        strategy = make_strategy(spec)
        started = time.perf_counter()
        logits, size = teacher_forced(loaded, strategy, ids, args.prefill)
        figures = quality_figures(*score_tokens(base, logits, targets))
        row = {"column": strategy.describe(), "cache_bytes": size, "bytes_vs_dynamic": size / base_bytes,
               "mean_kl": figures.kld_mean, "mean_kl_unc": figures.kld_mean_unc, "same_top": figures.same_top,
               "ppl_ratio": figures.ppl_ratio, "tokens": figures.n_tokens}
        results.append(row)
        print(f"{row['column']}: mean KL {row['mean_kl']:.5f} ± {row['mean_kl_unc']:.5f} nats, same top "
              f"{row['same_top']:.4f}, PPL ratio {row['ppl_ratio']:.4f}, {size:,} B "
              f"({row['bytes_vs_dynamic']:.3f} of dynamic) over {row['tokens']} tokens "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"model": args.model, "prefill": args.prefill, "tokens": args.tokens,
                       "dynamic_bytes": base_bytes, "columns": results}, handle, indent=2)


def run_gemma(args) -> None:
    from kvlab.plan.planner import PlanRequest, plan

    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.prompt_tokens)
    types = layer_types_and_windows(loaded.config)[0]
    specs = [{"strategy": "dynamic"}, *parse_strategy_list(args.strategies)]
    planned = plan(PlanRequest(model=args.model, contexts=(args.prompt_tokens, args.plan_tokens), dtype="float32",
                               strategies=tuple(specs)))
    dense = None
    for spec, predicted in zip(specs, planned.strategies):
        strategy = make_strategy(spec)
        cache = strategy.build_cache(loaded, args.prompt_tokens)
        with torch.inference_mode():
            strategy.forward(loaded, cache, ids, args.prompt_tokens)
        size = cache_bytes(cache)
        dense = dense or size
        plan_now, plan_far = (cell.cache_bytes for cell in predicted.cells)
        dense_far = planned.strategies[0].cells[1].cache_bytes
        print(f"{strategy.describe()}: {size:,} B after {args.prompt_tokens} tokens ({size / dense:.4f} of dynamic; "
              f"by layer type {cache_bytes_by_layer_type(cache, types)}); Plan {plan_now:,} B "
              f"({'equal' if plan_now == size else 'DIFFERS'}), at {args.plan_tokens:,} tokens {plan_far:,} B "
              f"({plan_far / dense_far:.4f} of dynamic)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    kl = sub.add_parser("kl")
    kl.add_argument("--model", default="bundled")
    kl.add_argument("--strategies", default=KL_DEFAULT)
    kl.add_argument("--prefill", type=int, default=64)
    kl.add_argument("--tokens", type=int, default=1000)
    kl.add_argument("--json")
    gemma = sub.add_parser("gemma")
    gemma.add_argument("--model", default="bundled:gemma-3-270m")
    gemma.add_argument("--strategies", default="quantized:backend=quanto:nbits=4,rotation_quantized,"
                                               "rotation_quantized:key_bits=4:value_bits=2,quantized:backend=fp8")
    gemma.add_argument("--prompt-tokens", type=int, default=4000)
    gemma.add_argument("--plan-tokens", type=int, default=32768)
    args = parser.parse_args(argv)
    {"kl": run_kl, "gemma": run_gemma}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
