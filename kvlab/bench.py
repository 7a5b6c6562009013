"""`python -m kvlab bench`: is the instrument honest, and what does it cost?

Six sections, each measured side by side in one run with its comparison runs
interleaved (A, B, A, B... with the order alternating), so machine noise hits
both sides; every figure is the median over the repeats with min–max beside it:

- `overhead`: tok/s of kvlab's runner (one column, events streamed and consumed)
  vs bare `model.generate` with a fresh cache of the same strategy.
- `fair`: median per-token latency of 4 strategies run together in fair mode vs
  each alone.
- `parallel`: wall time of 4 columns in parallel mode vs the same 4 sequentially,
  and the same comparison for bare `generate` calls with one torch thread each.
- `scaling`: cache bytes and per-token latency vs context length per strategy.
- `startup`: process start to model ready and to first token, in a subprocess,
  on a fresh cache folder (first launch) and on the same folder again; and
  `python app.py` itself, from spawn to its page answering and its model ready.
- `roofline`: decode tok/s vs the memory-bandwidth bound measured here (weight
  bytes read per token over large-tensor copy bandwidth), and the levers kvlab
  controls (threads, static cache, torch.compile, bf16).

Timed model work always runs on kvlab's compute thread (`kvlab.compute`), kvlab's
runner and the bare baseline alike, and the bench itself runs no torch work in
its main thread: a second thread doing OpenMP work makes GNU OpenMP park idle
threads instead of letting them spin, which slowed decoding about 1.8× here.
Each check prints `met`, `MISSED (reason)` with the
reason measured in the same run (time outside the forward pass, cores used,
import vs load time, a pyinstrument breakdown of the runner's step), or
`reported` where the issue sets no target. No assertion is made on a time and
the exit status is 0 whenever the bench ran; plots are drawn by
`kvlab.bench_plots`. This module measures and formats text; it does not plot.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .compute import compute

SECTIONS = ("overhead", "fair", "parallel", "scaling", "startup", "roofline")
RECORD_VERSION = 1
DEFAULT_OUTPUT = Path("artifacts") / "bench"

OVERHEAD_MIN_RATIO = 0.98
FAIR_BAND = (0.95, 1.05)
PARALLEL_MAX_RATIO = 0.70
STARTUP_READY_MAX_S = 5.0
NO_CACHE_GROWTH_MIN = 1.5
DYNAMIC_VS_NO_CACHE_GROWTH_MAX = 0.5
SINK_FLAT_BAND = (0.8, 1.25)
QUANTIZED_INT4_BYTES_MAX_RATIO = 0.30
ROOFLINE_BEFORE = 0.30
COPY_SAMPLES = 10

PROMPT = "Explain what a key-value cache does in a transformer, in a few sentences."
FILLER = (
    "A key-value cache stores the keys and values of every token a transformer has already seen, so each new "
    "token attends to them without recomputing the whole sequence. Its memory grows with the context; "
    "quantizing it, preallocating it or keeping only a window of it trades exactness, speed and memory. "
)
SINK_SPEC = {"strategy": "sink", "window_length": 256, "num_sink_tokens": 4}
OVERHEAD_STRATEGIES = {
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": {"strategy": "quantized", "backend": "quanto", "nbits": 4},
}
FAIR_STRATEGIES = {
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": {"strategy": "quantized", "backend": "quanto", "nbits": 4},
    "sink 4+252": SINK_SPEC,
}
SCALING_STRATEGIES = {
    "no_cache": {"strategy": "no_cache"},
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": {"strategy": "quantized", "backend": "quanto", "nbits": 4},
    "quantized int2": {"strategy": "quantized", "backend": "quanto", "nbits": 2},
    "sink 4+252": SINK_SPEC,
}


@dataclass(frozen=True)
class BenchSize:
    """How much to measure. Token counts are new tokens per run; lengths are prompt tokens."""

    name: str
    repeats: int
    scaling_repeats: int
    new_tokens: int
    lengths: tuple[int, ...]
    scaling_new_tokens: int
    no_cache_new_tokens: int
    startup_repeats: int
    fresh_launch: bool
    copy_mib: int
    roofline_tokens: int
    compile_static: bool


SIZES = {
    "smoke": BenchSize("smoke", repeats=2, scaling_repeats=2, new_tokens=3, lengths=(32, 64), scaling_new_tokens=2,
                       no_cache_new_tokens=2, startup_repeats=1, fresh_launch=False, copy_mib=256,
                       roofline_tokens=4, compile_static=False),
    "small": BenchSize("small", repeats=3, scaling_repeats=2, new_tokens=32, lengths=(256, 512, 1024),
                       scaling_new_tokens=8, no_cache_new_tokens=3, startup_repeats=2, fresh_launch=True,
                       copy_mib=256, roofline_tokens=32, compile_static=False),
    "full": BenchSize("full", repeats=5, scaling_repeats=3, new_tokens=128, lengths=(256, 512, 1024, 2048, 4096),
                      scaling_new_tokens=16, no_cache_new_tokens=4, startup_repeats=3, fresh_launch=True,
                      copy_mib=512, roofline_tokens=128, compile_static=True),
}


# ---------------------------------------------------------------- figures


def summarize(values: Sequence[float]) -> dict:
    """{median, min, max, n, values} of a non-empty list of numbers."""
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def make_check(section: str, name: str, values: Sequence[float], target: str, passes: Callable[[float], bool] | None,
               reason: str = "", unit: str = "ratio", value: float | None = None) -> dict:
    """One row of the verdict table: median (or `value`) and min–max of `values`, target, met, reason.

    `passes` None means the issue sets no target (`met` None, status `reported`).
    `reason` is kept only when the target is missed or cannot be judged.
    """
    stats = summarize(values) if values else None
    value = value if value is not None else (stats["median"] if stats else None)
    met = None if passes is None or value is None else bool(passes(value))
    return {"section": section, "name": name, "value": value, "min": stats["min"] if stats else None,
            "max": stats["max"] if stats else None, "unit": unit, "target": target, "met": met,
            "reason": "" if met else reason}


# ---------------------------------------------------------------- running


@dataclass
class Context:
    loaded: object
    size: BenchSize
    prompt_ids: object
    say: Callable[[str], None]
    profile_dir: Path | None


def settings_for(new_tokens: int):
    from .generation import GenerationSettings

    return GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)


def run_kvlab(loaded, prompt_ids, specs: list, new_tokens: int, mode: str = "fair") -> dict:
    """One run_compare, events consumed. Returns elapsed_s, cpu_s (process CPU time) and the results.

    Raises RuntimeError when a column did not finish ok (its message says why).
    """
    from .runner import collect, run_compare

    gc.collect()
    cpu = time.process_time()
    started = time.perf_counter()
    done = collect(run_compare(loaded, prompt_ids, list(specs), settings_for(new_tokens), mode))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    for result in done.results:
        if result.status != "ok":
            raise RuntimeError(f"{result.name}: {result.status}: {result.message}")
    return {"elapsed_s": elapsed, "cpu_s": cpu, "results": done.results}


def bare_generate(loaded, prompt_ids, spec: dict, new_tokens: int) -> Callable[[], float]:
    """A callable that runs `model.generate` with a fresh cache of `spec`'s strategy and returns its seconds."""
    import torch

    from .strategies import make_strategy

    strategy = make_strategy(spec)
    ids = prompt_ids.to(loaded.device)

    def generate():
        started = time.perf_counter()
        cache = strategy.build_cache(loaded, ids.shape[1] + new_tokens)
        with torch.inference_mode():
            out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                        min_new_tokens=new_tokens, do_sample=False, cache=cache,
                                        pad_token_id=loaded.tokenizer.eos_token_id)
        elapsed = time.perf_counter() - started
        if out.shape[1] - ids.shape[1] != new_tokens:
            raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {new_tokens}")
        return elapsed

    return generate


