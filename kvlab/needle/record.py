"""Needle records: one `CellRecord` per cell and column, the dense gate, the per-column summary, JSON and CSV.

A cell a dense column (one whose cache keeps every token on this model) misses is "beyond the model": it is
gated in every column, so no strategy is blamed for the model's own limit. The record holds each cell's exact
prompt text and ids, so a reader can re-run any cell with plain transformers (`reproduce_snippet`). This
module computes and formats; it does not run a model.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path

from typing_extensions import NotRequired, Required, TypedDict

from ..columns import MAX_COLUMNS
from ..measure.record_json import json_shape
from ..record import RecordError, RecordKind, new_record, read_record

CSV_FIELDS = ("column", "strategy", "context_tokens", "depth", "seed", "key", "key_position", "answer_text", "hit",
              "key_logprob", "key_rank", "gated", "cache_bytes", "prefill_s", "status", "message")


@dataclass
class CellRecord:
    """One cell under one column.

    column: the column's index; strategy: its name (`Column.describe()`); context_tokens: the real prompt
    length; target_tokens: the length asked for; depth: 0 (needle first) .. 1 (needle last); seed; key;
    key_position: index of the needle's first token in prompt_ids; prompt_text / prompt_ids: the exact prompt
    (plain text, no special tokens); answer_ids / answer_text: the greedy answer; hit: the key appears in it;
    key_logprob: nats; key_rank: 1 = most likely; gated: a dense column missed this cell; cache_bytes: exact
    bytes held after the answer; prefill_s: seconds of the prefill forward. status: `ok` or `error`
    (`message` says why; the scores are then None).
    """

    column: int
    strategy: str
    context_tokens: int
    target_tokens: int
    depth: float
    seed: int
    key: str
    key_position: int
    prompt_text: str
    prompt_ids: list[int]
    answer_ids: list[int] = field(default_factory=list)
    answer_text: str = ""
    hit: bool | None = None
    key_logprob: float | None = None
    key_rank: int | None = None
    gated: bool = False
    cache_bytes: int | None = None
    prefill_s: float | None = None
    status: str = "ok"
    message: str = ""

    @property
    def cell(self) -> tuple[int, float, int]:
        """(target_tokens, depth, seed): the grid cell, the same in every column."""
        return self.target_tokens, self.depth, self.seed

    def to_json(self) -> dict:
        return asdict(self)


def gated_cells(records: list[CellRecord], dense_columns: list[int]) -> set[tuple[int, float, int]]:
    """Cells (`CellRecord.cell`) some dense column ran and missed."""
    return {r.cell for r in records if r.column in dense_columns and r.status == "ok" and not r.hit}


def apply_gate(records: list[CellRecord], dense_columns: list[int]) -> None:
    """Set `gated` on every record (in place) from the dense columns' misses."""
    gated = gated_cells(records, dense_columns)
    for record in records:
        record.gated = record.cell in gated


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(records: list[CellRecord], columns: list[str], dense_columns: list[int]) -> list[dict]:
    """One row per column: cells run, `hits` among the cells not gated, `scored` (those cells), `gated`, hit
    rate over scored cells, mean key_logprob (nats), mean cache_bytes and that relative to the first dense
    column (None without one), errors."""
    rows = []
    dense_bytes = None
    for index, name in enumerate(columns):
        mine = [r for r in records if r.column == index]
        ok = [r for r in mine if r.status == "ok"]
        scored = [r for r in ok if not r.gated]
        hits = sum(1 for r in scored if r.hit)
        mean_bytes = _mean([r.cache_bytes for r in ok])
        if dense_columns and index == dense_columns[0]:
            dense_bytes = mean_bytes
        rows.append({"column": index, "strategy": name, "cells": len(mine), "hits": hits, "scored": len(scored),
                     "gated": sum(1 for r in ok if r.gated),
                     "hit_rate": hits / len(scored) if scored else None,
                     "mean_key_logprob": _mean([r.key_logprob for r in ok]),
                     "mean_cache_bytes": mean_bytes, "errors": len(mine) - len(ok)})
    for row in rows:
        row["bytes_vs_dense"] = (row["mean_cache_bytes"] / dense_bytes
                                 if dense_bytes and row["mean_cache_bytes"] is not None else None)
    return rows


def format_summary(rows: list[dict]) -> str:
    """A plain-text table of `summarize` rows."""
    lines = [f"{'column':<34} {'hits/scored':>11} {'gated':>5} {'key logprob':>11} {'cache MiB':>9} {'vs dense':>8}"]
    for row in rows:
        logprob = f"{row['mean_key_logprob']:.2f}" if row["mean_key_logprob"] is not None else "-"
        mib = f"{row['mean_cache_bytes'] / 2**20:.2f}" if row["mean_cache_bytes"] is not None else "-"
        ratio = f"{row['bytes_vs_dense']:.2f}" if row["bytes_vs_dense"] is not None else "-"
        lines.append(f"{row['strategy'][:34]:<34} {row['hits']:>5}/{row['scored']:<5} {row['gated']:>5} "
                     f"{logprob:>11} {mib:>9} {ratio:>8}")
    return "\n".join(lines)


