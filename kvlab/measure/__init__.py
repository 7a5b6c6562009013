"""How kvlab measures a Compare run's timing: one wing, one door.

The runner asks `for_policy(name)` for a `Measurement` (`kvlab.measure.policy`) and calls nothing else here.
Policies (`POLICIES`): `live` (default) keeps the live run's figures after a one-time warm-up; `quiet`
re-times every finished column after the run, with spike re-timing (`kvlab.measure.quiet`). Inside: the
warm-up (`warmup`), the re-timing (`quiet`), noise and the busy note (`noise`), the column's timing record
and old records' upgrade (`record`) and the environment a figure was measured in (`environment`).
This package measures and judges; it does not render or stream to a page.
"""

from __future__ import annotations

from .record import DEFAULT_POLICY, POLICIES, ColumnTiming

__all__ = ["DEFAULT_POLICY", "POLICIES", "ColumnTiming", "for_policy"]


def for_policy(name: str = DEFAULT_POLICY):
    """The `Measurement` for timing policy `name` (one of POLICIES).

    Raises:
        ValueError: an unknown policy; the message lists the allowed ones.
    """
    from .policy import Measurement  # the policy imports the engine and the events, which import this package

    return Measurement(name)
