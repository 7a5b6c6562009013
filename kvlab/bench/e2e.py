"""e2e section: what a user waits for, from Run to the finished summary, against bare transformers.

The quickstart preset's columns (those that can run here) through `kvlab.compare.runner.run_compare` as the app and
the CLI run them (fair mode, with fidelity scoring, the default timing policy), and with each optional pass
changed (each other timing policy of `kvlab.measure.POLICIES`, fidelity off), against bare `model.generate`
of the same columns one after another (`harness.bare_generate`). Both sides in one process after the model is loaded (start-up is the
startup section's), the same number of tokens (end-of-sequence ignored), the conditions interleaved and
rotated so the machine's drift hits all of them. Reports kvlab seconds / bare seconds per condition. This
module measures and builds the record; it prints and draws nothing.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time

from ..measure import DEFAULT_POLICY, POLICIES
from .harness import Context, make_check, rotated, summarize
from .sides import bare_generate

PRESET = "quickstart"
E2E_TARGET = 1.3
"""Default quickstart (fair, fidelity, default timing) seconds over bare transformers', at most."""
CONDITIONS = {
    "default": {},
    **{f"{policy} timing": {"timing_policy": policy} for policy in POLICIES if policy != DEFAULT_POLICY},
    "no fidelity": {"fidelity": False},
}
"""Condition -> the generation settings it changes from the preset's (the default's: fidelity on, the default
timing policy)."""


def _preset_run(ctx: Context):
    """(prompt ids (1, seq), runnable column specs, settings with the section's token count)."""
    from ..generation import encode_prompt
    from ..presets import load_preset, presets_dir
    from ..strategies import make_strategy

    preset = load_preset(presets_dir() / f"{PRESET}.yaml")
    ids = encode_prompt(ctx.loaded.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    specs = [spec for spec in preset.columns if not make_strategy(dict(spec)).unavailable_reason(ctx.loaded)]
    tokens = preset.generation.max_new_tokens if ctx.size.name == "full" else ctx.size.new_tokens
    settings = dataclasses.replace(preset.settings(), max_new_tokens=tokens, stop_at_eos=False)
    return ids, specs, settings, preset.mode


def _bare_s(ctx: Context, ids, specs: list[dict], tokens: int) -> float:
    """Seconds of bare generate for every column, one after another (each on the compute thread)."""
    from ..compute import compute

    gc.collect()
    return sum(compute(bare_generate(ctx.loaded, ids, dict(spec), tokens)) for spec in specs)


def _kvlab_s(ctx: Context, ids, specs: list[dict], settings, mode: str) -> float:
    """Seconds from the start of a run to its RunDone (every event consumed)."""
    from ..compare.runner import collect, run_compare

    gc.collect()
    started = time.perf_counter()
    collect(run_compare(ctx.loaded, ids, [dict(spec) for spec in specs], settings, mode, threading.Event()))
    return time.perf_counter() - started


def bench_e2e(ctx: Context) -> dict:
    """{preset, new_tokens, columns, bare_s, conditions: {name: {seconds, ratio}}, checks}; seconds are wall
    seconds of the whole run, ratio is kvlab / bare of the same repeat."""
    ids, specs, settings, mode = _preset_run(ctx)
    tokens = settings.max_new_tokens
    ctx.say(f"e2e: warm-up of {len(specs)} columns (bare and kvlab, not timed)")
    _bare_s(ctx, ids, specs, tokens)
    _kvlab_s(ctx, ids, specs, dataclasses.replace(settings, fidelity=False), mode)
    sides = ["bare", *CONDITIONS]
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    loads = []
    for rep in range(ctx.size.repeats):
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
        for side in rotated(sides, rep):
            ctx.say(f"e2e: repeat {rep + 1}, {side}")
            if side == "bare":
                seconds[side].append(_bare_s(ctx, ids, specs, tokens))
            else:
                changed = dataclasses.replace(settings, **CONDITIONS[side])
                seconds[side].append(_kvlab_s(ctx, ids, specs, changed, mode))
    conditions = {side: {"seconds": summarize(seconds[side]),
                         "ratio": summarize([k / b for k, b in zip(seconds[side], seconds["bare"])])}
                  for side in CONDITIONS}
    checks = [make_check("e2e", f"{PRESET}, {name}: Run to summary / bare transformers", cond["ratio"]["values"],
                         f"≤ {E2E_TARGET}" if name == "default" else "—",
                         (lambda v: v <= E2E_TARGET) if name == "default" else None,
                         f"{cond['seconds']['median']:.1f} s against {summarize(seconds['bare'])['median']:.1f} s bare")
              for name, cond in conditions.items()]
    return {"preset": PRESET, "new_tokens": tokens, "columns": [spec["strategy"] for spec in specs],
            "bare_s": summarize(seconds["bare"]), "conditions": conditions, "load_average": loads,
            "checks": checks}
