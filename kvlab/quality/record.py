"""Quality-report records: each column's figure row, the JSON record, and rows from saved records of any tab.

A report record (`kind: kvlab.report`) holds per column its split, status and one flat figure row
(`FIGURE_FIELDS`, named as llama.cpp's `--kl-divergence` summary names them, see `LLAMA_CPP_NAMES` in
`kvlab.quality.stats`); JSON has no NaN, so a figure not estimated is null. `rows_from_record` reads a report,
Compare (`kvlab.compare`) or Needle (`kvlab.needle`) record into table rows keyed by (model, column), and
`merge_rows` puts rows of several records together (a Needle record's hit rate joins the report row of the
same model and column), so runs made on different machines make one table. A file or object is read by the
one record reader (`kvlab.record`: size, depth and numbers capped, the kind and version checked, every field's
type checked against its kind's shape, `REPORT` here, `kvlab.needle.record.NEEDLE` and
`kvlab.compare.record.COMPARE`). Pure: no model, no files written.
"""

from __future__ import annotations

import math
from pathlib import Path

from typing_extensions import NotRequired, Required, TypedDict

from ..compare.record import COMPARE
from ..needle.record import NEEDLE, SummaryRow
from ..record import RecordError, RecordKind, check_record, new_record, read_record
from .stats import QualityFigures, wilson_interval

MAX_RECORD_COLUMNS = 64
"""Most columns a saved report record may hold (a report runs at most 40: `kvlab.quality.report`)."""
FIGURE_FIELDS = ("scored_tokens", "ppl", "ppl_base", "ppl_ratio", "ppl_ratio_unc", "ppl_diff", "ppl_diff_unc",
                 "ln_ppl_ratio", "ln_ppl_ratio_unc", "kld_mean", "kld_mean_unc", "kld_median", "kld_p99", "kld_max",
                 "same_top", "same_top_low", "same_top_high", "cache_bytes_mean", "cache_bytes_end", "bytes_vs_dense",
                 "decode_tok_s", "prefill_s")
"""The figure row of one column: PPL(Q), PPL(base), PPL ratio and ΔPPL (`ppl_diff`) with standard errors, KL
(nats: mean ± SE, median, 99th percentile, maximum), top-1 agreement ("same top p", a fraction, with its Wilson
95 % interval), exact cache bytes (mean over the scored steps and at the end) and relative to the dense
reference's mean, decode tok/s (one token per forward) and the prefill's seconds."""
NEEDLE_FIELDS = ("needle_hits", "needle_cells", "needle_hit_rate", "needle_low", "needle_high")
"""A Needle grid's hits over its scored (not gated) cells and seeds, the rate and its Wilson 95 % interval."""
TABLE_FIELDS = ("model", "column", "status", "context_tokens", *FIGURE_FIELDS, *NEEDLE_FIELDS, "source", "message",
                "protocol", "reference")

_Figures = TypedDict("_Figures", {name: int | float | None for name in FIGURE_FIELDS}, total=False)


class _Split(TypedDict, total=False):
    context_tokens: Required[int]
    scored_tokens: int


class _ReportColumn(TypedDict, total=False):
    name: Required[str]
    status: Required[str]
    message: str
    note: str
    split: Required[_Split]
    figures: _Figures | None
    reference: str | None


class _Needle(TypedDict, total=False):
    grid: dict
    problems: list[str]
    summary: list[SummaryRow]


class _Text(TypedDict, total=False):
    name: str
    title: str
    licence: str
    tokens: int


class _Reference(TypedDict, total=False):
    name: str
    scored_tokens: int
    cache_bytes_mean: float | None
    cache_bytes_end: int | None
    decode_tok_s: float | None
    prefill_s: float | None


REPORT = RecordKind("kvlab.report", "report", 1, (1,), _ReportColumn,
                    {"split": NotRequired[_Split | None], "text": NotRequired[_Text | None],
                     "reference": NotRequired[_Reference | None],
                     "engine_references": NotRequired[list[_Reference] | None], "needle": NotRequired[_Needle | None],
                     "command": NotRequired[str]}, MAX_RECORD_COLUMNS)
