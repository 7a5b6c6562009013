"""The caps that keep one machine shared: named defaults and the environment settings that change them.

`Limits.from_env()` reads them (docs/settings.md lists each); a setting that is not a whole number in range is
a `ValueError` naming it and its value, raised at start-up. This module only reads settings: admission is
`kvlab.sharing.scheduler`'s job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MAX_RUN_STEPS = 4096
"""Token steps one run may cost (`kvlab.sharing.cost.RunCost.steps`): 8 columns × 512 new tokens, or the
Perplexity tab's default run (3 caches × 1,024 tokens) with room to spare."""
MAX_RUN_STEPS_ENV = "KVLAB_MAX_RUN_STEPS"
MAX_RUNS_PER_CLIENT = 2
"""Runs one client (a browser page, an API client's address, an agent's address) may have queued at once,
waiting or running."""
MAX_RUNS_PER_CLIENT_ENV = "KVLAB_MAX_RUNS_PER_CLIENT"
MAX_WAITING = 16
"""Runs that may wait for the model at once, all clients together; the next is refused until one starts."""
MAX_WAITING_ENV = "KVLAB_MAX_WAITING"
MODEL_SLOTS = 1
"""Runs that use the model at once (kvlab's one compute thread serves them in turns)."""
MODEL_SLOTS_ENV = "KVLAB_CONCURRENCY"
FAIR_WINDOW_S = 600.0
"""How far back a client's use of the model counts when the next run is picked (seconds)."""


def whole_setting(name: str, default: int, least: int = 1) -> int:
    """The whole number the environment setting `name` holds, `default` when it is unset or blank.

    Raises:
        ValueError: the setting is not a whole number >= `least`; the message names it and its value.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {text!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """The caps in force. run_steps: token steps per run; runs_per_client: runs queued per client (waiting or
    running); waiting: runs waiting, all clients; slots: runs using the model at once; window_s: how far back
    (seconds) service counts for the fair order."""

    run_steps: int = MAX_RUN_STEPS
    runs_per_client: int = MAX_RUNS_PER_CLIENT
    waiting: int = MAX_WAITING
    slots: int = MODEL_SLOTS
    window_s: float = FAIR_WINDOW_S

    @classmethod
    def from_env(cls) -> "Limits":
        """The caps from KVLAB_MAX_RUN_STEPS, KVLAB_MAX_RUNS_PER_CLIENT, KVLAB_MAX_WAITING and KVLAB_CONCURRENCY
        (each falls back to its default when unset).

        Raises:
            ValueError: a setting is not a whole number >= 1 (>= 0 for KVLAB_MAX_WAITING); the message names it.
        """
        return cls(run_steps=whole_setting(MAX_RUN_STEPS_ENV, MAX_RUN_STEPS, 1),
                   runs_per_client=whole_setting(MAX_RUNS_PER_CLIENT_ENV, MAX_RUNS_PER_CLIENT, 1),
                   waiting=whole_setting(MAX_WAITING_ENV, MAX_WAITING, 0),
                   slots=whole_setting(MODEL_SLOTS_ENV, MODEL_SLOTS, 1))


PROXY_HOPS_ENV = "KVLAB_PROXY_HOPS"
MAX_PROXY_HOPS = 8
"""Most proxies KVLAB_PROXY_HOPS may name."""


def proxy_hops() -> int:
    """KVLAB_PROXY_HOPS: how many proxies in front of the app append to X-Forwarded-For (0 to MAX_PROXY_HOPS);
    unset or blank: 1 on a Hugging Face Space (SPACE_ID set, its own proxy in front), else 0.

    Raises:
        ValueError: the setting is not a whole number from 0 to MAX_PROXY_HOPS; the message names it.
    """
    if not os.environ.get(PROXY_HOPS_ENV, "").strip():
        return 1 if os.environ.get("SPACE_ID") else 0
    hops = whole_setting(PROXY_HOPS_ENV, 0, least=0)
    if hops > MAX_PROXY_HOPS:
        raise ValueError(f"{PROXY_HOPS_ENV} must be a whole number from 0 to {MAX_PROXY_HOPS}, got {hops}")
    return hops
