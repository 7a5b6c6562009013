"""The agreement table of docs/engines.md: one KV format judged in both engines, from `kvlab report` records.

`table RECORD...`: per record (a report with `engine:llamacpp` q8_0 / q4_0 columns scored against llama.cpp's own
f16 run and `llamacpp_quantized` columns of the same types scored against kvlab's dense run), one Markdown row per
format: both engines' mean KL and top-1, the KL ratio (kvlab / llama.cpp) and whether the issue's bar holds (KL
ratio within x0.8-1.25, top-1 within 2 points).

`floor --model M`: the engines' dense runs against each other on the same split: kvlab's dense `dynamic`
(`kvlab.engine.teacher_force`) and llama.cpp's f16 cache (`kvlab.engines.llamacpp.LlamaCppScorer`), the context in
one forward / eval, then one token per step; mean KL(kvlab dense || llama.cpp f16) and top-1 agreement over the
scored tokens (kvlab.quality.stats). This is the floor under which neither engine's KV-format figure can be
compared with the other's.

    python scripts/engine_agreement.py table records/engines/smollm2.json records/engines/gemma-3-270m.json
    python scripts/engine_agreement.py floor --model bundled --context-tokens 1024 --scored-tokens 1024

Prints; not part of the test suite (tests/slow/test_report_engines_agreement.py runs the same functions).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KL_BAR = (0.8, 1.25)
TOP1_BAR = 0.02
FORMATS = ("q8_0", "q4_0")


def agreement(record: dict) -> dict:
    """{format: (kvlab KL, kvlab top-1, llama.cpp KL, llama.cpp top-1)} from a report record's columns."""
    found: dict = {}
    for column in record["columns"]:
        spec, figures = column.get("spec") or {}, column.get("figures") or {}
        kind = spec.get("type_k")
        if kind not in FORMATS or spec.get("type_v") != kind or figures.get("kld_mean") is None:
            continue
        side = {"engine:llamacpp": 1, "llamacpp_quantized": 0}.get(spec.get("strategy"))
        if side is not None:
            found.setdefault(kind, [None] * 4)[2 * side:2 * side + 2] = [figures["kld_mean"], figures["same_top"]]
    return {kind: tuple(values) for kind, values in found.items()}


def holds(ours_kl: float, ours_top: float, theirs_kl: float, theirs_top: float) -> bool:
    """The issue's bar: kvlab's mean KL within x0.8-1.25 of llama.cpp's, top-1 within 2 points."""
    return KL_BAR[0] <= ours_kl / theirs_kl <= KL_BAR[1] and abs(ours_top - theirs_top) <= TOP1_BAR


def table(records: list[dict]) -> str:
    lines = ["| model | format | kvlab mean KL (vs dense) | llama.cpp mean KL (vs f16) | KL ratio | kvlab top-1 | "
             "llama.cpp top-1 | bar |", "|---|---|---|---|---|---|---|---|"]
    for record in records:
        for kind, (ours_kl, ours_top, theirs_kl, theirs_top) in sorted(agreement(record).items()):
            if None in (ours_kl, theirs_kl):
                continue
            lines.append(f"| {record['model']['name']} | {kind} | {ours_kl:.5f} | {theirs_kl:.5f} | "
                         f"{ours_kl / theirs_kl:.2f} | {ours_top:.3f} | {theirs_top:.3f} | "
                         f"{'holds' if holds(ours_kl, ours_top, theirs_kl, theirs_top) else 'misses'} |")
    return "\n".join(lines)


def floor(loaded, ids, context_tokens: int) -> dict:
    """Mean KL(kvlab dense || llama.cpp f16), nats, and top-1 agreement over ids[context_tokens:] (1-D list)."""
    import torch

    from kvlab.engine import teacher_force
    from kvlab.engines.llamacpp import LlamaCppScorer
    from kvlab.quality.stats import RunningQuality, score_tokens
    from kvlab.strategies import make_strategy

    dense = make_strategy({"strategy": "dynamic"})
    targets = ids[context_tokens:]
    decoder = teacher_force(loaded, dense, dense.build_cache(loaded, len(ids)), torch.tensor([ids[:context_tokens]]),
                            targets)
    knobs = dict(type_k="f16", type_v="f16", flash_attn=True, rotation=True)
    engine = LlamaCppScorer(loaded.spec.source, ids, context_tokens, knobs, torch.get_num_threads())
    quality = RunningQuality()
    try:
        for target, ours, theirs in zip(targets, decoder, engine):
            scores = score_tokens(ours.logits[None].float(), theirs.logits[None], torch.tensor([target]))
            quality.add(float(scores.nll_base[0]), float(scores.nll[0]), float(scores.kl[0]),
                        bool(scores.same_top[0]))
    finally:
        engine.close()
    figures = quality.figures()
    return {"scored_tokens": figures.n_tokens, "kld_mean": figures.kld_mean, "same_top": figures.same_top}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tab = sub.add_parser("table")
    tab.add_argument("records", nargs="+")
    low = sub.add_parser("floor")
    low.add_argument("--model", default="bundled")
    low.add_argument("--context-tokens", type=int, default=1024)
    low.add_argument("--scored-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table([json.loads(Path(path).read_text(encoding="utf-8")) for path in args.records]))
        return 0
    from kvlab.models.loading import ModelSpec, load_model
    from kvlab.quality.defaults import shipped_text

    loaded = load_model(ModelSpec(args.model, "float32", "cpu"))
    ids = loaded.tokenizer(shipped_text())["input_ids"][:args.context_tokens + args.scored_tokens]
    print(json.dumps({"model": args.model, **floor(loaded, ids, args.context_tokens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
