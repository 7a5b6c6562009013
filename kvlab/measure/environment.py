"""Where a measurement was taken: the machine, the libraries and the model's dtype and device.

Every run record (`python -m kvlab compare --json`, the page's export) and the
benchmark's record carry this, so a figure read later, replayed elsewhere or
shared says what produced it. Reads only; imports no gradio (its version is
read from the installed package's metadata).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path

import kvlab

REPO_ROOT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT_S = 2.0


def cores_available() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the platform has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")
"""The fields of a `psutil.cpu_times` record counted as a CPU taken: work done on it (guest time is already inside
user and nice) and steal, the time a virtual machine's CPU waited for the host to run it."""


def taken_cpu_s() -> float | None:
    """CPU seconds taken so far on the CPUs this process may run on (`os.sched_getaffinity`), summed over them
    (BUSY_FIELDS of `psutil.cpu_times(percpu=True)`); None where the platform reports no per-CPU times."""
    import psutil

    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (AttributeError, NotImplementedError, OSError):
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    return sum(getattr(per_cpu[i], name, 0.0) for i in mine if i < len(per_cpu) for name in BUSY_FIELDS)


def process_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) process `pid` (default: this one) has used so far."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class OtherWork:
    """How much of the machine other processes took while this one measured: from its creation to `cores()`,
    the CPU seconds taken on this process's CPUs (`taken_cpu_s`) less this process's own (`process_cpu_s`),
    over the wall seconds, in cores (1.0: one whole core all the time). Unlike the load average, it counts
    neither this process's own work before the run nor its threads waiting for the interpreter, and it has no
    minute-long lag. Reads `/proc` through psutil; on a platform without per-CPU times `cores()` is None."""

    def __init__(self):
        self._start = (time.perf_counter(), taken_cpu_s(), process_cpu_s())

    def cores(self) -> float | None:
        """Other processes' mean cores since creation (≥ 0), or None where it cannot be told."""
        wall0, taken0, own0 = self._start
        taken, wall = taken_cpu_s(), time.perf_counter() - wall0
        if taken is None or taken0 is None or wall <= 0:
            return None
        return max(0.0, (taken - taken0) - (process_cpu_s() - own0)) / wall


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """An installed distribution's version, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def kvlab_commit() -> str | None:
    """The git commit kvlab runs from (with `+dirty` when files differ from it), or None outside a checkout."""
    if not (REPO_ROOT / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=GIT_TIMEOUT_S, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def machine() -> dict:
    """CPU model, cores, memory (bytes), platform, Python and library versions, torch threads, CUDA device."""
    import psutil
    import torch

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": props.name, "memory_bytes": props.total_memory, "count": torch.cuda.device_count()}
    return {
        "cpu": cpu_model(),
        "cores_available": cores_available(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "kvlab": kvlab.__version__,
        "kvlab_commit": kvlab_commit(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "gradio": package_version("gradio"),
        "torch_threads": torch.get_num_threads(),
        "cuda": gpu["name"] if gpu else None,
        "gpu": gpu,
    }


def environment(loaded=None) -> dict:
    """`machine()` plus the model's dtype and device when a loaded model is given, and the load average now."""
    record = machine()
    record["load_average"] = load_average()
    if loaded is not None:
        record["dtype"] = str(loaded.model.dtype).removeprefix("torch.")
        record["device"] = str(loaded.device)
    return record