def run_bare(loaded, prompt_ids, spec: dict, new_tokens: int) -> float:
    """Seconds for `model.generate` with a fresh cache of `spec`'s strategy, on the compute thread."""
    gc.collect()
    return compute(bare_generate(loaded, prompt_ids, spec, new_tokens))


def run_bare_together(loaded, prompt_ids, spec: dict, new_tokens: int, columns: int, torch_threads: int) -> float:
    """Wall seconds for `columns` bare generate calls at once, each in its own thread limited to `torch_threads`
    intra-op threads (the thread count is restored for later threads in `finally`).

    Raises the first error a thread met.
    """
    import torch

    generate = bare_generate(loaded, prompt_ids, spec, new_tokens)
    errors: list[BaseException] = []

    def column():
        torch.set_num_threads(torch_threads)
        try:
            generate()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread below
            errors.append(err)

    default_threads = torch.get_num_threads()
    gc.collect()
    workers = [threading.Thread(target=column, name=f"kvlab-bench-{i}") for i in range(columns)]
    started = time.perf_counter()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        torch.set_num_threads(default_threads)
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far repeats of the same measurement disagree."""
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


def median_decode_s(result) -> float:
    """Median per-token decode latency of a column (step 0, the prefill, excluded)."""
    steps = result.per_token_s[1:] or result.per_token_s
    return statistics.median(steps)


def profile_step(loaded, prompt_ids, spec: dict, new_tokens: int, folder: Path | None, tag: str) -> str:
    """Where one column's decode loop spends its time, by call inside `_decode` (pyinstrument).

    The column runs through `run_column` on the compute thread, which profiles itself
    (pyinstrument samples one thread). Returns a one-line summary such as
    `forward 96%, cache_bytes 2%, push 1%`; writes the full text profile into
    `folder` when given. Returns '' when pyinstrument is not installed.
    """
    try:
        from pyinstrument import Profiler
    except ModuleNotFoundError:
        return ""
    from .runner import Column, FreeTurns, run_column
    from .strategies import make_strategy

    events: list = []

    def work():
        profiler = Profiler(interval=0.0005)
        profiler.start()
        try:
            run_column(loaded, 0, Column(make_strategy(spec)), prompt_ids, settings_for(new_tokens), events.append,
                       FreeTurns(), threading.Event())
        finally:
            profiler.stop()
        return profiler

    profiler = compute(work)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"profile_{tag}.txt").write_text(profiler.output_text(show_all=True))
    decode = _find_frame(profiler.last_session.root_frame(), "_decode")
    if decode is None or decode.time <= 0:
        return ""
    by_call: dict[str, float] = {}

    def add(name: str, seconds: float) -> None:
        by_call[name] = by_call.get(name, 0.0) + seconds

    for child in decode.children:
        step = _find_frame(child, "step") if child.function == "run" else None
        if step is None:
            add(child.function, child.time)
            continue
        for grandchild in step.children:
            add(grandchild.function, grandchild.time)
        add("step itself", max(step.time - sum(g.time for g in step.children), 0.0))
        add("run", max(child.time - step.time, 0.0))
    by_call["_decode itself"] = max(decode.time - sum(by_call.values()), 0.0)
    parts = sorted(by_call.items(), key=lambda kv: kv[1], reverse=True)
    return ", ".join(f"{name} {t / decode.time:.1%}" for name, t in parts[:6])


def _find_frame(frame, function: str):
    if frame is None:
        return None
    if frame.function == function:
        return frame
    for child in frame.children:
        found = _find_frame(child, function)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------- sections


def bench_overhead(ctx: Context) -> dict:
    size, loaded, ids = ctx.size, ctx.loaded, ctx.prompt_ids
    n = size.new_tokens
    for spec in OVERHEAD_STRATEGIES.values():
        run_bare(loaded, ids, spec, 1)
        run_kvlab(loaded, ids, [spec], 1)
    data = {label: {"bare": [], "kvlab": [], "outside": []} for label in OVERHEAD_STRATEGIES}
    for rep in range(size.repeats):
        for label, spec in OVERHEAD_STRATEGIES.items():
            ctx.say(f"overhead: {label}, repeat {rep + 1}/{size.repeats}")
            for side in (("bare", "kvlab") if rep % 2 == 0 else ("kvlab", "bare")):
                if side == "bare":
                    data[label]["bare"].append(n / run_bare(loaded, ids, spec, n))
                else:
                    run = run_kvlab(loaded, ids, [spec], n)
                    data[label]["kvlab"].append(n / run["elapsed_s"])
                    data[label]["outside"].append((run["elapsed_s"] - sum(run["results"][0].per_token_s)) / n)
    rows, checks = [], []
    for label, spec in OVERHEAD_STRATEGIES.items():
        d = data[label]
        ratios = [k / b for k, b in zip(d["kvlab"], d["bare"])]
        outside_ms = statistics.median(d["outside"]) * 1000
        per_token_ms = 1000 / statistics.median(d["kvlab"])
        rows.append({"strategy": label, "bare_tok_s": summarize(d["bare"]), "kvlab_tok_s": summarize(d["kvlab"]),
                     "kvlab_outside_forward_ms_per_token": summarize([v * 1000 for v in d["outside"]]),
                     "ratio": summarize(ratios)})
        reason = (f"kvlab spends {outside_ms:.2f} ms per token outside the forward pass "
                  f"({outside_ms / per_token_ms:.1%} of its time)")
        if statistics.median(ratios) < OVERHEAD_MIN_RATIO:
            ctx.say(f"overhead: {label} missed its target, profiling one kvlab column")
            breakdown = profile_step(loaded, ids, spec, n, ctx.profile_dir, f"overhead_{label.replace(' ', '_')}")
            if breakdown:
                reason += f"; the runner's step, profiled: {breakdown}"
        checks.append(make_check("overhead", f"{label}: kvlab / bare tok/s", ratios, f"≥ {OVERHEAD_MIN_RATIO}",
                                 lambda v: v >= OVERHEAD_MIN_RATIO, reason))
    return {"new_tokens": n, "prompt_tokens": int(ids.shape[1]), "unit": "tokens/s end to end (prefill included)",
            "note": "both sides run their forward passes on kvlab's compute thread", "rows": rows, "checks": checks}


def bench_fair(ctx: Context) -> dict:
    size, loaded, ids = ctx.size, ctx.loaded, ctx.prompt_ids
    n = size.new_tokens
    labels, specs = list(FAIR_STRATEGIES), list(FAIR_STRATEGIES.values())
    run_kvlab(loaded, ids, specs, 2)
    together = {label: [] for label in labels}
    alone = {label: [] for label in labels}
    cores = {"together": [], "alone": []}
    for rep in range(size.repeats):
        ctx.say(f"fair: repeat {rep + 1}/{size.repeats}")

        def run_together():
            run = run_kvlab(loaded, ids, specs, n, "fair")
            cores["together"].append(run["cpu_s"] / run["elapsed_s"])
            for label, result in zip(labels, run["results"]):
                together[label].append(median_decode_s(result))

        def run_alone():
            order = labels[rep % len(labels):] + labels[:rep % len(labels)]
            for label in order:
                run = run_kvlab(loaded, ids, [FAIR_STRATEGIES[label]], n, "fair")
                cores["alone"].append(run["cpu_s"] / run["elapsed_s"])
                alone[label].append(median_decode_s(run["results"][0]))

        for step in ((run_together, run_alone) if rep % 2 == 0 else (run_alone, run_together)):
            step()
    rows, checks = [], []
    low, high = FAIR_BAND
    used = {k: statistics.median(v) for k, v in cores.items()}
    for label in labels:
        ratios = [t / a for t, a in zip(together[label], alone[label])]
        rows.append({"strategy": label, "together_ms": summarize([v * 1000 for v in together[label]]),
                     "alone_ms": summarize([v * 1000 for v in alone[label]]), "ratio": summarize(ratios)})
        noise = spread(alone[label])
        reason = (f"together {statistics.median(together[label]) * 1000:.1f} ms vs alone "
                  f"{statistics.median(alone[label]) * 1000:.1f} ms per token; ")
        if noise > high - low:
            reason += (f"run alone, this column's latency spread {noise:.0%} between repeats, wider than the "
                       f"{high - low:.0%} band: machine noise, not the runner, decides this ratio")
        else:
            reason += (f"the process kept {used['together']:.2f} cores busy together vs {used['alone']:.2f} alone: "
                       f"other columns' per-token work (accounting, detokenizing, events) runs beside the timed forward")
        checks.append(make_check("fair", f"{label}: together / alone latency", ratios, f"{low}–{high}",
                                 lambda v: low <= v <= high, reason))
    return {"new_tokens": n, "band": list(FAIR_BAND), "rows": rows, "cores_busy": used, "checks": checks}


def bench_parallel(ctx: Context) -> dict:
    import torch

    from .runner import parallel_threads

    size, loaded, ids = ctx.size, ctx.loaded, ctx.prompt_ids
    n = size.new_tokens
    specs = list(FAIR_STRATEGIES.values())
    columns = len(specs)
    run_kvlab(loaded, ids, specs, 2, "parallel")
    elapsed = {"parallel": [], "sequential": []}
    cores = {"parallel": [], "sequential": []}
    lever = {"bare, one after another": [], "bare, at once, 1 torch thread each": []}
    for rep in range(size.repeats):
        ctx.say(f"parallel: repeat {rep + 1}/{size.repeats}")
        for mode in (("parallel", "sequential") if rep % 2 == 0 else ("sequential", "parallel")):
            run = run_kvlab(loaded, ids, specs, n, mode)
            elapsed[mode].append(run["elapsed_s"])
            cores[mode].append(run["cpu_s"] / run["elapsed_s"])
        for name in (lever if rep % 2 == 0 else reversed(list(lever))):
            if name == "bare, one after another":
                lever[name].append(sum(run_bare(loaded, ids, {"strategy": "dynamic"}, n) for _ in range(columns)))
            else:
                lever[name].append(run_bare_together(loaded, ids, {"strategy": "dynamic"}, n, columns,
                                                     torch_threads=1))
    ratios = [p / s for p, s in zip(elapsed["parallel"], elapsed["sequential"])]
    lever_ratios = [together / one_by_one for one_by_one, together in zip(*lever.values())]
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = compute(torch.get_num_threads)
    share = parallel_threads(columns, threads)
    reference = statistics.median(lever_ratios)
    verdict = ("so free threads miss the target on this machine even without kvlab" if reference > PARALLEL_MAX_RATIO
               else "the bare calls do reach it, so the gap is kvlab's")
    reason = (f"{available} cores; each parallel column and the compute thread got {share} of "
              f"{threads} torch threads (process CPU use: "
              f"{statistics.median(cores['parallel']):.2f} cores in parallel, "
              f"{statistics.median(cores['sequential']):.2f} sequentially, OpenMP spin-waiting included). Reference "
              f"without kvlab: {columns} bare dynamic generate calls at once, one torch thread each, took "
              f"{reference:.2f} of the time of the same calls one after another, {verdict}")
    check = make_check("parallel", "parallel / sequential wall time", ratios, f"≤ {PARALLEL_MAX_RATIO}",
                       lambda v: v <= PARALLEL_MAX_RATIO, reason)
    lever_check = make_check("parallel", f"reference: {columns} bare generates at once (1 thread each) / one after "
                             f"another", lever_ratios, "—", None)
    return {"new_tokens": n, "columns": list(FAIR_STRATEGIES), "target": PARALLEL_MAX_RATIO,
            "rows": [{"mode": mode, "elapsed_s": summarize(elapsed[mode]), "cores_busy": summarize(cores[mode])}
                     for mode in elapsed],
            "lever": {name: summarize(values) for name, values in lever.items()},
            "ratio": summarize(ratios), "lever_ratio": summarize(lever_ratios), "checks": [check, lever_check]}


def filler_ids(tokenizer, length: int):
    """(1, length) token ids of plain English text (FILLER repeated), for long contexts."""
    import torch

    ids: list[int] = []
    while len(ids) < length:
        ids.extend(tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    return torch.tensor([ids[:length]])


def bench_scaling(ctx: Context) -> dict:
    size, loaded = ctx.size, ctx.loaded
    lengths = list(size.lengths)
    prompts = {n: filler_ids(loaded.tokenizer, n) for n in lengths}
    latency = {label: {n: [] for n in lengths} for label in SCALING_STRATEGIES}
    nbytes = {label: {n: [] for n in lengths} for label in SCALING_STRATEGIES}
    prefill = {label: {n: [] for n in lengths} for label in SCALING_STRATEGIES}
    errors: dict[str, str] = {}
    for rep in range(size.scaling_repeats):
        for n in lengths:
            ctx.say(f"scaling: {n} tokens, repeat {rep + 1}/{size.scaling_repeats}")
            for label, spec in SCALING_STRATEGIES.items():
                if label in errors:
                    continue
                new = size.no_cache_new_tokens if spec["strategy"] == "no_cache" else size.scaling_new_tokens
                try:
                    result = run_kvlab(loaded, prompts[n], [spec], new)["results"][0]
                except RuntimeError as err:
                    errors[label] = str(err)
                    continue
                latency[label][n].append(median_decode_s(result))
                nbytes[label][n].append(result.cache_bytes[-1])
                prefill[label][n].append(result.prefill_s)
    series = {}
    for label in SCALING_STRATEGIES:
        series[label] = {
            "latency_ms": [summarize([v * 1000 for v in latency[label][n]]) if latency[label][n] else None for n in lengths],
            "cache_bytes": [summarize(nbytes[label][n]) if nbytes[label][n] else None for n in lengths],
            "prefill_s": [summarize(prefill[label][n]) if prefill[label][n] else None for n in lengths],
        }
        if label in errors:
            series[label]["error"] = errors[label]
    return {"lengths": lengths, "new_tokens": size.scaling_new_tokens, "no_cache_new_tokens": size.no_cache_new_tokens,
            "series": series, "checks": scaling_checks(lengths, latency, nbytes, errors)}


def scaling_checks(lengths: list[int], latency: dict, nbytes: dict, errors: dict) -> list[dict]:
    """The expected shapes, as checks on per-repeat values (lists per strategy label and length)."""
    first, last = lengths[0], lengths[-1]
    checks = []

    def growth(label):
        return [b / a for a, b in zip(latency[label][first], latency[label][last])]

    def missing(label):
        return f"{label} did not run: {errors[label]}" if label in errors else ""

    def ms(label, n):
        return statistics.median(latency[label][n]) * 1000 if latency[label][n] else float("nan")

    def path(label):
        return f"{label} {ms(label, first):.0f} → {ms(label, last):.0f} ms per token from {first} to {last} tokens"

    def mib(label):
        return f"{statistics.median(nbytes[label][last]) / 2**20:.2f} MiB" if nbytes[label][last] else "—"

    nc, dyn = growth("no_cache"), growth("dynamic")
    checks.append(make_check(
        "scaling", f"no_cache latency {last}/{first} tokens", nc, f"≥ {NO_CACHE_GROWTH_MIN} (grows with length)",
        lambda v: v >= NO_CACHE_GROWTH_MIN,
        missing("no_cache") or f"{path('no_cache')}: at these lengths reading the weights, not the sequence, dominates"))
    relative = [d / c for d, c in zip(dyn, nc)]
    checks.append(make_check(
        "scaling", "dynamic growth / no_cache growth", relative, f"≤ {DYNAMIC_VS_NO_CACHE_GROWTH_MAX} (grows slowly)",
        lambda v: v <= DYNAMIC_VS_NO_CACHE_GROWTH_MAX,
        missing("dynamic") or missing("no_cache") or f"{path('dynamic')}; {path('no_cache')}"))
    window = SINK_SPEC["window_length"]
    past = [n for n in lengths if n >= window]
    sink = "sink 4+252"
    if len(past) >= 2:
        flat = [b / a for a, b in zip(latency[sink][past[0]], latency[sink][past[-1]])]
        checks.append(make_check("scaling", f"sink latency {past[-1]}/{past[0]} tokens", flat,
                                 f"{SINK_FLAT_BAND[0]}–{SINK_FLAT_BAND[1]} (flat after its window)",
                                 lambda v: SINK_FLAT_BAND[0] <= v <= SINK_FLAT_BAND[1],
                                 missing(sink) or f"{sink} {ms(sink, past[0]):.0f} → {ms(sink, past[-1]):.0f} ms "
                                 f"per token from {past[0]} to {past[-1]} tokens"))
    else:
        checks.append(make_check("scaling", "sink latency flat after its window", [], "flat after its window", None,
                                 f"not judged at this size: needs two lengths ≥ the window ({window})"))
    q4 = [q / d for q, d in zip(nbytes["quantized int4"][last], nbytes["dynamic"][last])]
    checks.append(make_check(
        "scaling", f"quantized int4 / dynamic bytes at {last} tokens", q4, f"≤ {QUANTIZED_INT4_BYTES_MAX_RATIO} (≈ ¼)",
        lambda v: v <= QUANTIZED_INT4_BYTES_MAX_RATIO,
        missing("quantized int4") or missing("dynamic") or
        f"int4 {mib('quantized int4')} vs dynamic {mib('dynamic')} at {last} tokens; the newest residual_length "
        f"tokens stay in full precision"))
    return checks


STARTUP_CHILD = r"""
import json, sys, time
marks = {}
import torch, transformers
marks["imports"] = time.time()
import kvlab
import transformers.cache_utils, transformers.modeling_utils
marks["lazy_imports"] = time.time()
from kvlab.events import TokenEvent
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.models import ModelSpec, load_model
from kvlab.runner import run_compare
loaded = load_model(ModelSpec(device="cpu"))
marks["ready"] = time.time()
ids = encode_prompt(loaded.tokenizer, sys.argv[1])
settings = GenerationSettings(max_new_tokens=1, stop_at_eos=False, fidelity=False)
for event in run_compare(loaded, ids, [{"strategy": "dynamic"}], settings):
    if isinstance(event, TokenEvent) and "first_token" not in marks:
        marks["first_token"] = time.time()
