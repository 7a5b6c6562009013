"""e2e section: what a user waits for, from Run to the summary (and to the fidelity figures), against bare
transformers.

The quickstart preset's columns (those that can run here, each with its own token count: `no_cache` makes
fewer) through `kvlab.compare.runner.run_compare` as the app and the CLI run them (fair mode, with fidelity
scoring, the default timing policy), and with each optional pass changed (each other timing policy of
`kvlab.measure.POLICIES`, fidelity off), against bare `model.generate` of the same columns one after another
(`harness.bare_generate`). Both sides in one process after the model is loaded (start-up is the startup
section's), the same number of tokens per column (end-of-sequence ignored), the conditions interleaved and
rotated so the machine's drift hits all of them. Reported, each as kvlab seconds / bare seconds of the same
repeat, both warm: Run -> summary (`SummaryReady`, the target), Run -> fidelity filled in (`RunDone`); and
the process's first Run, which pays the columns' one-time warm-up, against the warm bare median. This module
measures and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import threading
import time

from ..measure import DEFAULT_POLICY, POLICIES
from .harness import Context, make_check, rotated, summarize
from .sides import bare_generate

PRESET = "quickstart"
E2E_TARGET = 1.15
"""Default quickstart (fair, fidelity on, default timing): Run -> summary seconds over bare transformers', at
most, both warm."""
CONDITIONS = {
    "default": {},
    **{f"{policy} timing": {"timing_policy": policy} for policy in POLICIES if policy != DEFAULT_POLICY},
    "no fidelity": {"fidelity": False},
}
"""Condition -> the generation settings it changes from the preset's (the default's: fidelity on, the default
timing policy)."""


def _column_tokens(spec: dict, tokens: int, preset_tokens: int) -> dict:
    """The spec with its own `max_new_tokens` override scaled to the section's token count (at least 1)."""
    own = (spec.get("generation") or {}).get("max_new_tokens")
    if own is None:
        return dict(spec)
    return {**spec, "generation": {**spec["generation"], "max_new_tokens": max(1, round(own * tokens / preset_tokens))}}


