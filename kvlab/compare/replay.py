"""Reading a Compare run record back: the JSON that `python -m kvlab compare --json` and the page's export
write, checked and turned into the runner's own result objects, so a run measured on one machine can be shown
again elsewhere exactly as it was (`python -m kvlab compare --replay FILE`, the Compare tab's replay).

A record carries `format: "kvlab.compare"` and `format_version` (see `kvlab.compare.summary.RECORD_FORMAT_VERSION`);
a version-2 record is upgraded to the current layout as it is read (`kvlab.measure.record.upgrade_v2`);
anything else (another tool's JSON, a record from before versioning, a newer layout) is refused with a message
that says what was found. Reads only; runs no model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..measure import ColumnTiming
from ..measure.record import upgrade_v2
from .events import ColumnResult, RunDone
from .summary import RECORD_FORMAT, RECORD_FORMAT_VERSION

UPGRADED_VERSION = 2
"""The older `format_version` that is still replayed, upgraded on load."""
MAX_RECORD_BYTES = 64 * 2**20
"""Largest record file read (a 4,096-token, 8-column run is about 2 MB)."""


class RecordError(ValueError):
    """The file is not a kvlab Compare record this version can replay; the message says why."""


@dataclass(frozen=True)
class Replayed:
    """A record read back: the record itself, its columns as a `RunDone`, and the line that labels it."""

    record: dict
    done: RunDone
    label: str


def read_record(source: str | Path | bytes) -> dict:
    """The record's JSON object from a path or the file's bytes.

    Raises:
        RecordError: unreadable, too large, or not JSON.
    """
    try:
        if isinstance(source, bytes):
            data = source
        else:
            path = Path(source)
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise RecordError(f"{path.name} is larger than {MAX_RECORD_BYTES // 2**20} MiB: not a kvlab record")
            data = path.read_bytes()
        record = json.loads(data)
    except OSError as err:
        raise RecordError(f"cannot read the record: {err.strerror or err}") from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"not a JSON file, so not a kvlab run record ({err})") from err
    if not isinstance(record, dict):
        raise RecordError("not a kvlab run record: the JSON is not an object")
    return record


def check_record(record: dict) -> None:
    """Raise RecordError unless `record` is a Compare record of the current format version or UPGRADED_VERSION."""
    kind, version = record.get("format"), record.get("format_version")
    if kind is None and "columns" in record and "model" in record:
        raise RecordError("this record was written by kvlab before records carried a format_version; run it again "
                          f"to get a record this version can replay (format_version {RECORD_FORMAT_VERSION})")
    if kind != RECORD_FORMAT:
        raise RecordError(f"not a kvlab Compare run record (format {kind!r}, expected {RECORD_FORMAT!r})")
    if version not in (UPGRADED_VERSION, RECORD_FORMAT_VERSION):
        raise RecordError(f"record format_version {version!r} cannot be replayed by this kvlab, which reads "
                          f"versions {UPGRADED_VERSION} and {RECORD_FORMAT_VERSION}")
    if not isinstance(record.get("columns"), list) or not record["columns"]:
        raise RecordError("the record has no columns to replay")


def results_of(record: dict) -> list[ColumnResult]:
    """The record's columns as `ColumnResult`s (keys a result does not have, such as `prefill_s`, are dropped).

    Raises:
        RecordError: a column lacks its index, name or strategy.
    """
    names = {f.name for f in dataclasses.fields(ColumnResult)}
    results = []
    for position, column in enumerate(record["columns"]):
        try:
            fields = {key: value for key, value in column.items() if key in names}
            fields["timing"] = ColumnTiming.from_json(fields.get("timing") if isinstance(fields.get("timing"), dict)
                                                      else None)
            results.append(ColumnResult(**fields))
        except TypeError as err:
            raise RecordError(f"column {position + 1} of the record is incomplete: {err}") from err
    return results


def replay_label(record: dict) -> str:
    """e.g. `replayed: measured on Intel Xeon (2 cores, no GPU) at 2026-11-30T08:00:00+00:00`."""
    env = record.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name")
    where = f"{env.get('cpu') or 'an unknown machine'} ({env.get('cores_available', '?')} cores, {gpu or 'no GPU'})"
    return f"replayed: measured on {where} at {record.get('measured_at', 'an unknown time')}"


def load_record(source: str | Path | bytes) -> Replayed:
    """Read, check and rebuild a record.

    Raises:
        RecordError: the file cannot be replayed; the message says why.
    """
    record = read_record(source)
    check_record(record)
    if record["format_version"] == UPGRADED_VERSION:
        record = {**upgrade_v2(record), "format_version": RECORD_FORMAT_VERSION}
    done = RunDone(results_of(record), float(record.get("wall_s") or 0.0), bool(record.get("stopped")),
                   fidelity=record.get("fidelity") if isinstance(record.get("fidelity"), dict) else {},
                   summary_s=record.get("summary_s") if isinstance(record.get("summary_s"), (int, float)) else None)
    return Replayed(record, done, replay_label(record))
