"""Recall for the quality report: the Needle grid (`kvlab.needle`) run for the report's columns, summarised per column.

The Needle runner takes at most `kvlab.columns.MAX_COLUMNS` columns, so the report's columns run in
batches, each with a dense `dynamic` column first: a cell the dense cache misses is beyond the model and gated
in every column of its batch (`kvlab.needle.record`), as in the Needle tab. Each column's hits over its scored
cells (every length x depth x seed not gated) become `NEEDLE_FIELDS` with a Wilson 95 % interval
(`kvlab.quality.record.needle_figures`). This module runs the grid through the Needle runner; it does not render.
"""

from __future__ import annotations

import functools
import threading

from ..columns import MAX_COLUMNS

DEFAULT_LENGTHS = "1k"
DEFAULT_DEPTHS = "0,0.5,1"
DEFAULT_SEEDS = "0,1,2"
"""The report's needle grid: one length, three depths, three seeds (9 cells per column)."""
DENSE = "dynamic"


def needle_grid(loaded, lengths: str = DEFAULT_LENGTHS, depths: str = DEFAULT_DEPTHS, seeds: str = DEFAULT_SEEDS):
    """The checked `kvlab.needle.grid.Grid` for `loaded`. Raises GridError (a ValueError) when nothing is left."""
    from ..needle.grid import parse_grid
    from ..needle.prompt import key_tokens, min_context_tokens
    from ..needle.runner import max_positions

    return parse_grid(lengths, depths, seeds, max_positions=max_positions(loaded),
                      min_tokens=min_context_tokens(loaded.tokenizer),
                      key_tokens=functools.partial(key_tokens, loaded.tokenizer))


def run_recall(loaded, names_and_specs: list[tuple[str, object]], grid, stop: threading.Event | None = None,
               on_cell=None) -> dict:
    """The needle part of a report record: {"grid": ..., "problems": [...], "summary": [one Needle summary row
    per column, keyed by `strategy` = the column's name]}. `on_cell(event)` sees every Needle event.

    Columns are (report column name, Column or spec); a column the Needle runner refuses keeps its message in
    its row (`errors` >= 1, no hits).
    """
    from ..columns import Column
    from ..needle.runner import run_needle
    from ..protocol import collect

    batch_size = MAX_COLUMNS - 1
    summary: list[dict] = []
    for start in range(0, len(names_and_specs), batch_size):
        batch = names_and_specs[start:start + batch_size]
        specs = [Column.from_text(DENSE), *(spec for _, spec in batch)]
        done = collect(run_needle(loaded, specs, grid, stop), on_cell)
        rows, columns = done.record["summary"], done.record["columns"]
        if start == 0:
            summary.append({**rows[0], "strategy": DENSE})
        for index, ((name, _), row) in enumerate(zip(batch, rows[1:]), 1):
            summary.append({**row, "strategy": name, "message": columns[index]["message"]})
    return {"grid": {"lengths": grid.lengths, "depths": grid.depths, "seeds": grid.seeds,
                     "new_tokens": grid.new_tokens}, "problems": list(grid.problems), "summary": summary}
