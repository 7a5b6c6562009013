"""Warm section: on a warm app, is the first Run as fast as the second?

`python app.py` is launched as a user would (`benchmarks.app_section.RunningApp`: a free port, its ready file
says the model is ready, which is after the opening columns' one-time warm-up, `kvlab.ui.compare.warm`);
then the quickstart preset runs twice through its `/compare` API with gradio_client, one run after the other.
Per run: the record's `summary_s` (the run's start to its summary, inside the app), the wall seconds of
the API call (Run to the record, fidelity included), each column's `warm_up_s` (one-time set-up this run
paid) and the load average before it. This is done on `startup_repeats` fresh apps; reported per app:
first / second of both, side by side. The check is the median first / second Run -> summary against
FIRST_RUN_TARGET. Every app is stopped in `finally`. This module measures and builds the record, and
words its lines; it draws nothing.
"""

from __future__ import annotations

import os
import statistics
import time

from kvlab.bench.harness import Context, make_check
from kvlab.bench.text import _num

from .app_section import PRESET, RunningApp, new_tokens_for

FIRST_RUN_TARGET = 1.05
"""First Run -> summary over the second's, at most, on an app whose model is ready."""
API_TIMEOUT_S = 1800


def _one_run(client, ctx: Context) -> dict:
    """One quickstart run through `/compare`: {summary_s, wall_s, warm_up_s (per column), load_average}."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.perf_counter()
    record = client.predict(PRESET, None, new_tokens_for(ctx), api_name="/compare")
    wall = time.perf_counter() - started
    return {"summary_s": record.get("summary_s"), "wall_s": wall, "load_average": load,
            "warm_up_s": [(column.get("timing") or {}).get("warm_up_s") for column in record["columns"]]}


def bench_warm(ctx: Context) -> dict:
    """The section's record: per fresh app its two runs and their ratios, and the check."""
    from gradio_client import Client

    apps = []
    for rep in range(max(1, ctx.size.startup_repeats)):
        with RunningApp(ctx.say) as app:
            client = Client(app.url, verbose=False)
            runs = []
            for label in ("first", "second"):
                ctx.say(f"warm: app {rep + 1}, {label} Run after the model is ready")
                runs.append(_one_run(client, ctx))
        first, second = runs
        apps.append({"first": first, "second": second,
                     "summary_ratio": first["summary_s"] / second["summary_s"],
                     "wall_ratio": first["wall_s"] / second["wall_s"]})
    ratios = [a["summary_ratio"] for a in apps]
    paid = [s for a in apps for s in a["first"]["warm_up_s"] if s]
    reason = (f"the first Runs paid {sum(paid):.1f} s of one-time set-up" if paid else
              "no column of a first Run paid a one-time set-up")
    check = make_check("warm", f"{PRESET}, warm app: first Run -> summary / second Run -> summary", ratios,
                       f"≤ {FIRST_RUN_TARGET}", lambda v: v <= FIRST_RUN_TARGET, reason)
    return {"preset": PRESET, "new_tokens": new_tokens_for(ctx), "apps": apps,
            "summary_ratio": statistics.median(ratios), "checks": [check]}


def warm_lines(s: dict) -> list[str]:
    """Per app: first and second Run -> summary and Run -> record, their ratios, what the first Run paid."""
    tokens = s["new_tokens"] or "the preset's"
    lines = [f"warm ({s['preset']}, {tokens} new tokens, through /compare on a fresh app whose model is ready; "
             "first / second):"]
    for i, app in enumerate(s["apps"], 1):
        first, second = app["first"], app["second"]
        paid = sum(v for v in first["warm_up_s"] if v)
        lines.append(f"  app {i} (load average {_num(first['load_average'])} / {_num(second['load_average'])}): "
                     f"Run -> summary {_num(first['summary_s'], 's')} / {_num(second['summary_s'], 's')} = "
                     f"{app['summary_ratio']:.2f}  Run -> record {_num(first['wall_s'], 's')} / "
                     f"{_num(second['wall_s'], 's')} = {app['wall_ratio']:.2f}  first Run's warm-up "
                     f"{_num(paid, 's')}")
    return lines