def _preset_run(ctx: Context):
    """(prompt ids (1, seq), runnable column specs with their token counts, settings, mode)."""
    from ..columns import Column
    from ..generation import encode_prompt
    from ..presets import presets_dir
    from ..compare.preset import load_preset

    preset = load_preset(presets_dir() / f"{PRESET}.yaml")
    ids = encode_prompt(ctx.loaded.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    specs = [spec for spec in preset.columns
             if not Column.from_spec(dict(spec)).strategy.unavailable_reason(ctx.loaded)]
    preset_tokens = preset.generation.max_new_tokens
    tokens = preset_tokens if ctx.size.name == "full" else ctx.size.new_tokens
    specs = [_column_tokens(dict(spec), tokens, preset_tokens) for spec in specs]
    settings = dataclasses.replace(preset.settings(), max_new_tokens=tokens, stop_at_eos=False)
    return ids, specs, settings, preset.mode


def _strategy_spec(spec: dict) -> dict:
    return {key: value for key, value in spec.items() if key != "generation"}


def _bare_s(ctx: Context, ids, specs: list[dict], tokens: int) -> float:
    """Seconds of bare generate for every column, one after another (each on the compute thread), each making
    its own token count."""
    from ..compute import compute

    gc.collect()
    return sum(compute(bare_generate(ctx.loaded, ids, _strategy_spec(spec),
                                     (spec.get("generation") or {}).get("max_new_tokens", tokens)))
               for spec in specs)


def _kvlab_s(ctx: Context, ids, specs: list[dict], settings, mode: str) -> tuple[float, float]:
    """(seconds from the start of a run to its SummaryReady, to its RunDone), every event consumed."""
    from ..compare.events import SummaryReady
    from ..compare.runner import run_compare
    from ..protocol import RunDone

    gc.collect()
    started, summary_s, done = time.perf_counter(), None, None
    for event in run_compare(ctx.loaded, ids, [dict(spec) for spec in specs], settings, mode, threading.Event()):
        if isinstance(event, SummaryReady):
            summary_s = time.perf_counter() - started
        done = event if isinstance(event, RunDone) else done
    if done is None or summary_s is None:
        raise RuntimeError("the run ended without a summary")
    return summary_s, time.perf_counter() - started


def _timed(ctx: Context, ids, specs, settings, mode, tokens) -> tuple[dict, dict, list]:
    """The interleaved repeats: ({side: seconds to the summary}, {condition: seconds to RunDone}, loads)."""
    sides = ["bare", *CONDITIONS]
    summary: dict[str, list[float]] = {side: [] for side in sides}
    done: dict[str, list[float]] = {side: [] for side in CONDITIONS}
    loads = []
    for rep in range(ctx.size.repeats):
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
        for side in rotated(sides, rep):
            ctx.say(f"e2e: repeat {rep + 1}, {side}")
            if side == "bare":
                summary[side].append(_bare_s(ctx, ids, specs, tokens))
            else:
                to_summary, to_done = _kvlab_s(ctx, ids, specs, dataclasses.replace(settings, **CONDITIONS[side]),
                                               mode)
                summary[side].append(to_summary)
                done[side].append(to_done)
    return summary, done, loads


def bench_e2e(ctx: Context) -> dict:
    """{preset, new_tokens, columns, bare_s, first_run, conditions: {name: {seconds, ratio, done_seconds,
    done_ratio}}, checks}; seconds are wall seconds of the whole run to its summary (done_: to RunDone, the
    fidelity figures filled in), ratio is kvlab / bare of the same repeat; first_run: the process's first
    Run (one-time warm-up included) to its summary, and over the warm bare median."""
    ids, specs, settings, mode = _preset_run(ctx)
    tokens = settings.max_new_tokens
    ctx.say(f"e2e: first Run of {len(specs)} columns (pays the one-time warm-up), then bare's warm-up")
    first_summary_s, _ = _kvlab_s(ctx, ids, specs, settings, mode)
    _bare_s(ctx, ids, specs, tokens)
    summary, done, loads = _timed(ctx, ids, specs, settings, mode, tokens)
    bare = summary["bare"]
    conditions = {side: {"seconds": summarize(summary[side]),
                         "ratio": summarize([k / b for k, b in zip(summary[side], bare)]),
                         "done_seconds": summarize(done[side]),
                         "done_ratio": summarize([k / b for k, b in zip(done[side], bare)])}
                  for side in CONDITIONS}
    first = {"seconds": first_summary_s, "ratio": first_summary_s / statistics.median(bare)}
    return {"preset": PRESET, "new_tokens": tokens, "columns": [spec["strategy"] for spec in specs],
            "bare_s": summarize(bare), "first_run": first, "conditions": conditions, "load_average": loads,
            "checks": _checks(conditions, first, summarize(bare)["median"])}


def _checks(conditions: dict, first: dict, bare_s: float) -> list[dict]:
    """The verdict rows: Run -> summary per condition (the default's against E2E_TARGET), the default's Run ->
    fidelity filled in, and the first Run with its warm-up."""
    checks = [make_check("e2e", f"{PRESET}, {name}: Run to summary / bare transformers", cond["ratio"]["values"],
                         f"≤ {E2E_TARGET}" if name == "default" else "—",
                         (lambda v: v <= E2E_TARGET) if name == "default" else None,
                         f"{cond['seconds']['median']:.1f} s against {bare_s:.1f} s bare")
              for name, cond in conditions.items()]
    default = conditions["default"]
    checks.append(make_check("e2e", f"{PRESET}, default: Run to fidelity filled in / bare transformers",
                             default["done_ratio"]["values"], "—", None,
                             f"{default['done_seconds']['median']:.1f} s against {bare_s:.1f} s bare"))
    checks.append(make_check("e2e", f"{PRESET}, first Run (one-time warm-up) to summary / warm bare",
                             [first["ratio"]], "—", None, f"{first['seconds']:.1f} s against {bare_s:.1f} s bare"))
    return checks