print(json.dumps(marks))
"""
GRADIO_IMPORT_CHILD = "import time; t = time.time(); import gradio; print(time.time() - t)"
APP_READY_LINE = "model ready:"
"""What `python app.py` logs to stderr once its preloaded model is ready (kvlab_ui.loader.READY_LOG)."""
APP_FAILED_LINE = "model load failed:"
APP_TIMEOUT_S = 180.0


def child_env(cache_folder: Path) -> tuple[dict, str]:
    env = dict(os.environ, KVLAB_CACHE_DIR=str(cache_folder), PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env, root


def launch(cache_folder: Path) -> dict:
    """Start a fresh python that loads the bundled model and makes one token; seconds from spawn to each mark."""
    env, root = child_env(cache_folder)
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", STARTUP_CHILD, PROMPT], env=env, cwd=root, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    marks = json.loads(proc.stdout.strip().splitlines()[-1])
    return {f"{name}_s": value - started for name, value in marks.items()}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_app(cache_folder: Path) -> dict:
    """Start `python app.py` as a user would; seconds from spawn until its page answers (`served_s`) and until
    it logs that its preloaded model is ready (`ready_s`). The app is stopped before returning.

    Raises:
        RuntimeError: the app exited, or did not get there within APP_TIMEOUT_S.
    """
    import urllib.request

    env, root = child_env(cache_folder)
    port = free_port()
    env["GRADIO_SERVER_PORT"] = str(port)
    marks: dict[str, float] = {}
    tail: list[str] = []
    started = time.time()
    proc = subprocess.Popen([sys.executable, "app.py"], env=env, cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def read_log():
        for line in proc.stderr:
            tail[:] = (tail + [line.rstrip()])[-5:]
            if APP_READY_LINE in line and "ready_s" not in marks:
                marks["ready_s"] = time.time() - started
            if APP_FAILED_LINE in line:
                marks.setdefault("failed", line.strip())

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        while time.time() - started < APP_TIMEOUT_S and proc.poll() is None:
            if "served_s" not in marks:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                    marks["served_s"] = time.time() - started
                except OSError:
                    pass
            if "failed" in marks:
                raise RuntimeError(f"app.py could not load its model: {marks['failed']}")
            if {"served_s", "ready_s"} <= marks.keys():
                return marks
            time.sleep(0.02)
        raise RuntimeError(f"app.py did not serve and load within {APP_TIMEOUT_S:.0f} s (exit status "
                           f"{proc.poll()}); last log lines: {tail}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)


def gradio_import_s() -> float:
    """Seconds `import gradio` takes in a fresh python here."""
    out = subprocess.run([sys.executable, "-c", GRADIO_IMPORT_CHILD], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench_startup(ctx: Context) -> dict:
    from .models import cache_dir, prepare_bundled_model

    size = ctx.size
    launches = {"first": [], "second": []}
    app, gradio_s = [], []
    for rep in range(size.startup_repeats):
        if size.fresh_launch:
            folder = Path(tempfile.mkdtemp(prefix="kvlab-bench-"))
            try:
                ctx.say(f"startup: first launch on an empty cache folder, repeat {rep + 1}/{size.startup_repeats}")
                launches["first"].append(launch(folder))
                ctx.say(f"startup: second launch, repeat {rep + 1}/{size.startup_repeats}")
                launches["second"].append(launch(folder))
                ctx.say(f"startup: app.py second launch, repeat {rep + 1}/{size.startup_repeats}")
                app.append(launch_app(folder))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        else:
            prepare_bundled_model()
            ctx.say(f"startup: second launch, repeat {rep + 1}/{size.startup_repeats}")
            launches["second"].append(launch(cache_dir()))
            ctx.say(f"startup: app.py second launch, repeat {rep + 1}/{size.startup_repeats}")
            app.append(launch_app(cache_dir()))
        gradio_s.append(gradio_import_s())
    record = {"target_ready_s": STARTUP_READY_MAX_S,
              "child": "python -c: import torch+transformers, kvlab and transformers' lazy modules, load_model, "
                       "one dynamic token",
              "app": "python app.py: its page answers (served) and it logs that the preloaded model is ready",
              "gradio_import_s": summarize(gradio_s)}
    for name, runs in launches.items():
        if runs:
            record[name] = {key: summarize([r[key] for r in runs])
                            for key in ("imports_s", "lazy_imports_s", "ready_s", "first_token_s")}
        else:
            record[name] = {"skipped": f"size {size.name} skips a fresh conversion (about 20 s); use --size small or full"}
    record["app_second"] = {key: summarize([r[key] for r in app]) for key in ("served_s", "ready_s")}
    second = launches["second"]
    imports, lazy, ready = (statistics.median(r[key] for r in second) for key in ("imports_s", "lazy_imports_s", "ready_s"))
    reason = (f"interpreter + `import torch, transformers` {imports:.1f} s, kvlab and transformers' lazy "
              f"modelling/cache imports {lazy - imports:.1f} s, load_model {ready - lazy:.1f} s")
    served, app_ready = (statistics.median(r[key] for r in app) for key in ("served_s", "ready_s"))
    app_reason = (f"`import gradio` alone takes {statistics.median(gradio_s):.1f} s here and runs before the model "
                  f"starts loading; page served at {served:.1f} s, model ready at {app_ready:.1f} s (the backend "
                  f"alone: {ready:.1f} s). Loading the model in a thread while gradio imports did not help: both "
                  f"are import work that holds the GIL")
    record["checks"] = [
        make_check("startup", "second launch: process start to model ready", [r["ready_s"] for r in second],
                   f"≤ {STARTUP_READY_MAX_S} s", lambda v: v <= STARTUP_READY_MAX_S, reason, unit="s"),
        make_check("startup", "app.py second launch: start to model ready", [r["ready_s"] for r in app],
                   f"≤ {STARTUP_READY_MAX_S} s", lambda v: v <= STARTUP_READY_MAX_S, app_reason, unit="s"),
    ]
    return record


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage counted once (tied embeddings once)."""
    seen = {}
    for parameter in model.parameters():
        seen[parameter.data_ptr()] = parameter.nelement() * parameter.element_size()
    return sum(seen.values())


