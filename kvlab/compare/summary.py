"""Pure functions turning run results into summary rows, tables and JSON records.

Rows are keyed by the quantity names used everywhere in kvlab (`ttft_s`,
`decode_tok_s`, `peak_cache_bytes`, ...); `LABELS` gives the human header of
each, applied only when a table is rendered (the CLI's text table here, the
page's table in `kvlab.ui`). The CSV export uses the keys as its header. Nothing
here measures or renders to a screen.
"""

from __future__ import annotations

import csv
import io

from .events import ColumnResult

SUMMARY_COLUMNS = [
    "column", "status", "ttft_s", "decode_tok_s", "itl_ms_p50", "itl_ms_p99", "peak_cache_bytes", "vs_baseline_bytes",
    "predicted_cache_bytes", "cache_bytes_by_layer_type", "agreement", "first_divergence", "top1_agreement", "mean_kl",
    "note",
]
"""The summary's quantities, in display order (also the CSV header)."""

LABELS = {
    "column": "column", "status": "status", "ttft_s": "TTFT (s)", "decode_tok_s": "decode tok/s",
    "itl_ms_p50": "ITL p50 (ms)", "itl_ms_p99": "ITL p99 (ms)",
    "peak_cache_bytes": "peak cache (bytes)", "vs_baseline_bytes": "vs baseline bytes",
    "predicted_cache_bytes": "predicted dense (bytes)",
    "cache_bytes_by_layer_type": "cache by layer type at the end (bytes)", "agreement": "agreement",
    "first_divergence": "first divergence", "top1_agreement": "top-1 agreement", "mean_kl": "mean KL (nats)",
    "note": "note", "fidelity_status": "fidelity",
}
"""Quantity -> the header a text table shows (units in brackets)."""

BETTER = {"ttft_s": min, "decode_tok_s": max, "itl_ms_p50": min, "itl_ms_p99": min, "peak_cache_bytes": min,
          "agreement": max,
          "top1_agreement": max, "mean_kl": min}
"""Which direction is better, for marking the best value per metric."""

TIMING_METRICS = ("ttft_s", "decode_tok_s", "itl_ms_p50", "itl_ms_p99")
"""Metrics measured in time, whose rows carry a relative noise (`noise`, from `ColumnResult.timing.noise`)."""
NOISE_SIGMAS = 2.0
"""Two timing figures differ only when they are further apart than this many times their combined noise."""


def _round(value, digits):
    return None if value is None else round(value, digits)


def _note(r: ColumnResult) -> str:
    unscored = (f"fidelity {r.fidelity_status}" if r.fidelity_status.startswith("not scored")
                and r.fidelity_status != "not scored: fidelity off" and "fidelity not scored" not in r.message else "")
    note = "; ".join(filter(None, [r.warning, r.message, r.keeps, r.caveat if r.status == "ok" else "", unscored]))
    if r.is_baseline:
        return ("baseline; " + note) if note else "baseline"
    if r.lossy and r.status == "ok":
        kind = f"another engine: {r.engine['engine']}" if r.engine.get("engine") else "approximate (lossy cache)"
        return f"{kind}; {note}" if note else kind
    return note


def summary_rows(results: list[ColumnResult]) -> list[dict]:
    """One dict per column with the SUMMARY_COLUMNS keys (None where not measured), plus `use_cache`, `timing`
    (the timing policy the figures come from, `kvlab.measure.POLICIES`) and `noise` (metric -> relative noise,
    a fraction);
    `cache_bytes_by_layer_type` is a dict (layer type -> bytes at the last step). The ITL mean and p90 and the
    end-to-end latency are in each column's JSON record (`ColumnResult.to_json`)."""
    rows = []
    base = next((r for r in results if r.is_baseline and r.peak_cache_bytes), None)
    for r in results:
        rows.append({
            "column": r.name,
            "status": r.status,
            "ttft_s": _round(r.ttft_s, 4),
            "decode_tok_s": _round(r.decode_tok_s, 2),
            "itl_ms_p50": _round(r.itl_ms_p50, 2),
            "itl_ms_p99": _round(r.itl_ms_p99, 2),
            "peak_cache_bytes": r.peak_cache_bytes if r.status == "ok" and r.cache_bytes else None,
            "vs_baseline_bytes": (_round(r.peak_cache_bytes / base.peak_cache_bytes, 3)
                                  if base is not None and r.status == "ok" else None),
            "predicted_cache_bytes": r.predicted_cache_bytes[-1] if r.predicted_cache_bytes else None,
            "cache_bytes_by_layer_type": ({kind: values[-1] for kind, values in r.cache_bytes_by_layer_type.items()}
                                          if r.status == "ok" and r.cache_bytes_by_layer_type else None),
            "agreement": _round(r.agreement, 4),
            "first_divergence": r.first_divergence,
            "top1_agreement": _round(r.top1_agreement, 4),
            "mean_kl": _round(r.mean_kl, 6),
            "fidelity_status": r.fidelity_status or None,
            "note": _note(r),
            "use_cache": r.use_cache,
            "timing": r.timing.policy,
            "noise": dict(r.timing.noise),
        })
    return rows


def candidates(rows: list[dict], metric: str) -> list[int]:
    """Rows that compete for the best `metric`: finished, measured, and for cache bytes only columns that keep
    a cache (no cache is not a memory win)."""
    return [i for i, row in enumerate(rows) if row["status"] == "ok" and row[metric] is not None
            and not (metric == "peak_cache_bytes" and not row.get("use_cache", True))]