"""The report record (version 1; records written before the envelope lack `measured_at` and `environment`; a
leaderboard's adds the `command` that made it). `reference` is the dense reference's cost; `engine_references`
(absent before engine columns were scored) the cost of each engine's own reference (llama.cpp's f16 run), and
each column's `reference` (absent in older records: `reference.name`, the dense one) names the one it was scored
against."""
READ = (REPORT, COMPARE, NEEDLE)
"""The records a report table is made from."""
WANTED = "report, Compare or Needle"


def _clean(value):
    """A float as JSON can hold it (NaN / inf -> None)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def figure_row(figures: QualityFigures, cost: dict, dense_bytes_mean: float | None) -> dict:
    """The `FIGURE_FIELDS` row of one column from its `QualityFigures` and its `cost` (cache_bytes_mean,
    cache_bytes_end, decode_tok_s, prefill_s), with `bytes_vs_dense` against the reference's mean bytes."""
    f = figures
    row = {"scored_tokens": f.n_tokens, "ppl": f.ppl, "ppl_base": f.ppl_base, "ppl_ratio": f.ppl_ratio,
           "ppl_ratio_unc": f.ppl_ratio_unc, "ppl_diff": f.ppl_diff, "ppl_diff_unc": f.ppl_diff_unc,
           "ln_ppl_ratio": f.ln_ppl_ratio, "ln_ppl_ratio_unc": f.ln_ppl_ratio_unc,
           "kld_mean": f.kld_mean, "kld_mean_unc": f.kld_mean_unc, "kld_median": f.kld_percentiles.median,
           "kld_p99": f.kld_percentiles[0.99], "kld_max": f.kld_percentiles.maximum,
           "same_top": f.same_top, "same_top_low": f.same_top_low, "same_top_high": f.same_top_high,
           "cache_bytes_mean": cost["cache_bytes_mean"], "cache_bytes_end": cost["cache_bytes_end"],
           "bytes_vs_dense": (cost["cache_bytes_mean"] / dense_bytes_mean if dense_bytes_mean else None),
           "decode_tok_s": cost["decode_tok_s"], "prefill_s": cost["prefill_s"]}
    return {key: _clean(value) for key, value in row.items()}


def column_entry(name: str, column, split, message: str, figures: dict | None, scored: int, note: str = "",
                 reference: str | None = None) -> dict:
    """One column of the record: name, spec, status (`ok`, `stopped` short of the split, `error`), message, the
    split it was scored on (context_tokens, scored_tokens actually scored), its figure row (None: none), the name
    of the reference it is scored against (`dynamic`, `engine:llamacpp f16`; None: no reference) and, when the
    strategy has one, its `note` (`Strategy.runtime_note`, e.g. TriAttention's calibration cost)."""
    strategy = column.strategy
    status = "error" if message else ("ok" if scored == split.scored_tokens else "stopped")
    entry = {"name": name, "spec": {"strategy": strategy.name, **strategy.knobs()} if strategy is not None else {},
             "status": status, "message": message,
             "split": {"context_tokens": split.context_tokens, "scored_tokens": scored}, "figures": figures,
             "reference": reference}
    return {**entry, "note": note} if note else entry


def build_record(model: dict, split, text: dict, columns: list[dict], reference: dict | None, wall_s: float,
                 stopped: bool, needle: dict | None = None, environment: dict | None = None,
                 engine_references: list[dict] | None = None) -> dict:
    """The JSON record of a report run (`REPORT`, in the envelope of `kvlab.record.new_record`); the
    `engine_references` rows only when there are some."""
    extra = {"engine_references": engine_references} if engine_references else {}
    return new_record(REPORT, model=model, environment=environment, columns=columns, wall_s=wall_s,
                      stopped=stopped, split={"context_tokens": split.context_tokens,
                                              "scored_tokens": split.scored_tokens},
                      text=text, reference=reference, needle=needle, **extra)


def needle_figures(summary_row: dict) -> dict:
    """`NEEDLE_FIELDS` from one row of a Needle record's summary (`kvlab.needle.record.summarize`)."""
    hits, cells = summary_row.get("hits"), summary_row.get("scored")
    if not cells:
        return dict.fromkeys(NEEDLE_FIELDS)
    if not 0 <= hits <= cells:
        raise ValueError(f"needle column {summary_row.get('strategy')!r} has {hits} hits of {cells} scored cells")
    low, high = wilson_interval(hits, cells)
    return {"needle_hits": hits, "needle_cells": cells, "needle_hit_rate": hits / cells, "needle_low": low,
            "needle_high": high}


