"""The Needle tab's view model: events of a needle run in, plot frames, status and summary table out.

`NeedleView.apply(event)` takes `kvlab.needle.runner` events; `heatmap_frame(i)` gives column i's cells as
points (context length x depth, one outcome colour scale shared by every column: hit, miss, beyond the model)
with the answer, key, key log-prob and cache bytes for the hover; `pareto_frame()` puts every column on hit
rate against mean cache bytes (columns that share a point drawn a little apart, `SPREAD`) and marks the Pareto front (no other column has a higher or equal hit rate
with fewer or equal bytes, one of them strictly). Both frames hold one blank row (no y, so nothing is drawn)
for each series of their roster without a point yet (`heatmap_frame`: every outcome; `pareto_frame`: every
column that runs), so a native plot's colour domain, fixed by the first frame it builds its spec from, holds
every series of the run. Pure: no gradio, no model.
"""

from __future__ import annotations

import pandas as pd

from kvlab.needle.record import CellRecord, summarize
from kvlab.needle.runner import NeedleCell
from kvlab.protocol import ColumnFailed, RunDone, RunStarted

from ..shared.markup import md_text

NAN = float("nan")
HIT, MISS, GATED, ERROR = "hit", "miss", "beyond the model", "error"
OUTCOME_COLORS = {HIT: "#2e7d32", MISS: "#c62828", GATED: "#9e9e9e", ERROR: "#6a1b9a"}
"""The one colour scale every column's heatmap uses."""
HEATMAP_FIELDS = ("tokens", "depth", "outcome", "answer", "key", "key_logprob", "cache_MiB", "seed")
PARETO_FIELDS = ("column", "cache_MiB", "hit_rate", "pareto", "shown_rate", "shares_point_with")
SPREAD = 0.03
"""Columns with the same hit rate and mean bytes (eviction methods at one ratio often have both) are drawn this
far apart in hit rate (`shown_rate`), centred on their true rate, so each is seen; the hover gives the true
`hit_rate` and the columns it shares the point with."""
RATE_LIMITS = (-0.12, 1.12)
"""The hit-rate axis, padded beyond 0 and 1 so no point (nor a spread one) sits on the plot's edge."""
MIB_PADDING = 0.1
"""The bytes axis runs from 0 to (1 + this) × the largest column's mean MiB, so the densest column is not cut."""
MIB = 2 ** 20


def outcome(record: CellRecord) -> str:
    """The cell's colour class: gated cells are 'beyond the model' whatever the column answered."""
    if record.status != "ok":
        return ERROR
    if record.gated:
        return GATED
    return HIT if record.hit else MISS


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """For (bytes, rate) points: True where no other point has bytes <= and rate >= with one strictly better."""
    return [not any(b2 <= b and r2 >= r and (b2 < b or r2 > r) for b2, r2 in points) for b, r in points]


