"""Report section: kvlab's quality report against a bare transformers loop scoring the same tokens through the
same caches.

Both sides read the shipped text's first context + scored tokens, build each column's cache with the strategy
registry, prefill the context through it and a dense `DynamicCache`, then feed the scored tokens one per
forward, every column beside dense, computing per token the NLL, KL(dense || column) and top-1 agreement.
kvlab's side is `kvlab.quality.report.run_report` (events, running figures, exact bytes every step, records);
the bare side is a hand-written loop of `model(...)` calls doing what each strategy's view-code snippet does
(an eviction method prefills inside its `generate_context` pruning hooks and passes true `position_ids`
afterwards, a sink cache prefills with `prefill_in_chunks`). Both run on kvlab's compute thread, the order
alternating per repeat; strategies are warmed before either side is timed. The check is kvlab's wall time
over bare's (target <= REPORT_MAX_RATIO); the mean KL of both sides is reported beside it, as a check that
they scored the same thing. This module measures and builds the record; it prints nothing.
"""

from __future__ import annotations

import time

import torch

from ..compute import compute
from ..measure.warmup import warm_up_columns
from ..quality.defaults import DEFAULT_COLUMNS, shipped_text
from ..protocol import collect
from ..quality.report import report_columns, run_report
from .harness import Context, interleaved, make_check, summarize

REPORT_MAX_RATIO = 1.2
"""kvlab's report wall time over the bare loop's for the same columns and tokens must stay at or under this."""
SMALL_COLUMNS = "quantized:backend=quanto:nbits=4,sink:window_length=64,knorm:compression_ratio=0.5"
REPORT_SIZES = {"smoke": (64, 16, SMALL_COLUMNS), "small": (448, 64, SMALL_COLUMNS),
                "full": (3584, 512, DEFAULT_COLUMNS)}
"""Bench size -> (context tokens, scored tokens, columns); `full` is the default report on SmolLM2."""


def _bare_prefill(loaded, strategy, cache, context: torch.Tensor) -> torch.Tensor:
    model, n = loaded.model, context.shape[1]
    if strategy.is_evicting:
        with strategy.generate_context(loaded):
            return model(input_ids=context, cache=cache, use_cache=True, position_ids=torch.arange(n)[None],
                         logits_to_keep=1).logits[0, -1]
    if strategy.name == "sink" and n > strategy.window_length - strategy.num_sink_tokens:
        from ..caches.sink import prefill_in_chunks

        return prefill_in_chunks(model, context, cache, logits_to_keep=1).logits[0, -1]
    return model(input_ids=context, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]


def _bare_step(loaded, strategy, cache, token: torch.Tensor, position: int) -> torch.Tensor:
    kwargs = {"position_ids": torch.tensor([[position]])} if strategy.is_evicting else {}
    return loaded.model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1, **kwargs).logits[0, -1]


def _kl(base: torch.Tensor, logits: torch.Tensor) -> float:
    p, q = torch.log_softmax(base.float(), -1), torch.log_softmax(logits.float(), -1)
    return float((p.exp() * (p - q)).sum())


def bare_report(loaded, ids: torch.Tensor, strategies: list, context: int) -> dict:
    """The bare loop: wall seconds and each column's mean KL against dense (nats)."""
    from transformers import DynamicCache

    started = time.perf_counter()
    total = ids.shape[1]
    with torch.inference_mode():
        dense = DynamicCache(config=loaded.config)
        caches = [s.build_cache(loaded, total) for s in strategies]
        base = loaded.model(input_ids=ids[:, :context], cache=dense, use_cache=True, logits_to_keep=1).logits[0, -1]
        rows = [_bare_prefill(loaded, s, c, ids[:, :context]) for s, c in zip(strategies, caches)]
        kls = [[] for _ in strategies]
        for position in range(context, total):
            target = int(ids[0, position])
            base_lp = torch.log_softmax(base.float(), -1)
            for k, row in enumerate(rows):
                kls[k].append(_kl(base, row))
                lp = torch.log_softmax(row.float(), -1)
                _ = (float(-base_lp[target]), float(-lp[target]), bool(row.argmax() == base.argmax()))
            if position + 1 == total:
                break
            token = ids[:, position:position + 1]
            base = loaded.model(input_ids=token, cache=dense, use_cache=True, logits_to_keep=1).logits[0, -1]
            rows = [_bare_step(loaded, s, c, token, position) for s, c in zip(strategies, caches)]
    return {"elapsed_s": time.perf_counter() - started, "kld_mean": [sum(k) / len(k) for k in kls]}