def best_marks(rows: list[dict]) -> dict[str, int]:
    """Metric -> index of the row with the best value among `candidates`."""
    marks = {}
    for metric, pick in BETTER.items():
        found = candidates(rows, metric)
        if found:
            value = pick(rows[i][metric] for i in found)
            marks[metric] = next(i for i in found if rows[i][metric] == value)
    return marks


def within_noise(rows: list[dict], metric: str, i: int, j: int) -> bool:
    """Whether rows i and j cannot be told apart on `metric`: equal values, or for a timing metric values closer
    than NOISE_SIGMAS times their combined relative noise (rows without a noise figure count as exact)."""
    a, b = rows[i][metric], rows[j][metric]
    if a == b:
        return True
    if metric not in TIMING_METRICS:
        return False
    noise_a, noise_b = ((rows[k].get("noise") or {}).get(metric, 0.0) for k in (i, j))
    return abs(a - b) <= NOISE_SIGMAS * max(abs(a), abs(b)) * (noise_a ** 2 + noise_b ** 2) ** 0.5


def best_sets(rows: list[dict]) -> dict[str, set[int]]:
    """Metric -> the rows marked best: the best row among `candidates` and every row within its noise
    (`within_noise`), all tied; a metric with one candidate, or on which every candidate ties (nothing to
    choose), marks none. So two
    columns are never ranked against their measurement unless they differ by more than the run's noise."""
    marks = {}
    for metric, best in best_marks(rows).items():
        competing = candidates(rows, metric)
        tied = {i for i in competing if within_noise(rows, metric, best, i)}
        marks[metric] = set() if len(competing) < 2 or len(tied) == len(competing) else tied
    return marks


def by_layer_type_text(by_type: dict[str, int] | None, scale: float = 1.0, digits: int = 0,
                       sep: str = " ") -> str | None:
    """`{"full_attention": 6291456, "sliding_attention": 15729000}` -> `full=6291456 sliding=15729000` (the
    `_attention` suffix dropped; values divided by `scale`, rounded to `digits`); None stays None."""
    if by_type is None:
        return None
    return sep.join(f"{kind.removesuffix('_attention')}={value / scale:.{digits}f}"
                    for kind, value in sorted(by_type.items()))


def several_layer_types(rows: list[dict]) -> bool:
    """Whether any row's cache has more than one layer type (a hybrid model)."""
    return any(len(row.get("cache_bytes_by_layer_type") or {}) > 1 for row in rows)


FIDELITY_COLUMNS = ["column", "agreement", "first_divergence", "top1_agreement", "mean_kl", "fidelity_status"]
"""The CLI's fidelity table (printed after the pass, below the summary that came before it)."""
TEACHER_FORCED = ("top1_agreement", "mean_kl")
"""The summary's quantities that only the teacher-forced fidelity pass fills."""


def format_table(rows: list[dict], keys: list[str] | None = None) -> str:
    """A plain-text table with LABELS as headers, one line per column (for the CLI): the quantities `keys`
    (default SUMMARY_COLUMNS); the by-layer-type column only for a model with more than one layer type."""
    import pandas as pd

    columns = [c for c in keys or SUMMARY_COLUMNS
               if c != "cache_bytes_by_layer_type" or several_layer_types(rows)]
    rows = [{**row, "cache_bytes_by_layer_type": by_layer_type_text(row.get("cache_bytes_by_layer_type"))}
            for row in rows]
    frame = pd.DataFrame(rows, columns=columns, dtype=object).fillna("-").rename(columns=LABELS)
    with pd.option_context("display.max_colwidth", 60, "display.width", 250):
        return frame.to_string(index=False)


def rows_to_csv(rows: list[dict]) -> str:
    """The summary as CSV, its header the quantity names (SUMMARY_COLUMNS); bytes by layer type as
    `full=N;sliding=M`."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({**row, "cache_bytes_by_layer_type": by_layer_type_text(row.get("cache_bytes_by_layer_type"),
                                                                              sep=";")} for row in rows)
    return out.getvalue()


def run_record(loaded, preset, settings, results: list[ColumnResult], wall_s: float, stopped: bool, timing: dict,
               fidelity: dict, summary_s: float | None, memory: dict | None = None) -> dict:
    """The JSON record of a run, in the envelope every wing writes (`kvlab.record.new_record`, kind
    `kvlab.compare`, `kvlab.compare.record.COMPARE`): where and when it was measured
    (`kvlab.measure.environment`), model info, the preset's name, prompt and mode (null without a preset), the
    settings, every column's result (each with its `fidelity_status`), how the run was timed (`timing`,
    `kvlab.measure.noise.run_timing`: the policy, load average, noise, whether the machine was too busy, and
    its note), `summary_s` (seconds from the start to the summary), `fidelity` (the fidelity pass: state,
    scored and to_score) and, when given, `memory`: the run's process memory samples (`elapsed_s` in seconds since
    the start, `rss_bytes` and `cuda_allocated_bytes` in bytes, one entry each per sample), whatever front ran it."""
    from dataclasses import asdict

    from ..measure.environment import environment
    from ..record import new_record
    from .record import COMPARE

    return new_record(COMPARE, model=loaded.info(), environment=environment(loaded),
                      columns=[r.to_json() for r in results], wall_s=wall_s, stopped=stopped,
                      preset=preset.name if preset is not None else None,
                      prompt=preset.prompt.model_dump() if preset is not None else None,
                      mode=preset.mode if preset is not None else None, settings=asdict(settings),
                      summary_s=summary_s, fidelity=fidelity, timing=timing,
                      **({"memory": memory} if memory is not None else {}))