def _model_name(record: dict) -> str:
    model = record.get("model") or {}
    if not isinstance(model, dict):
        return str(model)
    return str(model.get("name") or model.get("source") or "?")


def rows_from_record(record: dict, source: str = "") -> list[dict]:
    """Table rows (`TABLE_FIELDS`) of a report, Compare or Needle record (`READ`, checked by
    `kvlab.record.check_record`); figures a record lacks are None. Each row's `protocol` (`report`, `compare`,
    `needle`) says which figures it holds (`merge_rows`).

    Raises:
        ValueError: one line: not one of those records, a version this kvlab does not read, too many columns,
            or a part whose fields have the wrong type.
    """
    kind, record = check_record(record, READ, WANTED)
    rows = {REPORT: _report_rows, NEEDLE: _needle_rows, COMPARE: _compare_rows}[kind](record)
    model = _model_name(record)
    return [{**dict.fromkeys(TABLE_FIELDS), **row, "model": model, "source": source} for row in rows]


def _report_rows(record: dict) -> list[dict]:
    needle = {row["strategy"]: needle_figures(row) for row in (record.get("needle") or {}).get("summary", [])}
    dense = (record.get("reference") or {}).get("name")
    return [{**(column.get("figures") or {}), **needle.get(column["name"], {}), "column": column["name"],
             "reference": column.get("reference") or dense,
             "status": column["status"], "context_tokens": column["split"]["context_tokens"],
             "message": column.get("message", ""), "protocol": "report"} for column in record["columns"]]


def _needle_rows(record: dict) -> list[dict]:
    return [{**needle_figures(row), "column": row["strategy"], "status": "ok" if not row.get("errors") else "error",
             "message": "", "protocol": "needle"} for row in record["summary"]]


def _compare_rows(record: dict) -> list[dict]:
    return [{"column": column.get("name"), "status": column.get("status"), "same_top": column.get("top1_agreement"),
             "kld_mean": column.get("mean_kl"), "cache_bytes_end": column.get("peak_cache_bytes"),
             "decode_tok_s": column.get("decode_tok_s"),
             "message": "Compare: teacher-forced on the baseline's continuation", "protocol": "compare"}
            for column in record["columns"]]


def load_record(path: str | Path, name: str | None = None) -> dict:
    """A report, Compare or Needle record from a JSON file (`kvlab.record.read_record`: size, depth and numbers
    capped, kind, version and types checked), in its current layout. Raises ValueError (one line, naming the
    file as `name`, default its file name) when it cannot be read; a page passes the uploaded file's own name so
    no server path is shown."""
    shown = Path(path).name if name is None else name
    try:
        return read_record(path, READ, WANTED)[1]
    except RecordError as err:
        raise ValueError(f"cannot read record {shown}: {err}") from None


def merge_rows(groups: list[list[dict]]) -> list[dict]:
    """Rows of several records as one table. Rows measured the same way (`protocol`) of the same (model, column)
    fill in each other's missing figures (None there) instead of adding a row; a Needle row's hit rate fills in
    the first row of its (model, column) whatever its protocol (its figures are its own fields). A report row
    and a Compare row of one column stay two rows: their KL and top-1 come from different protocols (a long
    text against a 64-token continuation) and must not share a row. Otherwise rows are appended, in order."""
    merged: dict[tuple, dict] = {}
    for rows in groups:
        for row in rows:
            protocol = row.get("protocol")
            key = (row["model"], row["column"], protocol)
            if protocol == "needle":
                key = next((k for k in merged if k[:2] == key[:2]), key)
            if key not in merged:
                merged[key] = dict(row)
                continue
            into = merged[key]
            for field, value in row.items():
                if into.get(field) is None and value is not None:
                    into[field] = value
            if row.get("source") and row["source"] not in str(into.get("source")):
                into["source"] = f"{into['source']} + {row['source']}" if into.get("source") else row["source"]
    return list(merged.values())
