"""Needle section: kvlab's needle grid against bare transformers doing the same prefills and greedy tokens.

Both sides run the same passkey prompts (`kvlab.needle.prompt`) on a dense cache, on kvlab's compute thread,
alternating which goes first. kvlab's side is `kvlab.needle.runner.run_needle` (prompt building, prefill,
greedy answer, teacher-forced key score, cache bytes, records); bare transformers builds a `DynamicCache`
and calls `generate()` for as many greedy tokens as kvlab's answer took. The check is kvlab's wall time over
bare's (target <= NEEDLE_MAX_RATIO); the breakdown says where kvlab's time went (prefill forwards, the rest
of the cells). This module measures and builds the record; it prints nothing.
"""

from __future__ import annotations

import time

import torch

from ..compute import compute
from ..needle.grid import parse_grid
from ..needle.prompt import build_passkey_prompt
from ..needle.runner import run_needle
from ..protocol import collect
from .harness import Context, interleaved, make_check, summarize

NEEDLE_MAX_RATIO = 1.2
"""kvlab's needle wall time over bare transformers' for the same cells must stay at or under this."""
NEEDLE_LENGTHS = (256, 512)
NEEDLE_DEPTHS = (0.0, 0.5, 1.0)
NEEDLE_NEW_TOKENS = 8


def _bare(loaded, prompts, answer_lengths) -> float:
    from transformers import DynamicCache

    started = time.perf_counter()
    for prompt, tokens in zip(prompts, answer_lengths):
        ids = torch.tensor([list(prompt.prompt_ids)])
        with torch.inference_mode():
            loaded.model.generate(ids, cache=DynamicCache(config=loaded.config), max_new_tokens=tokens,
                                  min_new_tokens=tokens, do_sample=False)
    return time.perf_counter() - started


def bench_needle(ctx: Context) -> dict:
    """The needle section's record: kvlab and bare wall times per repeat (s), their ratio and the breakdown."""
    loaded = ctx.loaded
    grid = parse_grid(list(map(str, NEEDLE_LENGTHS)), list(NEEDLE_DEPTHS), [0], NEEDLE_NEW_TOKENS)
    prompts = [build_passkey_prompt(loaded.tokenizer, n, d, s) for n, d, s in grid.cells]
    times: dict[str, list[float]] = {"kvlab": [], "bare": []}
    prefill: list[float] = []
    answers: list[int] = [NEEDLE_NEW_TOKENS] * len(prompts)
    for rep in range(max(1, ctx.size.repeats)):
        for side in interleaved(rep, ("kvlab", "bare")):
            ctx.say(f"needle: {side} repeat {rep + 1}")
            if side == "kvlab":
                started = time.perf_counter()
                done = collect(run_needle(loaded, [{"strategy": "dynamic"}], grid))
                times["kvlab"].append(time.perf_counter() - started)
                prefill.append(sum(r.prefill_s for r in done.results))
                answers = [len(r.answer_ids) for r in done.results]
            else:
                times["bare"].append(compute(_bare, loaded, prompts, answers))
    ratios = [k / b for k, b in zip(times["kvlab"], times["bare"])]
    kvlab_s = summarize(times["kvlab"])["median"]
    return {"cells": len(prompts), "lengths": list(NEEDLE_LENGTHS), "depths": list(NEEDLE_DEPTHS),
            "new_tokens": NEEDLE_NEW_TOKENS, "unit": "s wall time for every cell",
            "kvlab_s": summarize(times["kvlab"]), "bare_s": summarize(times["bare"]), "ratio": summarize(ratios),
            "where_kvlab_time_goes": {"prefill_s": summarize(prefill)["median"],
                                      "rest_s": kvlab_s - summarize(prefill)["median"]},
            "checks": [make_check("needle", "needle wall time / bare transformers", ratios,
                                  f"<= {NEEDLE_MAX_RATIO}", lambda r: r <= NEEDLE_MAX_RATIO,
                                  "the teacher-forced key score and cache bytes are extra work bare generate skips")]}


def needle_lines(section: dict) -> list[str]:
    """The section's figures for the bench's text report."""
    where = section["where_kvlab_time_goes"]
    return [f"needle: {section['cells']} cells (lengths {section['lengths']}, depths {section['depths']}), dense cache",
            f"    kvlab {section['kvlab_s']['median']:.2f} s, bare generate {section['bare_s']['median']:.2f} s, "
            f"ratio {section['ratio']['median']:.2f} [{section['ratio']['min']:.2f}-{section['ratio']['max']:.2f}]",
            f"    kvlab's time: prefill forwards {where['prefill_s']:.2f} s, the rest (decode, key score, bytes, "
            f"prompts, records) {where['rest_s']:.2f} s"]
