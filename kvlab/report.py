"""Pure functions turning run results into tables and JSON records.

Nothing here measures or renders to a screen: the CLI prints `format_table`,
the browser shows `summary_frame`, both from the same `summary_rows`.
"""

from __future__ import annotations

import csv
import io

from .events import ColumnResult, RunDone

SUMMARY_COLUMNS = [
    "column", "status", "TTFT (s)", "decode tok/s", "peak cache (bytes)", "vs baseline bytes", "predicted dense (bytes)",
    "agreement", "first divergence", "top-1 agreement", "mean KL (nats)", "note",
]
# Which direction is better, for marking the best value per metric.
BETTER = {"TTFT (s)": min, "decode tok/s": max, "peak cache (bytes)": min, "agreement": max,
          "top-1 agreement": max, "mean KL (nats)": min}


def _round(value, digits):
    return None if value is None else round(value, digits)


def summary_rows(results: list[ColumnResult]) -> list[dict]:
    """One dict per column with the SUMMARY_COLUMNS keys (None where not measured)."""
    rows = []
    base = next((r for r in results if r.is_baseline and r.peak_cache_bytes), None)
    for r in results:
        note = "; ".join(filter(None, [r.message, r.caveat if r.status == "ok" else ""]))
        if r.is_baseline:
            note = ("baseline; " + note) if note else "baseline"
        elif r.lossy and r.status == "ok":
            note = ("approximate (lossy cache); " + note) if note else "approximate (lossy cache)"
        rows.append({
            "column": r.name,
            "status": r.status,
            "TTFT (s)": _round(r.prefill_s, 4),
            "decode tok/s": _round(r.decode_tok_s, 2),
            "peak cache (bytes)": r.peak_cache_bytes if r.status == "ok" else None,
            "vs baseline bytes": (_round(r.peak_cache_bytes / base.peak_cache_bytes, 3)
                                  if base is not None and r.status == "ok" else None),
            "predicted dense (bytes)": r.predicted_cache_bytes[-1] if r.predicted_cache_bytes else None,
            "agreement": _round(r.agreement, 4),
            "first divergence": r.first_divergence,
            "top-1 agreement": _round(r.top1_agreement, 4),
            "mean KL (nats)": _round(r.mean_kl, 6),
            "note": note,
        })
    return rows


def best_marks(rows: list[dict]) -> dict[str, int]:
    """Metric -> index of the row with the best value (only rows with status ok and a value)."""
    marks = {}
    for metric, pick in BETTER.items():
        candidates = [(row[metric], i) for i, row in enumerate(rows)
                      if row["status"] == "ok" and row[metric] is not None and not (metric == "peak cache (bytes)" and row[metric] == 0 and row["column"].startswith("no_cache"))]
        if candidates:
            value = pick(v for v, _ in candidates)
            marks[metric] = next(i for v, i in candidates if v == value)
    return marks


def format_table(rows: list[dict]) -> str:
    """A plain-text table, one line per column (for the CLI)."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS, dtype=object).fillna("-")
    with pd.option_context("display.max_colwidth", 60, "display.width", 250):
        return frame.to_string(index=False)


def rows_to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SUMMARY_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def run_record(loaded, preset, settings, done: RunDone) -> dict:
    """The JSON record of a run: model info, settings, mode and every column's result."""
    from dataclasses import asdict

    return {
        "model": loaded.info(),
        "preset": preset.name if preset is not None else None,
        "prompt": preset.prompt.model_dump() if preset is not None else None,
        "mode": preset.mode if preset is not None else None,
        "settings": asdict(settings),
        "wall_s": done.wall_s,
        "stopped": done.stopped,
        "columns": [r.to_json() for r in done.results],
    }