class NeedleView:
    """What the page shows of one run, updated one event at a time."""

    def __init__(self):
        self.columns: list[str] = []
        self.cells: list[tuple[int, float, int]] = []
        self.dense: list[int] = []
        self.problems: list[str] = []
        self.messages: dict[int, str] = {}
        self.records: list[CellRecord] = []
        self.record: dict | None = None
        self.stopped = False

    def apply(self, event) -> None:
        if isinstance(event, RunStarted):
            self.columns, self.cells = list(event.columns), list(event.plan.cells)
            self.dense, self.problems = list(event.plan.dense_columns), list(event.plan.problems)
        elif isinstance(event, ColumnFailed):
            self.messages[event.column] = f"{event.status}: {event.message}"
        elif isinstance(event, NeedleCell):
            self.records.append(event.record)
        elif isinstance(event, RunDone):
            self.records, self.record, self.stopped = list(event.results), event.record, event.stopped

    def ran(self, column: int) -> bool:
        """Whether `column` runs or ran: it has a cell, or no message stopped it before its first one."""
        return column not in self.messages or any(r.column == column for r in self.records)

    def pareto_roster(self) -> list[str]:
        """The names of the columns the Pareto plot may show: every column that runs or ran."""
        return [name for i, name in enumerate(self.columns) if self.ran(i)]

    def heatmap_frame(self, column: int) -> pd.DataFrame:
        """Column `column`'s finished cells, one row each with HEATMAP_FIELDS (tokens as text, so lengths are
        evenly spaced categories), then a blank row (depth NaN) for each outcome of OUTCOME_COLORS not drawn."""
        rows = [(f"{r.target_tokens}", r.depth, outcome(r), r.answer_text, r.key,
                 round(r.key_logprob, 2) if r.key_logprob is not None else NAN,
                 round(r.cache_bytes / MIB, 2) if r.cache_bytes is not None else NAN, r.seed)
                for r in self.records if r.column == column]
        first = rows[0][0] if rows else f"{self.cells[0][0]}" if self.cells else ""
        drawn = {row[2] for row in rows}
        rows += [(first, NAN, name, "", "", NAN, NAN, NAN) for name in OUTCOME_COLORS if name not in drawn]
        return pd.DataFrame(rows, columns=HEATMAP_FIELDS)

    def summary(self) -> list[dict]:
        return summarize(self.records, self.columns, self.dense)

    def pareto_frame(self) -> pd.DataFrame:
        """One point per column that has scored cells: mean cache MiB, hit rate, on the Pareto front or not; then
        a blank row (NaN bytes and rate) for each column of `pareto_roster()` without a point yet."""
        rows = [row for row in self.summary() if row["hit_rate"] is not None and row["mean_cache_bytes"] is not None]
        front = pareto_front([(row["mean_cache_bytes"], row["hit_rate"]) for row in rows])
        data = [(row["strategy"], round(row["mean_cache_bytes"] / MIB, 2), round(row["hit_rate"], 3),
                 "front" if on else "dominated") for row, on in zip(rows, front)]
        shared: dict[tuple, list[str]] = {}
        for name, mib, rate, _ in data:
            shared.setdefault((mib, rate), []).append(name)
        spread = []
        for name, mib, rate, on in data:
            group = shared[(mib, rate)]
            offset = (group.index(name) - (len(group) - 1) / 2) * SPREAD
            others = ", ".join(other for other in group if other != name)
            spread.append((name, mib, rate, on, round(rate + offset, 4), others))
        drawn = {row[0] for row in spread}
        spread += [(name, NAN, NAN, "", NAN, "") for name in self.pareto_roster() if name not in drawn]
        return pd.DataFrame(spread, columns=PARETO_FIELDS)

    def pareto_limits(self) -> tuple[list[float], list[float]]:
        """(x_lim, y_lim) of the Pareto plot: bytes from 0 to MIB_PADDING past the largest, rate RATE_LIMITS."""
        frame = self.pareto_frame()
        top = float(frame["cache_MiB"].max()) if frame["cache_MiB"].notna().any() else 1.0
        return [0.0, round(top * (1 + MIB_PADDING), 2) or 1.0], list(RATE_LIMITS)

    def table(self) -> pd.DataFrame:
        """The summary per column, for the page."""
        rows = [{"column": row["strategy"], "hits / scored": f"{row['hits']} / {row['scored']}",
                 "gated": row["gated"],
                 "mean key log-prob (nats)": None if row["mean_key_logprob"] is None else round(row["mean_key_logprob"], 2),
                 "mean cache MiB": None if row["mean_cache_bytes"] is None else round(row["mean_cache_bytes"] / MIB, 2),
                 "bytes vs dense": None if row["bytes_vs_dense"] is None else round(row["bytes_vs_dense"], 2),
                 "note": self.messages.get(row["column"], "")} for row in self.summary()]
        return pd.DataFrame(rows)

    def status_text(self) -> str:
        """Progress (cells finished of cells planned), the grid's problems and how it ended (Markdown; the problems,
        which may quote the typed columns, literal)."""
        planned = len(self.cells) * max(1, len(self.columns) - len(self.messages))
        lines = [f"{len([r for r in self.records if r.status == 'ok'])} of {planned} cells done"]
        if not self.dense:
            lines.append("no column keeps every token on this model, so no cell is gated")
        lines += [f"⚠️ {md_text(problem)}" for problem in self.problems]
        if self.record is not None:
            lines.append(f"stopped after {self.record['wall_s']:.1f} s" if self.stopped
                         else f"finished in {self.record['wall_s']:.1f} s")
        return "  \n".join(lines)


NO_PRESET = "(none)"
"""The preset picker's entry that leaves the form as it is."""


def preset_fields(name: str) -> dict | None:
    """The form a needle preset fills: `columns` (compare syntax, knobs that differ from their defaults),
    `lengths`, `depths`, `seeds` (comma lists), `new_tokens` and its `description`; None for NO_PRESET.

    Raises:
        PresetError: the preset is missing or invalid (the message names the file and field).
    """
    from kvlab.budget import strategy_item
    from kvlab.columns import Column
    from kvlab.needle.preset import load_needle_preset

    if not name or name == NO_PRESET:
        return None
    preset = load_needle_preset(name)
    columns = ", ".join(strategy_item(Column.from_spec(spec).strategy) for spec in preset.columns)
    grid = preset.grid
    return {"columns": columns, "lengths": ", ".join(str(length) for length in grid.lengths),
            "depths": ", ".join(f"{depth:g}" for depth in grid.depths),
            "seeds": ", ".join(str(seed) for seed in grid.seeds), "new_tokens": grid.new_tokens,
            "description": " ".join(preset.description.split())}
