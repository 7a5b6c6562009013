"""The one record envelope every wing writes, and the one reader of every record kvlab has ever written.

A record is one JSON object: `kind` (`kvlab.compare`, `kvlab.needle`, `kvlab.report`) and its `version`,
`measured_at` (UTC, ISO 8601), `environment` (`kvlab.measure.environment`), `model` (`LoadedModel.info()`),
`columns` (one object per column, each with at least its `name`), `wall_s` and `stopped`, beside the wing's
own fields. A wing describes its kind once (`RecordKind`: its names, versions, the shape of one column and of
its own fields, its column limit and how an older version becomes the current one) and writes its records
with `new_record`.

`read_record` (a file or its bytes) and `check_record` (a parsed object) are the only code that reads an
envelope: the file through `kvlab.measure.record_json.load_json` (size, depth and numbers capped); then the
kind, from `kind` or from the keys an older record carried instead (Compare's `format`/`format_version`
before version 4, nothing at all in version 1); its version (`version_refusal`); the column count and that
each column is an object holding its required fields; the wing's upgrade of an older version; and last every
field's JSON type (`shaped`, strict, keeping only the fields the shape names, so a record written back
holds nothing a crafted file added). Every refusal is a `RecordError` whose message is one line and never
names the file. Reads; writes nothing; no model, no gradio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

from typing_extensions import NotRequired, Required, TypedDict, get_origin, get_type_hints

from .measure.record_json import RecordJSONError, load_json, shaped, version_refusal


class RecordError(RecordJSONError):
    """The file or object is not a kvlab record this version reads; the message (one line) says why."""


class _Gpu(TypedDict, total=False):
    name: str | None
    memory_bytes: int | None
    count: int | None


class Environment(TypedDict, total=False):
    """Where a record was measured (`kvlab.measure.environment.environment`)."""

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


class Model(TypedDict, total=False):
    """The model a record was measured on (`LoadedModel.info()`, and Needle's `hub_id` and
    `max_position_embeddings`)."""

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
    hub_id: str | None
    max_position_embeddings: int | None


ENVELOPE = {"kind": Required[str], "version": Required[int], "measured_at": NotRequired[str | None],
            "environment": NotRequired[Environment | None], "model": NotRequired[Model | None],
            "wall_s": NotRequired[float | None], "stopped": NotRequired[bool | None]}
"""The envelope's fields and their JSON types (besides `columns`, whose objects are the kind's)."""


@dataclass(frozen=True, eq=False)
class RecordKind:
    """One kind of record: what a wing writes and how it is read back.

    name: the `kind` it carries (`kvlab.compare`); label: its name in messages (`Compare`); version: the
    version this kvlab writes; readable: every version it reads. column: a `TypedDict` of one column (its
    required fields are said to be missing by name); body: the wing's own fields beside the envelope, name ->
    JSON type (e.g. `NotRequired[dict | None]`). max_columns: most columns a record holds. upgrade(record,
    version): an older version's record in the current layout (None: nothing changed). legacy: the keys older
    records carried instead of `kind` and `version`; unversioned: the version of a record that carries
    neither, told apart by holding `model` and `columns`.
    """

    name: str
    label: str
    version: int
    readable: tuple[int, ...]
    column: type
    body: dict = field(default_factory=dict)
    max_columns: int = 64
    upgrade: Callable[[dict, int], dict] | None = None
    legacy: tuple[str, str] | None = None
    unversioned: int | None = None

    @cached_property
    def shape(self) -> type:
        """The whole record's `TypedDict`: the envelope, its columns and the wing's own fields."""
        title = "".join(part.title() for part in self.name.replace(".", "_").split("_"))
        return TypedDict(f"{title}Record", {**ENVELOPE, "columns": Required[list[self.column]], **self.body})


def new_record(kind: RecordKind, *, model: dict, columns: list[dict], wall_s: float, stopped: bool,
               environment: dict | None = None, measured_at: str | None = None, **body) -> dict:
    """A record in the envelope: `kind` and its current `version`, `measured_at` (now, UTC, unless given),
    `environment`, `model`, the wing's `body` fields, `wall_s` (seconds), `stopped` and `columns`."""
    when = measured_at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"kind": kind.name, "version": kind.version, "measured_at": when, "environment": environment,
            "model": model, **body, "wall_s": wall_s, "stopped": stopped, "columns": columns}


