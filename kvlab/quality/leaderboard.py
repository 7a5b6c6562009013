"""The reference leaderboard: the quality report for every registered strategy at its documented settings, per
bundled model, written as `<folder>/<model>.json` (the report record) and `<folder>/<model>.md` (its table).

`kvlab report --leaderboard FOLDER` runs it; the columns are
`kvlab.quality.defaults.LEADERBOARD_COLUMNS` on the shipped text, the models `LEADERBOARD_MODELS`. A column a
model refuses (transformers' `QuantizedCache` on Gemma 3's sliding layers) keeps its reason in its row. The
full run is long (tens of minutes per model on 2 cores); `--scored-tokens` / `--context-tokens` make a small
one. This module loads models and runs the report; the figures are `kvlab.quality.report`'s.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from ..protocol import collect
from .defaults import LEADERBOARD_COLUMNS, LEADERBOARD_MODELS, SHIPPED_TEXT_INFO, shipped_text
from .record import rows_from_record
from .report import DEFAULT_MAX_TOKENS, DEFAULT_SCORED_TOKENS, run_report
from .table import format_markdown


def model_slug(source: str) -> str:
    """A file name for a model source: `bundled` -> `smollm2`, `bundled:gemma-3-270m` -> `gemma-3-270m`,
    `org/name` -> `org-name`."""
    if source == "bundled":
        return "smollm2"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", source.removeprefix("bundled:")).strip("-") or "model"


def leaderboard_for(loaded, columns: str = LEADERBOARD_COLUMNS, *, scored_tokens: int = DEFAULT_SCORED_TOKENS,
                    context_tokens: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                    stop: threading.Event | None = None, on_event=None) -> dict:
    """One model's report record on the shipped text (`on_event(event)` sees every report event)."""
    ids = loaded.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :max_tokens]
    return collect(run_report(loaded, ids, columns, scored_tokens=scored_tokens, context_tokens=context_tokens,
                              stop=stop, text_info=dict(SHIPPED_TEXT_INFO)), on_event).record


def write_entry(folder: Path, source: str, record: dict, command: str = "") -> tuple[Path, Path]:
    """Write `<folder>/<slug>.json` and `.md` for one model's record; returns both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    slug = model_slug(source)
    if command:
        record = {**record, "command": command}
    json_path, md_path = folder / f"{slug}.json", folder / f"{slug}.md"
    json_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    split = record["split"]
    head = (f"# Quality report: {record['model'].get('name', source)}\n\n"
            f"Text: {record['text'].get('title', record['text'].get('name', ''))} ({record['text'].get('licence', '')}); "
            f"{split['context_tokens']} context tokens, {split['scored_tokens']} scored one per forward against "
            f"dense `dynamic`{_engine_line(record)}. Wall time {record['wall_s']:.0f} s.\n\n" + (f"`{command}`\n\n" if command else ""))
    md_path.write_text(head + format_markdown(rows_from_record(record, json_path.name)), encoding="utf-8")
    return json_path, md_path


def _engine_line(record: dict) -> str:
    """` (engine columns against ...)` naming the engine references of a record, '' without any."""
    names = [row["name"] for row in record.get("engine_references") or []]
    return f" (engine columns against their engine's own run: {', '.join(f'`{n}`' for n in names)})" if names else ""
