"""Roofline section: decode tok/s against the memory-bandwidth bound measured in the same run.

The bound is the best large-tensor copy bandwidth (bytes read + written, STREAM
convention) over the bytes of weights read per token. Variants are the levers
kvlab controls: the compute thread's torch threads, a static cache (compiled,
at full size), bf16 weights. All timed work runs on kvlab's compute thread: a
large copy in the main thread would give it an OpenMP team of its own, and the
compute thread's team would stop spin-waiting (see `kvlab.compute`). This
module measures and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..compute import compute
from .harness import Context, make_check, summarize
from .sides import run_kvlab

ROOFLINE_BEFORE = 0.30
"""The fraction of the bound measured when the issue was filed (reported beside today's)."""
COPY_SAMPLES = 10
WARM_UP_TOKENS = 3


@dataclass
class Variant:
    """One lever: a model (fp32 or bf16), a strategy spec, and the compute thread's torch threads (None: as is)."""

    name: str
    loaded: object
    spec: dict
    threads: int | None = None


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage counted once (tied embeddings once)."""
    seen = {}
    for parameter in model.parameters():
        seen[parameter.data_ptr()] = parameter.nelement() * parameter.element_size()
    return sum(seen.values())


def copy_seconds(nbytes: int) -> Callable[[], float]:
    """A function timing one `dst.copy_(src)` of `nbytes` bytes (float32) in seconds, after one warm copy."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)

    def once() -> float:
        started = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - started

    return once


def measure_bandwidth(nbytes: int) -> dict[str, list[float]]:
    """{"compute thread": [GB/s read + written]} over COPY_SAMPLES copies of `nbytes` on the compute thread."""
    copy_once = compute(lambda: copy_seconds(nbytes))
    bandwidth = {"compute thread": []}
    for _ in range(COPY_SAMPLES):
        bandwidth["compute thread"].append(2 * nbytes / compute(copy_once) / 1e9)
    return bandwidth


def build_variants(ctx: Context, half) -> tuple[list[Variant], list[dict]]:
    """(variants to measure, [{name, reason}] of variants that cannot run here); `half` is the bf16 model."""
    import torch

    loaded = ctx.loaded
    variants = [
        Variant(f"dynamic fp32, {compute(torch.get_num_threads)} threads", loaded, {"strategy": "dynamic"}),
        Variant("dynamic fp32, 1 thread", loaded, {"strategy": "dynamic"}, threads=1),
        Variant("static fp32", loaded, {"strategy": "static"}),
        Variant("dynamic bf16", half, {"strategy": "dynamic"}),
    ]
    skipped = []
    if ctx.size.compile_static:
        from ..strategies import make_strategy

        compiled = Variant("static fp32 compiled", loaded, {"strategy": "static", "compile": True})
        why_not = make_strategy(compiled.spec).unavailable_reason(loaded)
        if why_not:
            skipped.append({"name": compiled.name, "reason": why_not})
        else:
            variants.insert(3, compiled)
    return variants, skipped


def measure_variants(ctx: Context, variants: list[Variant]) -> tuple[dict, dict]:
    """(tok_s, threads_used): variant name -> decode tok/s per repeat, and the compute thread's torch threads
    during each run. Round 0 is a warm-up; the thread count is restored after every run."""
    import torch

    n, repeats = ctx.size.roofline_tokens, ctx.size.repeats
    tok_s = {v.name: [] for v in variants}
    threads_used = {v.name: [] for v in variants}
    # The runner computes on kvlab's compute thread, which keeps its own thread count: set it there.
    previous = compute(torch.get_num_threads)
    for rep in range(repeats + 1):
        for variant in variants:
            ctx.say(f"roofline: {variant.name}, {'warm-up' if rep == 0 else f'repeat {rep}/{repeats}'}")
            compute(lambda: torch.set_num_threads(variant.threads or previous))
            try:
                threads_used[variant.name].append(compute(torch.get_num_threads))
                result = run_kvlab(variant.loaded, ctx.prompt_ids, [variant.spec],
                                   WARM_UP_TOKENS if rep == 0 else n)["results"][0]
            finally:
                compute(lambda: torch.set_num_threads(previous))
            if rep:
                tok_s[variant.name].append(result.decode_tok_s)
    return tok_s, threads_used


def bench_roofline(ctx: Context) -> dict:
    """The roofline section's record: copy bandwidth, one row per variant (tok/s, bound, fraction), one check."""
    import torch

    from ..models.loading import LoadedModel, ModelSpec

    nbytes = ctx.size.copy_mib * 2**20
    bandwidth = measure_bandwidth(nbytes)
    where, best = max(((k, max(v)) for k, v in bandwidth.items()), key=lambda kv: kv[1])
    half = LoadedModel(ModelSpec(dtype="bfloat16", device="cpu"),
                       compute(lambda: copy.deepcopy(ctx.loaded.model).to(torch.bfloat16)),
                       ctx.loaded.tokenizer, ctx.loaded.device, 0.0, f"{ctx.loaded.name} bf16")
    try:
        variants, skipped = build_variants(ctx, half)
        tok_s, threads_used = measure_variants(ctx, variants)
        rows = [variant_row(v, tok_s[v.name], threads_used[v.name], best) for v in variants]
    finally:
        del half
    return {"new_tokens": ctx.size.roofline_tokens, "copy_bytes": nbytes,
            "copy_bandwidth_gb_s": {k: summarize(v) for k, v in bandwidth.items()},
            "bandwidth_gb_s": best, "bandwidth_from": f"best of {COPY_SAMPLES} copies, {where}",
            "bandwidth_note": ("copy bandwidth counts bytes read + bytes written (STREAM convention); the bound takes "
                               "the best copy, since noise only ever lowers it"),
            "variants": rows, "skipped_variants": skipped, "checks": [roofline_check(rows, best)]}


def variant_row(variant: Variant, tok_s: list[float], threads_used: list[int], bandwidth_gb_s: float) -> dict:
    """One variant's figures: weight bytes, tok/s, the bound (tok/s) at `bandwidth_gb_s` and the fraction of it."""
    weights = weight_bytes(variant.loaded.model)
    bound = bandwidth_gb_s * 1e9 / weights
    return {"name": variant.name, "weight_bytes": weights, "tok_s": summarize(tok_s),
            "compute_threads": sorted(set(threads_used)), "bound_tok_s": bound,
            "fraction": summarize([v / bound for v in tok_s])}


def roofline_check(rows: list[dict], bandwidth_gb_s: float) -> dict:
    """The default variant's fraction of its bound (reported, no target); the reason names the best lever."""
    default = rows[0]
    top = max(rows, key=lambda r: r["fraction"]["median"])
    reason = (f"{default['tok_s']['median']:.1f} tok/s of a {default['bound_tok_s']:.1f} tok/s bound "
              f"({default['weight_bytes'] / 1e6:.0f} MB of weights per token at {bandwidth_gb_s:.1f} GB/s); best "
              f"lever here: {top['name']} at {top['fraction']['median']:.0%} of its bound "
              f"({top['tok_s']['median']:.1f} tok/s)")
    return make_check("roofline", f"{default['name']}: decode tok/s / bandwidth bound", default["fraction"]["values"],
                      f"report (was ≈ {ROOFLINE_BEFORE})", None, reason, unit="fraction")
