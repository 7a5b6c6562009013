"""Admission and a fair order for the model slot: who runs next, who is refused, and how long each one waits.

- `admit(client, cost)` refuses, before anything is queued, a run over a cap (`kvlab.sharing.limits.Limits`):
  token steps per run, runs queued per client, runs waiting in all; the `Refused` message is one line that
  names the limit and the setting that changes it. Otherwise the run gets a `Ticket` and waits in line.
- The next run for a free slot is the waiting one whose client has used the model least over the last
  `window_s` seconds (least attained service), earliest first among equals: a visitor who has not run lately
  goes before an agent's tenth run, and no client keeps the slot by queueing many runs.
- `place(ticket)` says where a waiting run stands: its position in that order and the estimated seconds until it
  starts (what runs now has left, plus the runs before it, from `kvlab.sharing.cost.Throughput`). A newcomer may
  be put ahead later, so a position can grow.
- `release(ticket)` ends a run, waiting or running (finished, stopped, failed, or its client gone): its slot or
  place is free at once. A run that finished its work also teaches `Throughput` this machine's rate.

Waiting (`wait`) blocks on a condition variable; the clock is injectable for tests. No gradio, no model.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from .cost import RunCost, Throughput, count_text
from .limits import (
    MAX_RUN_STEPS_ENV,
    MAX_RUNS_PER_CLIENT_ENV,
    MAX_WAITING_ENV,
    Limits,
)


OVERRUN_SHARE = 0.1
"""What a run past its estimate is still expected to take, as a share of that estimate."""


class Refused(ValueError):
    """A run over a cap, refused before it was queued; the message (one line) names the limit and its setting."""


@dataclass(frozen=True)
class Client:
    """Who asked. kind: `visitor` (a browser page, keyed by its session), `api` or `mcp` (keyed by address)."""

    kind: str
    key: str

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


@dataclass(eq=False)
class Ticket:
    """One admitted run: who, its cost, when it was admitted and (once it holds a slot) started."""

    client: Client
    cost: RunCost
    order: int
    admitted_at: float
    started_at: float | None = None
    ended: bool = False


@dataclass(frozen=True)
class Place:
    """Where a waiting run stands: position 1 runs next; wait_s: estimated seconds until it starts."""

    position: int
    wait_s: float

    def describe(self) -> str:
        return f"waiting: position {self.position}, about {max(1, round(self.wait_s))} s"


@dataclass
class _Usage:
    """Model time one client used: (start, end) of its finished runs, oldest first."""

    spans: deque = field(default_factory=deque)


class Scheduler:
    """The model slot(s) shared by every run of the process. `limits`: the caps; `clock`: seconds, monotonic;
    `rate`: the measured seconds per token step."""

    def __init__(self, limits: Limits | None = None, clock=time.monotonic, rate: Throughput | None = None):
        self.limits = limits or Limits()
        self.clock = clock
        self.rate = rate or Throughput()
        self._cond = threading.Condition()
        self._waiting: list[Ticket] = []
        self._running: list[Ticket] = []
        self._usage: dict[Client, _Usage] = {}
        self._orders = itertools.count()

    # ----- admission -----

    def admit(self, client: Client, cost: RunCost) -> Ticket:
        """Queue a run of `cost` for `client`, or refuse it. It starts at once when a slot is free.

        Raises:
            Refused: the run is over the per-run cap, the client has `runs_per_client` runs queued, or
                `waiting` runs wait already; the message says which and names its setting.
        """
        limits = self.limits
        if cost.steps > limits.run_steps:
            raise Refused(f"refused: this run costs {count_text(cost.steps)} token steps ({cost.describe()}); the limit per "
                          f"run here is {limits.run_steps:,} ({MAX_RUN_STEPS_ENV}): use fewer columns or tokens")
        with self._cond:
            mine = sum(t.client == client for t in self._waiting + self._running)
            if mine >= limits.runs_per_client:
                raise Refused(f"refused: you have {mine} run{'s' if mine != 1 else ''} queued already; the limit per "
                              f"client is {limits.runs_per_client} ({MAX_RUNS_PER_CLIENT_ENV}): wait for one to end")
            free = len(self._running) < limits.slots
            if not free and len(self._waiting) >= limits.waiting:
                wait_s = self._remaining_s() + sum(self._estimate_s(t) for t in self._waiting)
                raise Refused(f"refused: {len(self._waiting)} runs are waiting already, the most this server holds "
                              f"({MAX_WAITING_ENV}); try again in about {max(1, round(wait_s / limits.slots))} s")
            ticket = Ticket(client, cost, next(self._orders), self.clock())
            self._waiting.append(ticket)
            self._dispatch()
            return ticket

    # ----- waiting -----

    def wait(self, ticket: Ticket, timeout_s: float | None = None) -> bool:
        """Block until `ticket` holds a slot (True) or `timeout_s` passes (False). An ended ticket returns False."""
        with self._cond:
            self._cond.wait_for(lambda: ticket.started_at is not None or ticket.ended, timeout_s)
            return ticket.started_at is not None and not ticket.ended

    def started(self, ticket: Ticket) -> bool:
        with self._cond:
            return ticket.started_at is not None and not ticket.ended

    def place(self, ticket: Ticket) -> Place | None:
        """Where `ticket` stands while it waits; None once it runs or has ended."""
        with self._cond:
            if ticket not in self._waiting:
                return None
            line = self._line()
            ahead = line[:line.index(ticket)]
            wait_s = (self._remaining_s() + sum(self._estimate_s(t) for t in ahead)) / self.limits.slots
            return Place(len(ahead) + 1, wait_s)

    def counts(self) -> tuple[int, int]:
        """(runs running, runs waiting) now."""
        with self._cond:
            return len(self._running), len(self._waiting)

    # ----- ending -----

    def release(self, ticket: Ticket, completed: bool = False) -> None:
        """End `ticket` (idempotent): a waiting run leaves the line, a running one frees its slot and its time
        counts as its client's service; `completed`: it did all its work, so its time measures the rate."""
        with self._cond:
            if ticket.ended:
                return
            ticket.ended = True
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            elif ticket in self._running:
                self._running.remove(ticket)
                now = self.clock()
                self._usage.setdefault(ticket.client, _Usage()).spans.append((ticket.started_at, now))
                if completed:
                    self.rate.record(ticket.cost, now - ticket.started_at)
            self._dispatch()
            self._cond.notify_all()

    # ----- the order -----

    def service_s(self, client: Client) -> float:
        """Seconds of model time `client` used within the last `window_s` seconds (its running runs included)."""
        with self._cond:
            return self._service_s(client, self.clock())

    def _service_s(self, client: Client, now: float) -> float:
        since = now - self.limits.window_s
        usage = self._usage.get(client)
        used = 0.0
        if usage is not None:
            while usage.spans and usage.spans[0][1] <= since:
                usage.spans.popleft()
            used = sum(end - max(start, since) for start, end in usage.spans)
        return used + sum(now - max(t.started_at, since) for t in self._running if t.client == client)

    def _line(self) -> list[Ticket]:
        """The waiting runs in the order they would start: least service first, then earliest."""
        now = self.clock()
        service = {client: self._service_s(client, now) for client in {t.client for t in self._waiting}}
        return sorted(self._waiting, key=lambda t: (service[t.client], t.order))

    def _dispatch(self) -> None:
        while self._waiting and len(self._running) < self.limits.slots:
            chosen = self._line()[0]
            self._waiting.remove(chosen)
            chosen.started_at = self.clock()
            self._running.append(chosen)
            self._cond.notify_all()

    def _estimate_s(self, ticket: Ticket) -> float:
        return self.rate.estimate_s(ticket.cost)

    def _remaining_s(self) -> float:
        """Estimated seconds the running runs have left, together. A run past its estimate is given
        OVERRUN_SHARE of it again (at least 1 s): it is late, so the rest of its estimate is no guide."""
        now = self.clock()
        return sum(max(1.0, OVERRUN_SHARE * self._estimate_s(t), self._estimate_s(t) - (now - t.started_at))
                   for t in self._running)
