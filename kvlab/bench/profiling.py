"""Where kvlab's runner spends a decode step: one column profiled with pyinstrument, summed by call.

Used by the overhead section to explain a missed target. Returns a one-line
summary and optionally writes the full text profile; it measures no speed of its
own and does nothing when pyinstrument is not installed.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..compute import compute
from .sides import settings_for

PROFILE_INTERVAL_S = 0.0005
TOP_CALLS = 6


def profile_step(loaded, prompt_ids, spec: dict, new_tokens: int, folder: Path | None, tag: str) -> str:
    """Where one column's decode loop spends its time, by call inside `_decode` (pyinstrument).

    The column runs through `run_column` on the compute thread, which profiles itself
    (pyinstrument samples one thread). Returns a one-line summary such as
    `forward 96%, cache_bytes 2%, push 1%`; writes the full text profile into
    `folder` (as `profile_<tag>.txt`) when given. Returns '' when pyinstrument is not installed.
    """
    try:
        from pyinstrument import Profiler
    except ModuleNotFoundError:
        return ""
    from ..columns import Column
    from ..compare.runner import FreeTurns, run_column
    from ..strategies import make_strategy

    events: list = []

    def work():
        profiler = Profiler(interval=PROFILE_INTERVAL_S)
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
    return decode_breakdown(profiler.last_session.root_frame())


def decode_breakdown(root) -> str:
    """`call share%, ...` for the biggest calls under the `_decode` frame of a pyinstrument tree ('' if none).

    The runner's `turns.run(step)` is opened up: the calls inside `step` are counted
    one by one, `step itself` and `run` hold what is left of each.
    """
    decode = _find_frame(root, "_decode")
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
    return ", ".join(f"{name} {t / decode.time:.1%}" for name, t in parts[:TOP_CALLS])


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
