"""SIGTERM ends `python app.py` within a few seconds, with one log line: what a Hugging Face Space, Docker or
systemd sends to stop or restart the app.

Why a handler at all: in a container the app is process 1, and Linux does not deliver a signal to process 1
that it has no handler for. Without one, SIGTERM is ignored and the app keeps running (and computing) until the
platform's SIGKILL (Docker's default: 10 s later). Outside a container the default action kills the process at
once, without a word in the log.

`SigtermExit.install()` (app.py calls it before the model starts loading) sets the handler and registers
`finish` to run at exit; `restore()` undoes both. On SIGTERM the handler, in the main thread where Python runs
signal handlers:
1. logs one line (`kvlab: SIGTERM: stopping ...`) on kvlab's logger;
2. closes kvlab's compute (`kvlab.compute.close`): calls waiting for the compute thread are cancelled and new
   ones raise, and every `kvlab.engine` loop (a run's columns, a chat turn, a perplexity pass, a warm-up)
   stops before its next forward, as if its stop event were set; the forward running now finishes;
3. starts a watchdog that ends the process with the same status EXIT_DEADLINE_S after the signal if the
   orderly exit has not finished by then (a long forward, say);
4. raises `SystemExit(EXIT_TERMINATED)` in the main thread. That unwinds `launch()`, whose `finally` closes
   gradio's server (`kvlab.ui.hosting.server.close_promptly`), and app.py then calls `finish()`: one more line
   (`kvlab: SIGTERM: stopped`), and the process ends with `os._exit`. The interpreter's own teardown (freeing
   every module and the model's tensors, which took several seconds on a busy 2-core machine) is skipped: by
   then every file is complete, and nothing kvlab keeps needs it. A SIGTERM during start-up, before the server
   runs, ends the same way through the exit hook.

The exit status is EXIT_TERMINATED, 143 = 128 + SIGTERM, after this clean shutdown: what shells and supervisors
report for a process ended by SIGTERM, so a requested stop stays distinct from a crash or a refused setting
(1, 2). Re-raising the signal after clean-up would give that status too on a workstation, but is ignored again
as process 1.

Nothing half-written is left where a later start reads: those files are written whole
(`kvlab.models.atomic`); a conversion cut off stays in its staging folder, which the next conversion removes.
A second SIGTERM while exiting changes nothing. This module imports neither gradio nor torch.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading

from kvlab.compute import close as close_compute

logger = logging.getLogger("kvlab.shutdown")
EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit status after SIGTERM (143)."""
EXIT_DEADLINE_S = 4.0
"""Seconds from SIGTERM to the end of the process at most: the watchdog ends it then (os._exit)."""
TERMINATING = "SIGTERM: stopping the running work and closing the server (exit status %d within %.0f s)"
TOO_SLOW = "SIGTERM: the orderly exit took over %.0f s: ending now"
STOPPED = "SIGTERM: stopped (exit status %d)"


def _end_process(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


class SigtermExit:
    """The app's SIGTERM handler (see the module's docstring). `terminating` is set once SIGTERM arrived."""

    def __init__(self, deadline_s: float = EXIT_DEADLINE_S):
        self.deadline_s = deadline_s
        self.terminating = threading.Event()
        self._previous = None
        self._installed = False
        self._watchdog: threading.Timer | None = None

    def install(self) -> bool:
        """Set the handler and register `finish` to run at exit (main thread only; elsewhere nothing is
        installed and False is returned)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        atexit.register(self.finish)
        self._installed = True
        return True

    def restore(self) -> None:
        """Put back the handler that was there before `install`, unregister `finish` and stop the watchdog a
        SIGTERM started (nothing when it was not installed)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            atexit.unregister(self.finish)
            self._installed = False

    def finish(self) -> None:
        """After SIGTERM: log that the app stopped and end the process now with EXIT_TERMINATED (`os._exit`,
        output flushed). Without SIGTERM it does nothing."""
        if self.terminating.is_set():
            logger.warning(STOPPED, EXIT_TERMINATED)
            _end_process(EXIT_TERMINATED)

    def _handle(self, signum, frame) -> None:
        if self.terminating.is_set():
            return
        self.terminating.set()
        logger.warning(TERMINATING, EXIT_TERMINATED, self.deadline_s)
        close_compute()
        self._watchdog = threading.Timer(self.deadline_s, self._too_slow)
        self._watchdog.daemon = True
        self._watchdog.name = "kvlab-exit-watchdog"
        self._watchdog.start()
        raise SystemExit(EXIT_TERMINATED)

    def _too_slow(self) -> None:
        logger.warning(TOO_SLOW, self.deadline_s)
        _end_process(EXIT_TERMINATED)