def hits_grid(records: list[CellRecord], column: int) -> dict[tuple[int, float], tuple[int, int]]:
    """(target_tokens, depth) -> (hits, cells run) of one column over its seeds."""
    grid: dict[tuple[int, float], tuple[int, int]] = {}
    for r in records:
        if r.column == column and r.status == "ok":
            hits, total = grid.get((r.target_tokens, r.depth), (0, 0))
            grid[(r.target_tokens, r.depth)] = (hits + bool(r.hit), total + 1)
    return grid


def build_record(model: dict, grid: dict, columns: list[dict], records: list[CellRecord], dense_columns: list[int],
                 problems: list[str], wall_s: float, stopped: bool, environment: dict | None = None) -> dict:
    """The JSON record of a run (`NEEDLE`, in the envelope of `kvlab.record.new_record`): model info and the
    environment, the grid asked for, each column (name, spec, status, message), every cell, the summary, the
    grid's problems, the wall time (s) and whether it was stopped."""
    names = [c["name"] for c in columns]
    return new_record(NEEDLE, model=model, environment=environment, columns=columns, wall_s=wall_s,
                      stopped=stopped, grid=grid, dense_columns=dense_columns, cells=[r.to_json() for r in records],
                      summary=summarize(records, names, dense_columns), problems=problems)


def records_to_csv(records: list[CellRecord]) -> str:
    """One CSV row per cell with CSV_FIELDS (the prompt itself stays in the JSON record)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for record in records:
        row = record.to_json()
        row["column"] = record.column
        writer.writerow(row)
    return out.getvalue()


class _Column(TypedDict, total=False):
    name: Required[str]
    spec: dict
    status: str
    message: str


class SummaryRow(TypedDict, total=False):
    """One column's row of a Needle record's summary (`summarize`; a report's recall rows add `message`)."""

    column: int
    strategy: Required[str]
    cells: int
    hits: Required[int]
    scored: Required[int]
    gated: int
    hit_rate: float | None
    mean_key_logprob: float | None
    mean_cache_bytes: float | None
    bytes_vs_dense: float | None
    errors: int
    message: str


class _Grid(TypedDict, total=False):
    lengths: list[int]
    depths: list[float]
    seeds: list[int]
    new_tokens: int


NEEDLE = RecordKind("kvlab.needle", "Needle", 1, (1,), _Column,
                    {"grid": NotRequired[_Grid], "dense_columns": NotRequired[list[int]],
                     "cells": Required[list[json_shape(CellRecord)]], "summary": Required[list[SummaryRow]],
                     "problems": NotRequired[list[str]]}, MAX_COLUMNS)
"""The Needle record (version 1; records written before the envelope lack `measured_at` and `environment`)."""


def load_record(path: str | Path) -> tuple[dict, list[CellRecord]]:
    """(record, its cells as CellRecords) from a JSON file written by `kvlab needle --json` or the tab, read by
    `kvlab.record.read_record` (size, depth and numbers capped, every field's type checked, only the known
    ones kept).

    Raises:
        ValueError: one line naming the file: not JSON, past a limit, not a needle record, a version this kvlab
            does not read, or a field missing or of the wrong type.
    """
    try:
        _, record = read_record(path, (NEEDLE,), "needle")
    except RecordError as err:
        raise ValueError(f"cannot read needle record {Path(path).name}: {err}") from None
    return record, [CellRecord(**cell) for cell in record["cells"]]


SNIPPET = '''\
import json
from transformers import AutoModelForCausalLM, AutoTokenizer

record = json.load(open("{record_path}"))
cell = record["cells"][{index}]  # {strategy}, {context_tokens} tokens, depth {depth}, seed {seed}
tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForCausalLM.from_pretrained("{model}", dtype="float32")
input_ids = tokenizer(cell["prompt_text"], add_special_tokens=False, return_tensors="pt")["input_ids"]
assert input_ids[0].tolist() == cell["prompt_ids"]
out = model.generate(input_ids, max_new_tokens={new_tokens}, do_sample=False)
answer = tokenizer.decode(out[0, input_ids.shape[1]:], skip_special_tokens=True)
print(repr(answer), "hit" if cell["key"] in answer else "miss", "| recorded:", repr(cell["answer_text"]))
'''


def reproduce_snippet(record: dict, index: int, record_path: str = "out.json") -> str:
    """Python that re-runs cell `index` of `record` with plain transformers' `generate()` (a dense cache; the
    answer matches a dense column's)."""
    cell = record["cells"][index]
    model = record.get("model", {}).get("hub_id") or record.get("model", {}).get("name", "MODEL")
    return SNIPPET.format(record_path=record_path, index=index, strategy=cell["strategy"],
                          context_tokens=cell["context_tokens"], depth=cell["depth"], seed=cell["seed"],
                          model=model, new_tokens=record["grid"]["new_tokens"])
