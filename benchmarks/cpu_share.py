"""Who used the machine's cores while the app section ran a path: the app, the browser, the bench itself and
the rest of the machine, per run.

A daemon thread samples every SAMPLE_S seconds: the cumulative CPU seconds (user + system) of each
descendant process of the bench (`psutil`), sorted into `app` (the app process and its children), `browser`
(Chromium's processes) and `bench` (this process and its other children: Playwright's driver, gradio_client),
and the machine's busy seconds (`psutil.cpu_times`, `busy_cpu_s`). `rest` is the machine's
busy time less those three: other processes and the kernel, and also the last SAMPLE_S seconds at most of
a process that ended between two samples (its time is in the machine's total but no longer in a snapshot).
Each share is CPU seconds over the run's wall seconds, in cores (2.0 = both cores of a 2-core machine all
the time).
"""

from __future__ import annotations

import threading
import time

import psutil

SAMPLE_S = 1.0
KINDS = ("app", "browser", "bench", "rest")


def busy_cpu_s(times) -> float:
    """Busy seconds in one `psutil.cpu_times()` record: user, nice, system, irq, softirq (guest time is
    already inside user and nice; idle, iowait and steal are not work done here)."""
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))


def _busy_s() -> float:
    return busy_cpu_s(psutil.cpu_times())


def _cpu_s(proc: psutil.Process) -> float | None:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


def _is_browser(proc: psutil.Process) -> bool:
    try:
        name = proc.name().lower()
    except psutil.Error:
        return False
    return "chrom" in name or "headless_shell" in name


class CpuShares:
    """Context manager sampling CPU use by kind while it is open; `mark(label)` starts a new run (the time
    until the next mark or the exit is counted under `label`); `shares` maps each label to its kinds' cores
    and `wall_s`. `app_pid` (set once the app runs) picks out the app's process tree."""

    def __init__(self, sample_s: float = SAMPLE_S):
        self.sample_s, self.app_pid, self.label = sample_s, None, None
        self.seconds: dict[str, dict[str, float]] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kvlab-cpu-share")

    def __enter__(self) -> "CpuShares":
        self._busy, self._at = _busy_s(), time.perf_counter()
        self._last = self._snapshot()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def mark(self, label: str | None) -> None:
        """Count from now on under `label` (None: count nothing until the next mark)."""
        with self._lock:
            self._sample_locked()
            self.label = label

    @property
    def shares(self) -> dict[str, dict[str, float]]:
        """label -> {kind: cores, ..., "wall_s": seconds}."""
        out = {}
        for label, secs in self.seconds.items():
            wall = secs["wall_s"]
            out[label] = {**{kind: (secs.get(kind, 0.0) / wall if wall > 0 else None) for kind in KINDS},
                          "wall_s": wall}
        return out

    def _kind(self, proc: psutil.Process, app_tree: set[int]) -> str:
        if proc.pid in app_tree:
            return "app"
        return "browser" if _is_browser(proc) else "bench"

    def _snapshot(self) -> dict[int, tuple[str, float]]:
        app_tree: set[int] = set()
        if self.app_pid is not None:
            try:
                app = psutil.Process(self.app_pid)
                app_tree = {app.pid, *(p.pid for p in app.children(recursive=True))}
            except psutil.Error:
                pass
        procs = [self._me, *self._me.children(recursive=True)]
        snap = {}
        for proc in procs:
            cpu = _cpu_s(proc)
            if cpu is not None:
                snap[proc.pid] = (self._kind(proc, app_tree), cpu)
        return snap

    def _loop(self) -> None:
        while not self._stop.wait(self.sample_s):
            self._sample()

    def _sample(self) -> None:
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> None:
        snap, busy, at = self._snapshot(), _busy_s(), time.perf_counter()
        if self.label is not None:
            secs = self.seconds.setdefault(self.label, {"wall_s": 0.0})
            used = 0.0
            for pid, (kind, cpu) in snap.items():
                before = self._last.get(pid)  # a process new since the last sample: all its time is in this interval
                delta = max(0.0, cpu - before[1]) if before else cpu
                secs[kind] = secs.get(kind, 0.0) + delta
                used += delta
            secs["rest"] = secs.get("rest", 0.0) + max(0.0, (busy - self._busy) - used)
            secs["wall_s"] += at - self._at
        self._last, self._busy, self._at = snap, busy, at
