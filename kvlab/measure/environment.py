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