def read_record(source: str | Path | bytes, kinds: Sequence[RecordKind], what: str = "") -> tuple[RecordKind, dict]:
    """(its kind, the record in the current layout) from a file's path or bytes; see `check_record`.

    Raises:
        RecordError: unreadable, too large, not JSON, past a structural limit, or as `check_record`.
    """
    try:
        data = load_json(source)
    except RecordJSONError as err:
        raise RecordError(str(err)) from None
    return check_record(data, kinds, what)


def check_record(data, kinds: Sequence[RecordKind], what: str = "") -> tuple[RecordKind, dict]:
    """(its kind, the record in the current layout) from a parsed JSON object that should be one of `kinds`:
    the kind and version checked, older versions upgraded, the columns counted and each checked, and every
    field's type checked with only the known fields kept. `what` names the records wanted in the refusal of
    another kind (default: the kinds' labels).

    Raises:
        RecordError: one line: not one of `kinds`, a version this kvlab does not read, no columns list, more
            columns than the kind holds, a column that is not an object or lacks a required field, or a field
            of the wrong type (named, e.g. `columns[0].ttft_s`).
    """
    if not isinstance(data, dict):
        raise RecordError("not a kvlab record: the JSON is not an object")
    kind, key, version = _identify(data, kinds, what or " or ".join(k.label for k in kinds))
    refusal = version_refusal(kind.label, key, version, kind.readable)
    if refusal:
        raise RecordError(refusal)
    columns = data.get("columns")
    if not isinstance(columns, list):
        raise RecordError(f"the {kind.label} record has no columns")
    if len(columns) > kind.max_columns:
        raise RecordError(f"the {kind.label} record has {len(columns):,} columns; a {kind.label} run has at most "
                          f"{kind.max_columns}")
    record = _current(data, kind, version)
    _check_columns(record["columns"], kind.column)
    return kind, shaped(record, kind.shape, f"not a well-formed {kind.name} record, its", RecordError)


def _identify(data: dict, kinds: Sequence[RecordKind], what: str) -> tuple[RecordKind, str, object]:
    """(kind, the key its version is read from, the version found)."""
    key, found = "kind", data.get("kind")
    if found is None:
        legacy = next((k.legacy for k in kinds if k.legacy and data.get(k.legacy[0]) is not None), None)
        if legacy is not None:
            key, found = legacy[0], data[legacy[0]]
    for kind in kinds:
        if found is not None and found == kind.name:
            return kind, "version" if key == "kind" else kind.legacy[1], data.get(
                "version" if key == "kind" else kind.legacy[1])
        if found is None and kind.unversioned is not None and "model" in data and "columns" in data:
            return kind, "version", kind.unversioned
    said = f"{key} {str(found)[:40]!r}" if found is not None else "no kind"
    raise RecordError(f"not a {what} record ({said}; expected {' or '.join(k.name for k in kinds)})")


def _current(data: dict, kind: RecordKind, version: int) -> dict:
    """`data` in `kind`'s current layout: the wing's upgrade of an older version, and `kind`/`version` in place
    of whatever an older record carried."""
    record = dict(data)
    if version != kind.version and kind.upgrade is not None:
        try:
            record = kind.upgrade(record, version)
        except (AttributeError, TypeError, ValueError):
            raise RecordError(f"not a well-formed version-{version} {kind.label} record: a field has the wrong "
                              "type") from None
    for legacy in kind.legacy or ():
        record.pop(legacy, None)
    return {**record, "kind": kind.name, "version": kind.version}


def required_fields(shape: type) -> list[str]:
    """The required fields of a `TypedDict`, also when its module's annotations are strings (`Required[...]`
    is then only seen once they are evaluated)."""
    hints = get_type_hints(shape, include_extras=True)
    marked = {name for name, hint in hints.items() if get_origin(hint) is Required}
    unmarked = {name for name, hint in hints.items() if get_origin(hint) is not NotRequired}
    return sorted(marked | (set(shape.__required_keys__) & unmarked))


def _check_columns(columns: list, column: type) -> None:
    """Each column is an object holding the column shape's required fields."""
    required = required_fields(column)
    for position, item in enumerate(columns):
        if not isinstance(item, dict):
            raise RecordError(f"column {position + 1} of the record is not an object")
        missing = [name for name in required if name not in item]
        if missing:
            raise RecordError(f"column {position + 1} of the record is incomplete: it lacks {', '.join(missing)}")
