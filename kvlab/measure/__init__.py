"""How kvlab measures a Compare run's timing: the work behind the timing policies.

The runner reaches this package through one `Measurement` (`kvlab.compare.timing.for_policy`), which sequences
what is here; nothing here imports above the engine. Policies (`POLICIES`): `live` (default) keeps the live run's figures after a one-time warm-up; `quiet`
re-times every finished column after the run, with spike re-timing (`kvlab.measure.quiet`). Inside: the
warm-up (`warmup`), the re-timing (`quiet`), noise and the busy note (`noise`), the column's timing record
and old records' upgrade (`record`) and the environment a figure was measured in (`environment`).
This package measures and judges; it does not render or stream to a page.
"""

from __future__ import annotations

from .record import DEFAULT_POLICY, POLICIES, ColumnTiming

__all__ = ["DEFAULT_POLICY", "POLICIES", "ColumnTiming"]