def copy_seconds(nbytes: int) -> Callable[[], float]:
    """A function timing one `dst.copy_(src)` of `nbytes` bytes (float32), after one warm copy."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)

    def once() -> float:
        started = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - started

    return once


@dataclass
class Variant:
    name: str
    loaded: object
    spec: dict
    threads: int | None = None


def bench_roofline(ctx: Context) -> dict:
    import torch

    from .models import LoadedModel, ModelSpec

    size, loaded, ids = ctx.size, ctx.loaded, ctx.prompt_ids
    n = size.roofline_tokens
    nbytes = size.copy_mib * 2**20
    copy_once = compute(lambda: copy_seconds(nbytes))
    # Measured on the compute thread only: a large copy in the main thread would give it an OpenMP team of
    # its own, and then the compute thread's team would stop spin-waiting (see kvlab.compute).
    bandwidth = {"compute thread": []}
    for _ in range(COPY_SAMPLES):
        bandwidth["compute thread"].append(2 * nbytes / compute(copy_once) / 1e9)
    del copy_once
    where, best = max(((k, max(v)) for k, v in bandwidth.items()), key=lambda kv: kv[1])
    half = LoadedModel(ModelSpec(dtype="bfloat16", device="cpu"),
                       compute(lambda: copy.deepcopy(loaded.model).to(torch.bfloat16)),
                       loaded.tokenizer, loaded.device, 0.0, f"{loaded.name} bf16")
    variants = [
        Variant(f"dynamic fp32, {compute(torch.get_num_threads)} threads", loaded, {"strategy": "dynamic"}),
        Variant("dynamic fp32, 1 thread", loaded, {"strategy": "dynamic"}, threads=1),
        Variant("static fp32", loaded, {"strategy": "static"}),
        Variant("dynamic bf16", half, {"strategy": "dynamic"}),
    ]
    skipped = []
    if size.compile_static:
        from .strategies import make_strategy

        compiled = Variant("static fp32 compiled", loaded, {"strategy": "static", "compile": True})
        why_not = make_strategy(compiled.spec).unavailable_reason(loaded)
        if why_not:
            skipped.append({"name": compiled.name, "reason": why_not})
        else:
            variants.insert(3, compiled)
    tok_s = {v.name: [] for v in variants}
    threads_used = {v.name: [] for v in variants}
    # The runner computes on kvlab's compute thread, which keeps its own thread count: set it there.
    previous = compute(torch.get_num_threads)
    try:
        for rep in range(size.repeats + 1):
            for variant in variants:
                ctx.say(f"roofline: {variant.name}, {'warm-up' if rep == 0 else f'repeat {rep}/{size.repeats}'}")
                compute(lambda: torch.set_num_threads(variant.threads or previous))
                try:
                    threads_used[variant.name].append(compute(torch.get_num_threads))
                    result = run_kvlab(variant.loaded, ids, [variant.spec], 3 if rep == 0 else n)["results"][0]
                finally:
                    compute(lambda: torch.set_num_threads(previous))
                if rep:
                    tok_s[variant.name].append(result.decode_tok_s)
    finally:
        del half
    rows = []
    for variant in variants:
        weights = weight_bytes(variant.loaded.model)
        bound = best * 1e9 / weights
        rows.append({"name": variant.name, "weight_bytes": weights, "tok_s": summarize(tok_s[variant.name]),
                     "compute_threads": sorted(set(threads_used[variant.name])),
                     "bound_tok_s": bound, "fraction": summarize([v / bound for v in tok_s[variant.name]])})
    default = rows[0]
    top = max(rows, key=lambda r: r["fraction"]["median"])
    reason = (f"{default['tok_s']['median']:.1f} tok/s of a {default['bound_tok_s']:.1f} tok/s bound "
              f"({default['weight_bytes'] / 1e6:.0f} MB of weights per token at {best:.1f} GB/s); best lever here: "
              f"{top['name']} at {top['fraction']['median']:.0%} of its bound ({top['tok_s']['median']:.1f} tok/s)")
    check = make_check("roofline", f"{default['name']}: decode tok/s / bandwidth bound", default["fraction"]["values"],
                       f"report (was ≈ {ROOFLINE_BEFORE})", None, reason, unit="fraction")
    return {"new_tokens": n, "copy_bytes": nbytes,
            "copy_bandwidth_gb_s": {k: summarize(v) for k, v in bandwidth.items()},
            "bandwidth_gb_s": best, "bandwidth_from": f"best of {COPY_SAMPLES} copies, {where}",
            "bandwidth_note": ("copy bandwidth counts bytes read + bytes written (STREAM convention); the bound takes "
                               "the best copy, since noise only ever lowers it"),
            "variants": rows, "skipped_variants": skipped, "checks": [check]}


RUNNERS = {
    "overhead": bench_overhead,
    "fair": bench_fair,
    "parallel": bench_parallel,
    "scaling": bench_scaling,
    "startup": bench_startup,
    "roofline": bench_roofline,
}


# ---------------------------------------------------------------- whole run


def machine_info() -> dict:
    import psutil
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def run_bench(size: BenchSize, only: Sequence[str] = SECTIONS, say: Callable[[str], None] | None = None,
              profile_dir: Path | None = None) -> dict:
    """Measure the chosen sections on the bundled model (fp32 on CPU); returns the JSON-ready record.

    A section that fails is recorded as `{"error": ...}` and the others still run.
    Raises `kvlab.models.ModelLoadError` when the model cannot load.
    """
    from .generation import encode_prompt
    from .models import ModelSpec, load_model

    say = say or (lambda message: None)
    started = time.perf_counter()
    record = {"kvlab_bench": RECORD_VERSION, "size": asdict(size), "sections_run": list(only),
              "machine": machine_info(), "load_average_start": load_average(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    say("loading the bundled model")
    loaded = load_model(ModelSpec(device="cpu"), progress=lambda fraction, message: say(message))
    record["model"] = loaded.info()
    ctx = Context(loaded, size, encode_prompt(loaded.tokenizer, PROMPT), say, profile_dir)
    record["sections"] = {}
    for name in only:
        section_started = time.perf_counter()
        try:
            section = RUNNERS[name](ctx)
        except Exception as err:  # noqa: BLE001 - one failing section must not hide the others
            failed = make_check(name, f"{name} did not run", [], "—", None, f"{type(err).__name__}: {err}")
            section = {"error": failed["reason"], "checks": [dict(failed, met=False)]}
        section["elapsed_s"] = time.perf_counter() - section_started
        record["sections"][name] = section
    add_bandwidth_floor(record["sections"])
    record["checks"] = [check for section in record["sections"].values() for check in section["checks"]]
    record["load_average_end"] = load_average()
    record["elapsed_s"] = time.perf_counter() - started
    return record


def add_bandwidth_floor(sections: dict) -> None:
    """When parallel mode missed its target and the roofline section ran, add the floor the roofline implies to
    the parallel check's reason: one column alone already uses a fraction f of the memory bandwidth, so columns
    sharing that bandwidth cannot take less than about f of the sequential time."""
    parallel, roofline = sections.get("parallel", {}), sections.get("roofline", {})
    if "variants" not in roofline or "checks" not in parallel or parallel["checks"][0]["met"] is not False:
        return
    fraction = roofline["variants"][0]["fraction"]["median"]
    parallel["bandwidth_floor"] = fraction
    parallel["checks"][0]["reason"] += (f". One column alone already decodes at {fraction:.2f} of the memory-"
                                        f"bandwidth bound (roofline section), so even perfect overlap cannot go "
                                        f"below about {fraction:.2f} of the sequential time here")


# ---------------------------------------------------------------- text


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def _spread(stats: dict | None, unit: str = "", scale: float = 1.0) -> str:
    if not stats:
        return "—"
    return (f"{_num(stats['median'] * scale, unit)} "
            f"[{_num(stats['min'] * scale)}–{_num(stats['max'] * scale)}]")


def status_of(check: dict) -> str:
    if check["met"] is True:
        return "met"
    if check["met"] is False:
        return f"MISSED ({check['reason']})"
    return f"n/a ({check['reason']})" if check["value"] is None else "reported"


def check_rows(record: dict) -> list[list[str]]:
    rows = []
    for check in record["checks"]:
        unit = "s" if check["unit"] == "s" else ""
        value = _num(check["value"], unit)
        if check["min"] is not None:
            value += f" [{_num(check['min'])}–{_num(check['max'])}]"
        rows.append([check["section"], check["name"], value, check["target"], status_of(check)])
    return rows


def detail_lines(record: dict) -> list[str]:
    """Per-section figures behind the checks (median [min–max])."""
    lines = []
    sections = record["sections"]
    if "overhead" in sections and "rows" in sections["overhead"]:
        s = sections["overhead"]
        lines.append(f"overhead ({s['new_tokens']} new tokens, {s['prompt_tokens']}-token prompt, tok/s):")
        for r in s["rows"]:
            lines.append(f"  {r['strategy']:<16} bare {_spread(r['bare_tok_s'])}  kvlab {_spread(r['kvlab_tok_s'])}  "
                         f"kvlab outside forward {_spread(r['kvlab_outside_forward_ms_per_token'], 'ms/token')}")
    if "fair" in sections and "rows" in sections["fair"]:
        lines.append("fair (median per-token latency, ms):")
        for r in sections["fair"]["rows"]:
            lines.append(f"  {r['strategy']:<16} together {_spread(r['together_ms'])}  alone {_spread(r['alone_ms'])}")
    if "parallel" in sections and "rows" in sections["parallel"]:
        lines.append("parallel (wall time for 4 columns, s; cores busy):")
        for r in sections["parallel"]["rows"]:
            lines.append(f"  {r['mode']:<16} {_spread(r['elapsed_s'])}  cores {_spread(r['cores_busy'])}")
    if "scaling" in sections and "series" in sections["scaling"]:
        s = sections["scaling"]
        lines.append("scaling (per-token latency ms | cache MiB) at " + ", ".join(map(str, s["lengths"])) + " tokens:")
        for label, series in s["series"].items():
            lat = " ".join(_num(x["median"]) if x else "—" for x in series["latency_ms"])
            mib = " ".join(_num(x["median"] / 2**20) if x else "—" for x in series["cache_bytes"])
            lines.append(f"  {label:<16} {lat} | {mib}" + (f"  ({series['error']})" if "error" in series else ""))
    if "startup" in sections and "checks" in sections["startup"] and "error" not in sections["startup"]:
        lines.append("startup (s from process start):")
        for name in ("first", "second"):
            part = sections["startup"].get(name, {})
            if "ready_s" in part:
                lines.append(f"  {name:<16} imports {_spread(part['imports_s'])}  lazy imports done "
                             f"{_spread(part['lazy_imports_s'])}  ready {_spread(part['ready_s'])}  "
                             f"first token {_spread(part['first_token_s'])}")
            else:
                lines.append(f"  {name:<16} {part.get('skipped', '—')}")
        app = sections["startup"].get("app_second")
        if app:
            lines.append(f"  {'app.py second':<16} page served {_spread(app['served_s'])}  model ready "
                         f"{_spread(app['ready_s'])}  (import gradio alone "
                         f"{_spread(sections['startup']['gradio_import_s'])})")
    if "roofline" in sections and "variants" in sections["roofline"]:
        s = sections["roofline"]
        lines.append(f"roofline (copy bandwidth {s['bandwidth_gb_s']:.1f} GB/s read+write, {s['bandwidth_from']}; "
                     f"medians: " + ", ".join(f"{k} {v['median']:.1f}" for k, v in s["copy_bandwidth_gb_s"].items()) + "):")
        for r in s["variants"]:
            lines.append(f"  {r['name']:<28} {_spread(r['tok_s'], 'tok/s')}  bound {_num(r['bound_tok_s'], 'tok/s')}  "
                         f"= {_spread(r['fraction'])}")
        for r in s.get("skipped_variants", []):
            lines.append(f"  {r['name']:<28} skipped: {r['reason']}")
    for name, section in sections.items():
        if "error" in section:
            lines.append(f"{name}: did not run: {section['error']}")
    return lines


def machine_line(record: dict) -> str:
    m = record["machine"]
    load = record.get("load_average_start")
    return (f"{m['cpu']}, {m['cores_available']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, {m['platform']}; "
            f"torch {m['torch']} ({m['torch_threads']} threads), transformers {m['transformers']}"
            + (f"; load average at start {load[0]:.2f}" if load else ""))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


HEADERS = ["section", "check", "median [min–max]", "target", "status"]


def format_report(record: dict) -> str:
    """The printed report: machine, per-section figures, then the checks table."""
    size = record["size"]
    head = (f"kvlab bench, size {size['name']} ({size['repeats']} repeats), {record['elapsed_s']:.0f} s; "
            f"{record['model']['name']} {record['model']['dtype']} on {record['model']['device']}")
    return "\n".join([head, machine_line(record), "", *detail_lines(record), "",
                      format_table(HEADERS, check_rows(record))])


def format_markdown(record: dict) -> str:
    """The checks table as Markdown, with the machine it came from (for the README)."""
    rows = [[cell.replace("|", "\\|") for cell in row] for row in check_rows(record)]
    command = record.get("command") or f"python -m kvlab bench --size {record['size']['name']}"
    lines = [f"Measured {record['started']} with `{command}` on "
             f"{machine_line(record)}.", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- command line


def parse_only(text: str | None) -> list[str]:
    if text is None:
        return list(SECTIONS)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"unknown section(s) {unknown or names}; allowed: {','.join(SECTIONS)}")
    return [name for name in SECTIONS if name in names]


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure kvlab's own overhead, fairness, scaling, start-up and roofline")
    p.add_argument("--size", choices=list(SIZES), default="full",
                   help="smoke: under a minute on 2 quiet cores, checks the plumbing; small: a few minutes; "
                        "full (default): the README figures, about half an hour on 2 cores")
    p.add_argument("--only", help=f"comma list of sections: {','.join(SECTIONS)}")
    p.add_argument("--repeats", type=int, help="repeats per figure, scaling included (overrides the size's)")
    p.add_argument("--json", default=str(DEFAULT_OUTPUT / "bench.json"), help="write the record here")
    p.add_argument("--plots", default=str(DEFAULT_OUTPUT / "plots"), help="write PNG plots (and profiles) into this folder")
    p.add_argument("--markdown", help="also write the checks table as Markdown (for the README)")
    p.set_defaults(func=cmd_bench)


def check_outputs(files: list[Path], folder: Path) -> None:
    """Create the output folders and make sure each file can be written, before a run that may take half an hour.

    Raises:
        OSError: a folder cannot be created or a file cannot be opened for writing.
    """
    for path in files:
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a file")
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "a"):
            pass
        if not existed:
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def cmd_bench(args) -> int:
    import dataclasses

    from .models import ModelLoadError

    try:
        only = parse_only(args.only)
        size = SIZES[args.size]
        if args.repeats is not None:
            if args.repeats < 1:
                raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
            size = dataclasses.replace(size, repeats=args.repeats, scaling_repeats=args.repeats,
                                       startup_repeats=args.repeats)
        if args.markdown and Path(args.markdown).resolve() == Path(args.json).resolve():
            raise ValueError("--json and --markdown name the same file; give them different paths")
    except ValueError as err:
        print(f"kvlab bench: {err}", file=sys.stderr)
        return 2
    plots = Path(args.plots)
    try:
        check_outputs([Path(args.json)] + ([Path(args.markdown)] if args.markdown else []), plots)
    except OSError as err:
        print(f"kvlab bench: cannot write the results where asked ({err}); nothing was measured", file=sys.stderr)
        return 2

    def say(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)  # unwinds the `finally` blocks: child app.py stopped, temp folders removed

    previous_handler = signal.signal(signal.SIGTERM, terminate)
    try:
        record = run_bench(size, only, say, profile_dir=plots)
    except ModelLoadError as err:
        print(f"kvlab bench: {err}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    from .bench_plots import draw_all

    record["command"] = " ".join([f"python -m kvlab bench --size {args.size}"]
                                 + ([f"--only {','.join(only)}"] if args.only is not None else [])
                                 + ([f"--repeats {args.repeats}"] if args.repeats is not None else []))
    try:
        record["plots"] = [str(path) for path in draw_all(record, plots)]
    finally:
        Path(args.json).write_text(json.dumps(record, indent=1))  # the measurement is kept even if plotting fails
    print(format_report(record))
    print(f"wrote {args.json} and {len(record['plots'])} plots in {plots}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(record))
        print(f"wrote {args.markdown}", file=sys.stderr)
    return 0
