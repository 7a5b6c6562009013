"""How kvlab measures timing: the parts every wing shares, below the engine.

Policies (`POLICIES`): `live` (default) keeps the live run's figures after a one-time warm-up; `quiet`
re-times every finished column after the run, with spike re-timing. Compare sequences them
(`kvlab.compare.timing`, the re-timing pass is `kvlab.compare.quiet`); here: the one-time warm-up of a
strategy (`warmup`), noise and the busy note (`noise`), the column's timing record and old records' upgrade
(`record`), the environment a figure was measured in (`environment`), and the one safe reader of every
record file (`record_json`: size, depth and numbers capped, fields type-checked). Nothing here imports the
engine or a strategy; it measures and judges, it does not run a model, render or stream to a page.
"""

from __future__ import annotations

from .record import DEFAULT_POLICY, POLICIES, ColumnTiming

__all__ = ["DEFAULT_POLICY", "POLICIES", "ColumnTiming"]
