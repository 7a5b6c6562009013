"""Quality-report records: each column's figure row, the JSON record, and rows from saved records of any tab.

A report record (`kind: kvlab.report`) holds per column its split, status and one flat figure row
(`FIGURE_FIELDS`, named as llama.cpp's `--kl-divergence` summary names them, see `LLAMA_CPP_NAMES` in
`kvlab.quality.stats`); JSON has no NaN, so a figure not estimated is null. `rows_from_record` reads a report,
Compare (`kvlab.compare`) or Needle (`kvlab.needle`) record into table rows keyed by (model, column), and
`merge_rows` puts rows of several records together (a Needle record's hit rate joins the report row of the
same model and column), so runs made on different machines make one table. A file is read by
`kvlab.measure.record_json.load_json` (size, depth and numbers capped); each record's parts are checked
against its shape (`ReportShape`, `NeedleShape`, a Compare record as Compare's replay checks it), types never
converted, and a version this kvlab does not read is refused as every reader refuses it. Pure: no model, no
files written.
"""

from __future__ import annotations

import math
from pathlib import Path

from typing_extensions import Required, TypedDict

from ..compare.columns import MAX_COLUMNS
from ..compare.replay import check_record, known_fields
from ..measure.record_json import RecordJSONError, load_json, shaped, version_refusal
from .stats import QualityFigures, wilson_interval

RECORD_KIND = "kvlab.report"
RECORD_VERSION = 1
NEEDLE_KIND, NEEDLE_VERSION = "kvlab.needle", 1
"""A Needle record's kind and the version read (`kvlab.needle.record.RECORD_KIND` / `RECORD_VERSION`)."""
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
                "protocol")

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


class _NeedleRow(TypedDict, total=False):
    strategy: Required[str]
    hits: Required[int]
    scored: Required[int]
    errors: int


class _Needle(TypedDict, total=False):
    summary: list[_NeedleRow]


class _Model(TypedDict, total=False):
    name: str | None
    source: str | None


class ReportShape(TypedDict, total=False):
    """The parts of a report record the table reads, and their JSON types."""

    kind: Required[str]
    version: Required[int]
    model: _Model | str | None
    columns: Required[list[_ReportColumn]]
    needle: _Needle | None


class NeedleShape(TypedDict, total=False):
    """The parts of a Needle record the table reads, and their JSON types."""

    kind: Required[str]
    version: Required[int]
    model: _Model | str | None
    summary: Required[list[_NeedleRow]]


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


def column_entry(name: str, column, split, message: str, figures: dict | None, scored: int, note: str = "") -> dict:
    """One column of the record: name, spec, status (`ok`, `stopped` short of the split, `error`), message, the
    split it was scored on (context_tokens, scored_tokens actually scored), its figure row (None: none) and, when
    the strategy has one, its `note` (`Strategy.runtime_note`, e.g. TriAttention's calibration cost)."""
    strategy = column.strategy
    status = "error" if message else ("ok" if scored == split.scored_tokens else "stopped")
    entry = {"name": name, "spec": {"strategy": strategy.name, **strategy.knobs()} if strategy is not None else {},
             "status": status, "message": message,
             "split": {"context_tokens": split.context_tokens, "scored_tokens": scored}, "figures": figures}
    return {**entry, "note": note} if note else entry


def build_record(model: dict, split, text: dict, columns: list[dict], reference: dict | None, wall_s: float,
                 stopped: bool, needle: dict | None = None) -> dict:
    """The JSON record of a report run."""
    return {"kind": RECORD_KIND, "version": RECORD_VERSION, "model": model,
            "split": {"context_tokens": split.context_tokens, "scored_tokens": split.scored_tokens},
            "text": text, "reference": reference, "columns": columns, "needle": needle,
            "wall_s": wall_s, "stopped": stopped}


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
    """Table rows (`TABLE_FIELDS`) of a report, Compare or Needle record; figures a record lacks are None.
    Each row's `protocol` (`report`, `compare`, `needle`) says which figures it holds (`merge_rows`).

    Raises:
        ValueError: one line: not one of those records, a version this kvlab does not read, too many columns,
            or a part whose fields have the wrong type.
    """
    if not isinstance(record, dict):
        raise ValueError("not a report, Compare or Needle record (the JSON is not an object)")
    try:
        return _rows(_checked(record), source)
    except (AttributeError, KeyError, TypeError) as err:
        raise ValueError(f"not a well-formed {record.get('kind') or record.get('format')} record: its columns "
                         f"lack {err}" if isinstance(err, KeyError) else
                         f"not a well-formed {record.get('kind') or record.get('format')} record: a field has "
                         "the wrong type") from None


def _checked(record: dict) -> dict:
    """`record`'s known parts, its version and types checked (see the module docstring). Raises ValueError."""
    kind = record.get("kind")
    if kind in (RECORD_KIND, NEEDLE_KIND):
        name, readable, shape, key, most = (("report", RECORD_VERSION, ReportShape, "columns", MAX_RECORD_COLUMNS)
                                            if kind == RECORD_KIND else
                                            ("Needle", NEEDLE_VERSION, NeedleShape, "summary", MAX_COLUMNS))
        refusal = version_refusal(name, "version", record.get("version"), (readable,))
        if refusal:
            raise ValueError(refusal)
        if isinstance(record.get(key), list) and len(record[key]) > most:
            raise ValueError(f"the {name} record has {len(record[key]):,} columns; a {name} run has at most {most}")
        return shaped(record, shape, f"not a well-formed {kind} record, its")
    if record.get("format") == "kvlab.compare":
        check_record(record)
        return known_fields(record)
    raise ValueError("not a report, Compare or Needle record (no kind kvlab.report / kvlab.needle, "
                     "no format kvlab.compare)")


def _rows(record: dict, source: str) -> list[dict]:
    model = _model_name(record)
    base = dict.fromkeys(TABLE_FIELDS)
    rows = []
    if record.get("kind") == RECORD_KIND:
        needle = {row["strategy"]: needle_figures(row) for row in (record.get("needle") or {}).get("summary", [])}
        for column in record["columns"]:
            rows.append({**base, **(column.get("figures") or {}), **needle.get(column["name"], {}),
                         "model": model, "column": column["name"], "status": column["status"],
                         "context_tokens": column["split"]["context_tokens"], "source": source,
                         "message": column.get("message", ""), "protocol": "report"})
    elif record.get("kind") == NEEDLE_KIND:
        for row in record.get("summary", []):
            rows.append({**base, **needle_figures(row), "model": model, "column": row["strategy"],
                         "status": "ok" if not row.get("errors") else "error", "source": source, "message": "",
                         "protocol": "needle"})
    else:
        for column in record["columns"]:
            rows.append({**base, "model": model, "column": column.get("name"), "status": column.get("status"),
                         "same_top": column.get("top1_agreement"), "kld_mean": column.get("mean_kl"),
                         "cache_bytes_end": column.get("peak_cache_bytes"),
                         "decode_tok_s": column.get("decode_tok_s"), "source": source,
                         "message": "Compare: teacher-forced on the baseline's continuation", "protocol": "compare"})
    return rows


def load_record(path: str | Path, name: str | None = None) -> dict:
    """A record from a JSON file, read by `kvlab.measure.record_json.load_json` (size, depth and numbers
    capped). Raises ValueError (one line, naming the file as `name`, default its file name) when it cannot be read as a
    JSON object; a page passes the uploaded file's own name so no server path is shown."""
    shown = Path(path).name if name is None else name
    try:
        return load_json(path)
    except RecordJSONError as err:
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
