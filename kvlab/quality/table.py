"""The quality report's table: plain text for the terminal, Markdown for records/, CSV, and the Pareto marks.

Rows are `kvlab.quality.record.TABLE_FIELDS` dicts (from a run or from saved records). A row scored against
an engine's own reference (`engine:llamacpp f16`) rather than the dense one is named with it
(`column_label`). The Pareto front is taken per model and reference over (mean cache bytes, mean KL): a column
is on it when no other column of that model and reference holds fewer bytes with a KL no larger, or the same
bytes with a smaller KL (`kvlab.quality.stats.pareto_front`): KLs against different references do not compare.
Pure: no model, no files.
"""

from __future__ import annotations

import csv
import io

from .record import TABLE_FIELDS
from .stats import pareto_front

MIB = 1 << 20
HEADERS = ("column", "split", "PPL ratio", "ΔPPL", "mean KL", "p99 KL", "max KL", "top-1 [95% CI]",
           "cache MiB mean", "MiB end", "vs dense", "tok/s", "needle [95% CI]", "front")


DENSE_REFERENCE = "dynamic"
"""The dense reference's name; rows scored against it are named by their column alone."""


def column_label(row: dict) -> str:
    """The row's column name, with `(vs <reference>)` when it was scored against another reference than the dense
    one (an engine column against its engine's own run)."""
    reference = row.get("reference")
    if reference and reference != DENSE_REFERENCE:
        return f"{row['column']} (vs {reference})"
    return row["column"]


def front_group(row: dict) -> tuple:
    """The rows a row's Pareto front is taken among: its model and its reference (older rows: the dense one)."""
    return row["model"], row.get("reference") or DENSE_REFERENCE


def pareto_marks(rows: list[dict]) -> list[bool]:
    """For each row: on its (model, reference)'s Pareto front of (cache_bytes_mean, kld_mean), lower is better on
    both. Rows without both figures are never on it."""
    marks = [False] * len(rows)
    for group in {front_group(row) for row in rows}:
        index = [i for i, row in enumerate(rows) if front_group(row) == group
                 and row.get("cache_bytes_mean") is not None and row.get("kld_mean") is not None]
        for i, on in zip(index, pareto_front([(rows[i]["cache_bytes_mean"], rows[i]["kld_mean"]) for i in index])):
            marks[i] = on
    return marks


def _num(value, digits: int = 4, unc=None) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"{text} ± {unc:.{digits}f}" if unc is not None else text


def _interval(value, low, high, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" if low is not None else f"{value:.{digits}f}"


def _needle(row: dict) -> str:
    if row.get("needle_cells") is None:
        return "-"
    return f"{row['needle_hits']}/{row['needle_cells']} [{row['needle_low']:.2f}, {row['needle_high']:.2f}]"


def cells(row: dict, on_front: bool) -> list[str]:
    """The HEADERS cells of one row, as text."""
    if row.get("status") == "error":
        return [column_label(row), "-", f"error: {row.get('message', '')}", *["-"] * (len(HEADERS) - 3)]
    split = (f"{row['context_tokens']}+{row['scored_tokens']}" if row.get("context_tokens") is not None
             and row.get("scored_tokens") is not None else "-")
    mib = row.get("cache_bytes_mean")
    end = row.get("cache_bytes_end")
    return [column_label(row), split, _num(row.get("ppl_ratio"), 4, row.get("ppl_ratio_unc")),
            _num(row.get("ppl_diff"), 4, row.get("ppl_diff_unc")), _num(row.get("kld_mean"), 5),
            _num(row.get("kld_p99"), 4), _num(row.get("kld_max"), 4),
            _interval(row.get("same_top"), row.get("same_top_low"), row.get("same_top_high")),
            f"{mib / MIB:.2f}" if mib is not None else "-", f"{end / MIB:.2f}" if end is not None else "-",
            _num(row.get("bytes_vs_dense"), 3), _num(row.get("decode_tok_s"), 1), _needle(row),
            "*" if on_front else ""]


def format_table(rows: list[dict]) -> str:
    """A plain-text table, one block per model (its name above it), columns aligned; a column that failed reads
    `error (below)` in its row and its message goes on a line under the block, so it does not widen the table."""
    marks = pareto_marks(rows)
    blocks = []
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = [(row, mark) for row, mark in zip(rows, marks) if row["model"] == model]
        body = [cells(row, mark) for row, mark in mine]
        errors = [f"{column_label(row)}: {row.get('message', '')}" for row, _ in mine if row.get("status") == "error"]
        for line, (row, _) in zip(body, mine):
            if row.get("status") == "error":
                line[2] = "error (below)"
        widths = [max(len(h), *(len(line[k]) for line in body)) for k, h in enumerate(HEADERS)]
        lines = [model, "  ".join(h.ljust(w) for h, w in zip(HEADERS, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
        blocks.append("\n".join(lines + errors))
    return "\n\n".join(blocks) + ("\n* on the Pareto front of mean cache bytes against mean KL (per reference)"
                                   if rows else "")


def format_markdown(rows: list[dict]) -> str:
    """The same table in Markdown (records/<model>.md)."""
    marks = pareto_marks(rows)
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells(row, mark)) + " |" for row, mark in zip(rows, marks)]
    return "\n".join(lines) + "\n"


def rows_to_csv(rows: list[dict]) -> str:
    """One CSV row per table row with every TABLE_FIELDS figure and `pareto` (1 on the front)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*TABLE_FIELDS, "pareto"], extrasaction="ignore")
    writer.writeheader()
    for row, mark in zip(rows, pareto_marks(rows)):
        writer.writerow({**row, "pareto": int(mark)})
    return out.getvalue()
