"""A column's timing record (`ColumnTiming`, the `timing` of `kvlab.compare.events.ColumnResult`) and the upgrade of
version-2 run records, whose timing fields were flat `live_*`/`quiet_*` twins, to the nested layout.

This module holds data and converts it; it measures nothing and imports no model code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("live", "quiet")
"""How a Compare run's timing figures are taken (see `kvlab.measure.for_policy`): `live`, the default, keeps the
figures of the live run after a warm-up; `quiet` re-times each finished column afterwards with nothing else
going on and reports those."""
DEFAULT_POLICY = "live"

LIVE_FIGURES = ("ttft_s", "decode_tok_s", "itl_ms_p50", "itl_ms_p99")
"""The summary figures a `quiet` policy replaces; `ColumnTiming.live` keeps the live run's values of these."""


@dataclass
class ColumnTiming:
    """How one column's timing figures (`ColumnResult.ttft_s`, `decode_tok_s`, `itl_ms_*`, `e2e_latency_s`) were
    taken.

    policy: `live` (the figures are the live run's) or `quiet` (they come from the re-timing pass after it).
    noise: relative noise of each figure (metric name -> fraction, e.g. 0.02), which
    `kvlab.compare.summary.best_sets` uses to call two columns tied. warm_up_s: seconds this run spent on the
    strategy's one-time set-up before the column's clock started (0.0 when this process had done it; None
    when the column did not run). live: under `quiet`, the live run's figures (LIVE_FIGURES), else {}.
    per_token_s: under `quiet`, the re-timed steps in seconds (index 0 the prefill) over the first tokens;
    replaced_steps: indices of those steps that took their second timing (slow once, not when timed again);
    ttft_samples_s: the prefills timed for the TTFT (seconds; the median is `ColumnResult.ttft_s`).
    """

    policy: str = DEFAULT_POLICY
    noise: dict[str, float] = field(default_factory=dict)
    warm_up_s: float | None = None
    live: dict[str, float | None] = field(default_factory=dict)
    per_token_s: list[float] = field(default_factory=list)
    replaced_steps: list[int] = field(default_factory=list)
    ttft_samples_s: list[float] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict | None) -> "ColumnTiming":
        """The record back from its JSON (`dataclasses.asdict`); unknown keys are ignored."""
        data = data or {}
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


_V2_COLUMN_KEYS = ("timing", "quiet_tokens", "quiet_per_token_s", "quiet_replaced_steps", "ttft_samples_s",
                   "timing_noise", "warm_up_s", *(f"live_{name}" for name in LIVE_FIGURES))
_V2_RUN_KEYS = ("retimed", "settle_s")


def column_timing_from_v2(column: dict) -> dict:
    """A version-2 column's flat timing fields as a version-3 `ColumnTiming` JSON (the input is not changed)."""
    quiet = column.get("timing") == "quiet"
    return {
        "policy": "quiet" if quiet else "live",
        "noise": column.get("timing_noise") or {},
        "warm_up_s": column.get("warm_up_s"),
        "live": {name: column.get(f"live_{name}") for name in LIVE_FIGURES} if quiet else {},
        "per_token_s": list(column.get("quiet_per_token_s") or []),
        "replaced_steps": list(column.get("quiet_replaced_steps") or []),
        "ttft_samples_s": list(column.get("ttft_samples_s") or []),
    }


def upgrade_v2(record: dict) -> dict:
    """A version-2 Compare record in the version-3 layout: each column's flat timing fields nested under
    `timing` (`column_timing_from_v2`), the run's `retimed` flag as its `policy` and the settings' `retime` as
    their `timing_policy`, the wait for quiet (`settle_s`) dropped. Returns a new dict; `format_version` is
    left to the caller."""
    columns = []
    for column in record.get("columns") or []:
        if not isinstance(column, dict):
            columns.append(column)
            continue
        upgraded = {key: value for key, value in column.items() if key not in _V2_COLUMN_KEYS}
        upgraded["timing"] = column_timing_from_v2(column)
        columns.append(upgraded)
    run = dict(record.get("timing") or {})
    if run:
        run["policy"] = "quiet" if run.get("retimed") else "live"
        for key in _V2_RUN_KEYS:
            run.pop(key, None)
    settings = dict(record.get("settings") or {})
    if "retime" in settings:
        settings["timing_policy"] = "quiet" if settings.pop("retime") else "live"
    return {**record, "columns": columns, "timing": run, "settings": settings}
