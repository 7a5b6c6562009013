"""Reading a Compare run record back: the JSON that `python -m kvlab compare --json` and the page's export
write, checked and turned into the runner's own result objects, so a run measured on one machine can be shown
again elsewhere exactly as it was (`python -m kvlab compare --replay FILE`, the Compare tab's replay).

A record carries `format: "kvlab.compare"` and `format_version` (see `kvlab.compare.summary.RECORD_FORMAT_VERSION`);
a version-2 record is upgraded to the current layout as it is read (`kvlab.measure.record.upgrade_v2`);
anything else (another tool's JSON, a record from before versioning, a newer layout) is refused with a message
that says what was found. The file is read by `kvlab.measure.record_json.load_json` (size, depth and numbers
capped) and checked field by field against `RecordShape` (types, never converted); `Replayed.record` keeps only
the fields this module knows, so a record written again from it (a replay's export and share link) carries
nothing a crafted file added. Reads only; runs no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typing_extensions import Required, TypedDict

from ..generation import GenerationSettings
from ..measure import ColumnTiming
from ..measure.record import upgrade_v2
from ..measure.record_json import RecordJSONError, json_shape, load_json, shaped, version_refusal
from ..columns import MAX_COLUMNS
from .events import ColumnResult, RunDone
from .summary import RECORD_FORMAT, RECORD_FORMAT_VERSION

UPGRADED_VERSION = 2
"""The older `format_version` that is still replayed, upgraded on load."""
READABLE_VERSIONS = (UPGRADED_VERSION, RECORD_FORMAT_VERSION)


class RecordError(RecordJSONError):
    """The file is not a kvlab Compare record this version can replay; the message (one line) says why."""


class _Gpu(TypedDict, total=False):
    name: str | None
    memory_bytes: int | None
    count: int | None


class _Environment(TypedDict, total=False):
    cpu: str | None
    cores_available: int | None
    memory_bytes: int | None
    platform: str | None
    python: str | None
    kvlab: str | None
    kvlab_commit: str | None
    torch: str | None
    transformers: str | None
    gradio: str | None
    torch_threads: int | None
    cuda: str | None
    gpu: _Gpu | None
    load_average: list[float] | None
    dtype: str | None
    device: str | None


class _Model(TypedDict, total=False):
    name: str | None
    source: str | None
    dtype: str | None
    device: str | None
    num_hidden_layers: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    layer_types: list[str] | None
    sliding_window: int | None
    chat_template: bool | None
    license: str | None
    load_s: float | None


class _Prompt(TypedDict, total=False):
    text: str
    system: str | None
    chat: bool


class _Fidelity(TypedDict, total=False):
    state: str
    scored: int
    to_score: int


class _RunTiming(TypedDict, total=False):
    policy: str
    load_average: float | None
    cores: int | None
    torch_threads: int | None
    decode_noise: float | None
    step_noise: float | None
    warm_up_s: float | None
    busy: bool
    note: str


class _Memory(TypedDict, total=False):
    elapsed_s: list[float]
    rss_bytes: list[int]
    cuda_allocated_bytes: list[int]


class _Refused(TypedDict, total=False):
    slot: int
    strategy: str | None
    values: list[str | float | bool | None]
    message: str


_Fallback = TypedDict("_Fallback", {"at_token": Required[int], "from": Required[str], "to": Required[str],
                                    "reason": Required[str], "bytes_before": int | None, "bytes_after": int | None,
                                    "to_spec": dict}, total=False)
"""One budget switch as `kvlab.budget.Fallback.to_json` writes it."""
_Settings = json_shape(GenerationSettings)
_Column = json_shape(ColumnResult, {"fallbacks": list[_Fallback]})


class RecordShape(TypedDict, total=False):
    """The fields of a Compare record (`kvlab.compare.summary.run_record`, plus a page export's `slots`,
    `memory` and `refused`) and their JSON types; docs/records.md describes them."""

    format: Required[str]
    format_version: Required[int]
    measured_at: str | None
    environment: _Environment | None
    model: _Model | None
    preset: str | None
    prompt: _Prompt | None
    mode: str | None
    settings: _Settings | None
    wall_s: float | None
    summary_s: float | None
    stopped: bool | None
    fidelity: _Fidelity | None
    timing: _RunTiming | None
    columns: Required[list[_Column]]
    slots: list[int]
    memory: _Memory
    refused: list[_Refused]


@dataclass(frozen=True)
class Replayed:
    """A record read back: the record itself (its known fields only), its columns as a `RunDone`, and the line
    that labels it."""

    record: dict
    done: RunDone
    label: str


def read_record(source: str | Path | bytes) -> dict:
    """The record's JSON object from a path or the file's bytes (`kvlab.measure.record_json.load_json`).

    Raises:
        RecordError: unreadable, too large, not JSON, past a structural limit, or not an object.
    """
    try:
        return load_json(source)
    except RecordJSONError as err:
        raise RecordError(str(err)) from None


def check_record(record: dict) -> None:
    """Raise RecordError unless `record` is a Compare record of a version this kvlab reads (READABLE_VERSIONS)
    with between 1 and MAX_COLUMNS columns."""
    kind, version = record.get("format"), record.get("format_version")
    if kind is None and "columns" in record and "model" in record:
        raise RecordError("this record was written by kvlab before records carried a format_version; run it again "
                          f"to get a record this version can replay (format_version {RECORD_FORMAT_VERSION})")
    if kind != RECORD_FORMAT:
        raise RecordError(f"not a kvlab Compare run record (format {str(kind)[:40]!r}, expected {RECORD_FORMAT!r})")
    refusal = version_refusal("Compare", "format_version", version, READABLE_VERSIONS)
    if refusal:
        raise RecordError(refusal)
    columns = record.get("columns")
    if not isinstance(columns, list) or not columns:
        raise RecordError("the record has no columns to replay")
    if len(columns) > MAX_COLUMNS:
        raise RecordError(f"the record has {len(columns):,} columns; a Compare run has at most {MAX_COLUMNS}")


def known_fields(record: dict) -> dict:
    """`record` (checked by `check_record`) in the current layout, its types checked against `RecordShape` and
    only the fields it names kept.

    Raises:
        RecordError: a field has the wrong type or a column lacks its index, name, strategy or knobs.
    """
    if record["format_version"] == UPGRADED_VERSION:
        try:
            record = {**upgrade_v2(record), "format_version": RECORD_FORMAT_VERSION}
        except (AttributeError, TypeError, ValueError):
            raise RecordError("not a well-formed version-2 Compare record: a field has the wrong type") from None
    required = sorted(_Column.__required_keys__)
    for position, column in enumerate(record["columns"]):
        if not isinstance(column, dict):
            raise RecordError(f"column {position + 1} of the record is not an object")
        missing = [field for field in required if field not in column]
        if missing:
            raise RecordError(f"column {position + 1} of the record is incomplete: it lacks {', '.join(missing)}")
    return shaped(record, RecordShape, f"not a well-formed {RECORD_FORMAT} record, its", RecordError)


def results_of(record: dict) -> list[ColumnResult]:
    """The columns of a record in `known_fields` form as `ColumnResult`s."""
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
    record = read_record(source)
    check_record(record)
    record = known_fields(record)
    results = results_of(record)
    record["columns"] = [result.to_json() for result in results]  # as kvlab writes a column, nothing more
    done = RunDone(results, float(record.get("wall_s") or 0.0), bool(record.get("stopped")),
                   fidelity=dict(record.get("fidelity") or {}), summary_s=record.get("summary_s"))
    return Replayed(record, done, replay_label(record))