def kvlab_report(loaded, ids: torch.Tensor, columns: str, scored: int) -> dict:
    """kvlab's side: one `run_report` (warm-up off: both sides are warmed before), events consumed."""
    started = time.perf_counter()
    done = collect(run_report(loaded, ids, columns, scored_tokens=scored, warm_up=False))
    elapsed = time.perf_counter() - started
    failed = [c for c in done.record["columns"] if c["status"] != "ok"]
    if failed:
        raise RuntimeError(f"{failed[0]['name']}: {failed[0]['message']}")
    return {"elapsed_s": elapsed, "kld_mean": [c["figures"]["kld_mean"] for c in done.record["columns"]]}


def bench_report(ctx: Context) -> dict:
    """The report section's record: kvlab and bare wall times per repeat (s), their ratio and both mean KLs."""
    loaded = ctx.loaded
    context, scored, columns = REPORT_SIZES.get(ctx.size.name, REPORT_SIZES["small"])
    ids = loaded.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :context + scored]
    strategies = [c.strategy for c in report_columns(columns)]
    compute(warm_up_columns, loaded, [*strategies], context)
    times: dict[str, list[float]] = {"kvlab": [], "bare": []}
    kl: dict[str, list[float]] = {}
    for rep in range(max(1, ctx.size.repeats)):
        for side in interleaved(rep, ("kvlab", "bare")):
            ctx.say(f"report: {side} repeat {rep + 1}")
            result = (compute(kvlab_report, loaded, ids, columns, scored) if side == "kvlab"
                      else compute(bare_report, loaded, ids, strategies, context))
            times[side].append(result["elapsed_s"])
            kl[side] = result["kld_mean"]
    ratios = [k / b for k, b in zip(times["kvlab"], times["bare"])]
    names = [c.describe() for c in report_columns(columns)]
    return {"columns": names, "context_tokens": context, "scored_tokens": scored,
            "unit": "s wall time for every column's scored tokens", "kvlab_s": summarize(times["kvlab"]),
            "bare_s": summarize(times["bare"]), "ratio": summarize(ratios),
            "kld_mean": {name: {"kvlab": a, "bare": b} for name, a, b in zip(names, kl["kvlab"], kl["bare"])},
            "checks": [make_check("report", "report wall time / bare transformers loop", ratios,
                                  f"<= {REPORT_MAX_RATIO}", lambda r: r <= REPORT_MAX_RATIO,
                                  "kvlab also measures exact cache bytes every step, keeps llama.cpp's running "
                                  "sums and percentiles and streams events")]}


def report_lines(section: dict) -> list[str]:
    """The section's figures for the bench's text report."""
    worst = max(abs(v["kvlab"] - v["bare"]) for v in section["kld_mean"].values())
    return [f"report: {len(section['columns'])} columns, {section['context_tokens']} context + "
            f"{section['scored_tokens']} scored tokens",
            f"    kvlab {section['kvlab_s']['median']:.2f} s, bare loop {section['bare_s']['median']:.2f} s, "
            f"ratio {section['ratio']['median']:.2f} [{section['ratio']['min']:.2f}-{section['ratio']['max']:.2f}]",
            f"    mean KL, kvlab against bare: largest difference {worst:.2e} nats"]
