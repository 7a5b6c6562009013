"""One whole bench run: load the bundled model, run the chosen sections in order, return the JSON-ready record.

The record holds the machine, the model, the size, each section's figures and
checks (a failing section is recorded as `{"error": ...}` and the others still
run), all checks in one list, and the load average before and after. This
module orchestrates and measures; it prints, plots and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from .fair import bench_fair
from ..measure.environment import cores_available, load_average
from .e2e import bench_e2e
from .harness import EXTRA_SECTIONS, PROMPT, RECORD_VERSION, SECTIONS, BenchSize, Context, make_check
from .needle import bench_needle
from .overhead import bench_overhead
from .parallel import bench_parallel
from .planning import bench_planning
from .report import bench_report
from .roofline import bench_roofline
from .scaling import bench_scaling
from .startup import bench_startup

RUNNERS = {
    "overhead": bench_overhead,
    "fair": bench_fair,
    "parallel": bench_parallel,
    "scaling": bench_scaling,
    "startup": bench_startup,
    "roofline": bench_roofline,
    "plan": bench_planning,
    "e2e": bench_e2e,
    "needle": bench_needle,
    "report": bench_report,
}
"""Each section's function, in `SECTIONS` order (a unit test holds them equal)."""


def machine_info() -> dict:
    """CPU model, cores, memory (bytes), platform and library versions, torch threads, CUDA device if any
    (`kvlab.measure.environment.machine`)."""
    from ..measure.environment import machine

    return machine()


def run_bench(size: BenchSize, only: Sequence[str] = SECTIONS, say: Callable[[str], None] | None = None,
              profile_dir: Path | None = None, strategies: dict[str, dict] | None = None) -> dict:
    """Measure the chosen sections on the bundled model (fp32 on CPU); returns the JSON-ready record.

    `strategies` (label -> spec, from `--strategies`) replaces the overhead, fair and
    scaling sections' sets; None keeps their defaults. A section that fails is
    recorded as `{"error": ...}` and the others still run.

    Raises:
        kvlab.models.ModelLoadError: the model cannot load.
    """
    from ..generation import encode_prompt
    from ..models.loading import ModelSpec, load_model

    say = say or (lambda message: None)
    started = time.perf_counter()
    # 1. What the run is about, before anything loads.
    record = {"kvlab_bench": RECORD_VERSION, "size": asdict(size), "sections_run": list(only),
              "machine": machine_info(), "load_average_start": load_average(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    if strategies is not None:
        record["strategies"] = strategies
    # 2. The model, once for every section.
    say("loading the bundled model")
    loaded = load_model(ModelSpec(device="cpu"), progress=lambda fraction, message: say(message))
    record["model"] = loaded.info()
    ctx = Context(loaded, size, encode_prompt(loaded.tokenizer, PROMPT), say, profile_dir, strategies)
    # 3. The sections, each on its own: one failing must not hide the others.
    record["sections"] = {name: run_section(name, ctx) for name in only}
    # 4. What one section's figures say about another's, then every check in one list.
    add_bandwidth_floor(record["sections"])
    record["checks"] = [check for section in record["sections"].values() for check in section["checks"]]
    record["load_average_end"] = load_average()
    record["elapsed_s"] = time.perf_counter() - started
    return record


def run_section(name: str, ctx: Context) -> dict:
    """One section's record with its `elapsed_s` (seconds); an exception becomes `{"error", "checks"}`."""
    section_started = time.perf_counter()
    try:
        section = (RUNNERS[name] if name in RUNNERS else EXTRA_SECTIONS[name].run)(ctx)
    except Exception as err:  # noqa: BLE001 - one failing section must not hide the others
        failed = make_check(name, f"{name} did not run", [], "—", None, f"{type(err).__name__}: {err}")
        section = {"error": failed["reason"], "checks": [dict(failed, met=False)]}
    section["elapsed_s"] = time.perf_counter() - section_started
    return section


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
