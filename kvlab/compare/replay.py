"""Reading a Compare run record back: the JSON that `python -m kvlab compare --json` and the page's export
write, read by the one record reader (`kvlab.record.read_record`, kind `kvlab.compare.record.COMPARE`) and
turned into the runner's own result objects, so a run measured on one machine can be shown again elsewhere
exactly as it was (`python -m kvlab compare --replay FILE`, the Compare tab's replay and share links).

Every Compare record kvlab has written replays: version 4 (the envelope), 3 and 2 (`format`/`format_version`)
and 1 (before versioning), upgraded as they are read; anything else (another tool's JSON, a newer version) is
refused with a message that says what was found. `Replayed.record` keeps only the fields the record's shape
knows, so a record written again from it (a replay's export and share link) carries nothing a crafted file
added. Reads only; runs no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..measure import ColumnTiming
from ..record import RecordError, read_record
from ..protocol import RunDone
from .events import ColumnResult
from .record import COMPARE

WANTED = "kvlab Compare run"
"""What a refused file is not, in its message."""


@dataclass(frozen=True)
class Replayed:
    """A record read back: the record itself (its known fields only), its columns as a `RunDone`, and the line
    that labels it."""

    record: dict
    done: RunDone
    label: str


def results_of(record: dict) -> list[ColumnResult]:
    """The columns of a record in the current layout as `ColumnResult`s."""
    return [ColumnResult(**{**column, "timing": ColumnTiming.from_json(column.get("timing"))})
            for column in record["columns"]]


def replay_label(record: dict) -> str:
    """e.g. `replayed: measured on Intel Xeon (2 cores, no GPU) at 2026-11-30T08:00:00+00:00`."""
    env = record.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name")
    where = f"{env.get('cpu') or 'an unknown machine'} ({env.get('cores_available', '?')} cores, {gpu or 'no GPU'})"
    return f"replayed: measured on {where} at {record.get('measured_at', 'an unknown time')}"


def load_record(source: str | Path | bytes) -> Replayed:
    """Read, check and rebuild a record; no message names the file or its folder.

    Raises:
        RecordError: the file cannot be replayed; the message (one line) says why.
    """
    _, record = read_record(source, (COMPARE,), WANTED)
    if not record["columns"]:
        raise RecordError("the record has no columns to replay")
    results = results_of(record)
    record["columns"] = [result.to_json() for result in results]  # as kvlab writes a column, nothing more
    done = RunDone(record, float(record.get("wall_s") or 0.0), bool(record.get("stopped")), results)
    return Replayed(record, done, replay_label(record))
