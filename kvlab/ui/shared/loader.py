"""Background model loading for the browser tabs, with progress the page can poll.

`BackgroundLoader` wraps the one shared `kvlab.models.ModelPool`: `start(spec)`
loads on a daemon thread and returns at once, so the page stays usable while
weights load; `status(spec)` says where that load is (fraction, message, error,
model info). A loader made with `warm` steps runs them as the load's last part
(the Compare tab's one-time warm-up of its opening columns,
`kvlab.ui.compare.warm.OpeningWarmUp`; the planner's, `kvlab.ui.plan.warm`):
the load reports their progress and the model counts as ready, here and in the
ready file, once they are done. `get(spec)`
blocks until the model is ready, reusing a load in flight. Load outcomes are
shared by every session, like the weights themselves. (Model-bound events take
their turns in `kvlab.ui.hosting.turns`.) This module does not import gradio.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from kvlab.models import readiness
from kvlab.models.loading import LoadedModel, ModelLoadError, ModelPool, ModelSpec

logger = logging.getLogger(__name__)
WARM_START = 0.9
"""Where a load with a warm-up step stands when its weights are loaded: the rest of the bar is the warm-up."""
WEIGHTS_LOADED = "weights loaded; the one-time warm-up follows"
READY_LOG = "model ready: %s (%.1f s to load)"
"""Logged once per finished load, for whoever reads the server log. A launching process (the benchmark's
start-up section) learns the outcome from `kvlab.models.readiness` instead, which `_load` also calls."""


def device_present(device: str) -> bool:
    """Whether a `kvlab.models.loading.DEVICES` name can be used here (`auto` and `cpu` always can)."""
    import torch

    if device == "cuda":
        return torch.cuda.is_available()
    if device == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return device in ("auto", "cpu")


@dataclass(frozen=True)
class LoadStatus:
    """Where a spec's load stands. state: `idle` (never asked), `loading`, `ready` or `error`."""

    state: str
    fraction: float = 0.0
    message: str = ""
    loaded: LoadedModel | None = None


class BackgroundLoader:
    """Loads specs into `pool` on daemon threads and remembers each load's progress and outcome.

    warm: steps, each called as `step(loaded, progress)` in order on the load's thread once the weights are
    loaded, before the load counts as ready (`progress(fraction, message)` as the load's own); a step returns
    the seconds it spent and must raise nothing.
    """

    def __init__(self, pool: ModelPool, warm: tuple = ()):
        self.pool, self.warm = pool, tuple(warm)
        self._status: dict[ModelSpec, LoadStatus] = {}
        self._threads: dict[ModelSpec, threading.Thread] = {}
        self._guard = threading.Lock()
        self._failures_logged: set[str] = set()

    def status(self, spec: ModelSpec) -> LoadStatus:
        with self._guard:
            status = self._status.get(spec, LoadStatus("idle"))
            thread = self._threads.get(spec)
        if status.state == "loading" and thread is not None and thread.is_alive():
            return status  # weights loading, or loaded and warming up
        loaded = self.pool.loaded(spec)
        if loaded is not None:
            return LoadStatus("ready", 1.0, f"{loaded.name} ready", loaded)
        if status.state == "ready":
            # Loaded once, then dropped from the pool (least recently used): it would load again.
            return LoadStatus("idle")
        return status

    def ready(self, spec: ModelSpec) -> LoadedModel | None:
        """The loaded model when its load, the warm-up step included, is done; None otherwise (never waits)."""
        status = self.status(spec)
        return status.loaded if status.state == "ready" else None

    def start(self, spec: ModelSpec) -> LoadStatus:
        """Begin loading `spec` in the background unless it is loaded or loading; returns its status."""
        with self._guard:
            thread = self._threads.get(spec)
            if self.pool.loaded(spec) is None and (thread is None or not thread.is_alive()):
                self._status[spec] = LoadStatus("loading", 0.0, f"loading {spec.source}…")
                thread = threading.Thread(target=self._load, args=(spec,), daemon=True, name="kvlab-load")
                self._threads[spec] = thread
                thread.start()
        return self.status(spec)

    def get(self, spec: ModelSpec) -> LoadedModel:
        """The loaded model, loading it here if needed (a load in flight is joined, not repeated).

        Raises:
            ModelLoadError: the spec cannot be loaded; the message says why.
        """
        status = self.status(spec)
        if status.state == "ready":
            return status.loaded
        self.start(spec)
        with self._guard:
            thread = self._threads.get(spec)
        if thread is not None:
            thread.join()
        status = self.status(spec)
        if status.loaded is None:
            raise ModelLoadError(status.message or f"could not load {spec.source!r}")
        return status.loaded

    def _load(self, spec: ModelSpec) -> None:
        def progress(fraction: float, message: str) -> None:
            with self._guard:
                self._status[spec] = LoadStatus("loading", fraction, message)

        def loading(fraction: float, message: str) -> None:
            if self.warm:  # the load's own "ready" is not the end of it: the warm-up follows
                fraction, message = fraction * WARM_START, message if fraction < 1 else WEIGHTS_LOADED
            progress(fraction, message)

        started = time.perf_counter()
        try:
            loaded = self.pool.get(spec, progress=loading)
            load_s = time.perf_counter() - started
            if self.warm:
                warm_s = sum(step(loaded, progress) for step in self.warm)
                logger.info("warmed up %s in %.1f s", loaded.name, warm_s)
        except (ModelLoadError, ValueError) as err:
            outcome = LoadStatus("error", 1.0, str(err))
        except Exception as err:  # noqa: BLE001 - any failure is reported on the page, never raised in a thread
            outcome = LoadStatus("error", 1.0, f"could not load {spec.source!r}: {type(err).__name__}: {err}")
        else:
            outcome = LoadStatus("ready", 1.0, f"{loaded.name} ready")  # the pool holds the model, not this record
            self._announce_ready(loaded, load_s)
        if outcome.state == "error":
            self._log_failure(outcome.message)
            readiness.announce(readiness.ERROR, name=spec.source, message=outcome.message)
        with self._guard:
            self._status[spec] = outcome

    def _log_failure(self, message: str) -> None:
        """Log a failed load once per message: the page's preload and the planner's warm-up start a load that
        failed again (a read-only cache folder fails the same way each time), and the log would repeat it."""
        with self._guard:
            if message in self._failures_logged:
                return
            self._failures_logged.add(message)
        logger.warning("model load failed: %s", message)

    @staticmethod
    def _announce_ready(loaded: LoadedModel, load_s: float) -> None:
        """Say once per finished load that `loaded` is ready: the server log line for a human, and one JSON line
        in the ready file (`kvlab.models.readiness`) for a process that launched the app."""
        logger.info(READY_LOG, loaded.name, load_s)
        readiness.announce(readiness.READY, name=loaded.name, load_s=load_s)
