"""The one reader of kvlab's JSON records from a file or an upload, trusting neither its size nor its structure.

The one record reader (`kvlab.record`, behind Compare's replay and share links, the Report tab's saved
records, Needle's record, the command line's `--replay` and `--from`) reads files through `load_json`:

- the size is checked before a byte is read: at most `max_record_bytes()` (`KVLAB_MAX_RECORD_MB`, default
  DEFAULT_MAX_RECORD_MB MiB; the largest record kvlab writes, a 4,096-token 8-column Compare run, is a few MB);
- arrays and objects nesting deeper than MAX_DEPTH, or more of them than MAX_CONTAINERS, are refused by a scan
  of the text's brackets before json parses it (json's parser recurses, and 10,000 brackets raise
  RecursionError);
- NaN and ±Infinity (json's `parse_constant`), integers of more than MAX_INT_DIGITS digits (`parse_int`) and
  other numbers past MAX_FLOAT in magnitude or MAX_NUMBER_CHARS characters long (`parse_float`) are refused as
  they are parsed;
- a string holding a lone surrogate (`"\\ud800"`, valid JSON but not Unicode text: no page can show it) is
  refused after parsing, when the text has such an escape (UNICODE_REFUSAL);
- the top level must be an object.

`shaped` then checks a parsed part against a `TypedDict` strictly (pydantic: no number from a string, no
string from a number, no object where a list belongs) and keeps only the fields it names, so whatever a reader
writes back holds nothing it did not understand; `json_shape` makes that `TypedDict` from a dataclass.
`version_refusal` is the one message for a record of a version this kvlab does not read.

Every refusal is a `RecordJSONError` (a ValueError) whose message is one line. Reads files; writes nothing; no
model, no gradio.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

from typing_extensions import NotRequired, Required, TypedDict

MAX_RECORD_MB_ENV = "KVLAB_MAX_RECORD_MB"
DEFAULT_MAX_RECORD_MB = 16
"""Largest record read, in MiB (KVLAB_MAX_RECORD_MB): the largest record kvlab writes (a 4,096-token, 8-column
Compare run of Gemma 3 270M) is about 5 MB; a page upload larger than this is refused by gradio itself."""
MAX_DEPTH = 16
"""Deepest nesting of arrays and objects read (kvlab's records nest at most 6 deep)."""
MAX_CONTAINERS = 200_000
"""Most arrays and objects one record may hold (a 150-cell, 8-column Needle record holds about 5,000)."""
MAX_INT_DIGITS = 20
"""Longest integer read, in digits (a byte count of 2**64 has 20)."""
MAX_NUMBER_CHARS = 40
"""Longest number with a fraction or exponent read, in characters (`repr` of a float takes at most 24)."""
MAX_FLOAT = 1e15
"""Largest magnitude of a number with a fraction or exponent read (a record's figures are bytes, seconds,
rates and counts; arithmetic on a larger one, e.g. a squared noise of 1e300, would overflow)."""

UNICODE_REFUSAL = "the record holds text that is not valid Unicode (a lone surrogate)"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPE = re.compile(r"\\.", re.S)
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


class RecordJSONError(ValueError):
    """The file cannot be read as a kvlab record; the message (one line) says why."""


def max_record_bytes() -> int:
    """The record size cap in bytes, from KVLAB_MAX_RECORD_MB (MiB, default DEFAULT_MAX_RECORD_MB).

    Raises:
        ValueError: the setting is not a whole number >= 1; the message names it and its value.
    """
    text = os.environ.get(MAX_RECORD_MB_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_RECORD_MB * 2**20
    try:
        mib = int(text)
    except ValueError:
        mib = 0
    if mib < 1:
        raise ValueError(f"{MAX_RECORD_MB_ENV} must be a whole number of MiB >= 1, got {text!r}")
    return mib * 2**20


def cap_text() -> str:
    """`at most 16 MiB (KVLAB_MAX_RECORD_MB)`: the cap as an upload's label states it.

    Raises:
        ValueError: KVLAB_MAX_RECORD_MB is not a whole number >= 1.
    """
    return f"at most {max_record_bytes() // 2**20} MiB ({MAX_RECORD_MB_ENV})"


def size_refusal(size: int) -> str | None:
    """The one line refusing a record of `size` bytes, or None when it is within the cap.

    Raises:
        RecordJSONError: KVLAB_MAX_RECORD_MB is not a whole number >= 1 (the message names it).
    """
    try:
        limit = max_record_bytes()
    except ValueError as err:
        raise RecordJSONError(str(err)) from None
    if size <= limit:
        return None
    return (f"the file is {size / 2**20:.1f} MiB, more than the {limit // 2**20} MiB a kvlab record may be "
            f"({MAX_RECORD_MB_ENV})")


def _refuse_constant(name: str):
    raise RecordJSONError(f"the JSON holds {name}, which no kvlab record holds (a figure not measured is null)")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise RecordJSONError(f"the JSON holds an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.inf
    if not abs(value) <= MAX_FLOAT:
        raise RecordJSONError(f"the JSON holds a number too large or too long to be a measurement "
                              f"({text[:16]}{'…' if len(text) > 16 else ''})")
    return value


def nesting(text: str) -> tuple[int, int]:
    """(deepest nesting of arrays and objects, number of brackets) in JSON `text`, brackets inside strings not
    counted; (0, brackets) without the depth when there are more than 2 * MAX_CONTAINERS brackets.

    Escapes go first (a backslash outside a string is invalid JSON, which json refuses at that point), then the
    strings, then everything but brackets; for a text that is not JSON the figures are rough, and json's own
    error follows."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", _ESCAPE.sub("", text)))
    if len(brackets) > 2 * MAX_CONTAINERS:
        return 0, len(brackets)
    return max(accumulate(_STEP[char] for char in brackets), default=0), len(brackets)


def parse(data: bytes | str) -> object:
    """The JSON value of `data`, read under the module's depth, count and number limits.

    Raises:
        RecordJSONError: not UTF-8, not JSON, holding a lone surrogate, or past a limit; the message says which.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        text.encode("utf-8")  # a str given as is may hold a surrogate itself
    except UnicodeDecodeError as err:
        raise RecordJSONError(f"not a JSON file, so not a kvlab record (byte {err.start} is not UTF-8)") from None
    except UnicodeEncodeError:
        raise RecordJSONError(UNICODE_REFUSAL) from None
    depth, brackets = nesting(text)
    if brackets > 2 * MAX_CONTAINERS:
        raise RecordJSONError(f"the JSON holds more than {2 * MAX_CONTAINERS:,} brackets, more than any kvlab "
                              f"record ({MAX_CONTAINERS:,} arrays and objects at most)")
    if depth > MAX_DEPTH:
        raise RecordJSONError(f"the JSON nests {depth} levels deep; a kvlab record nests at most {MAX_DEPTH}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float)
    except json.JSONDecodeError as err:
        raise RecordJSONError(f"not a JSON file, so not a kvlab record ({err.msg} at line {err.lineno} column "
                              f"{err.colno})") from None
    except RecursionError:  # the scan above keeps json far from this; kept so no traceback can escape
        raise RecordJSONError(f"the JSON nests too deep; a kvlab record nests at most {MAX_DEPTH}") from None
    if _SURROGATE_ESCAPE.search(text) and not _unicode(value):
        raise RecordJSONError(UNICODE_REFUSAL)
    return value


def _unicode(value) -> bool:
    """Whether every string in a parsed JSON value (keys included) is encodable as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_json(source: str | Path | bytes) -> dict:
    """The JSON object of a record file (a path) or of its bytes, checked as the module docstring says. Messages
    never name the file (a reader puts the name it shows before them), so no server path reaches a page.

    Raises:
        RecordJSONError: too large, unreadable, not JSON, past a limit, or not an object.
    """
    if isinstance(source, bytes):
        data = source
        refusal = size_refusal(len(data))
    else:
        try:
            refusal = size_refusal(Path(source).stat().st_size)
            data = b"" if refusal else Path(source).read_bytes()
        except OSError as err:
            raise RecordJSONError(f"the file cannot be read ({err.strerror or type(err).__name__})") from None
    if refusal:
        raise RecordJSONError(refusal)
    value = parse(data)
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(value),
                                                                                                 "a number")
        raise RecordJSONError(f"not a kvlab record: the JSON is not an object (it is {kind})")
    return value


def json_shape(cls: type, overrides: dict | None = None) -> type:
    """A `TypedDict` of dataclass `cls`'s fields, as its JSON holds them: the fields without a default are
    required, nested dataclasses become their own shapes; `overrides` (field name -> type) replaces the type
    of fields the dataclass leaves loose (e.g. a `list[dict]` whose dicts have a shape of their own)."""
    hints = {**typing.get_type_hints(cls), **(overrides or {})}
    fields = {}
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            kind = json_shape(kind)
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        fields[field.name] = Required[kind] if required else NotRequired[kind]
    return TypedDict(f"{cls.__name__}JSON", fields)


@lru_cache(maxsize=None)
def _adapter(shape):
    from pydantic import TypeAdapter  # imported when a record is checked, not when a setting is read at start-up

    return TypeAdapter(shape)


def shaped(value, shape, what: str, error: type[RecordJSONError] = RecordJSONError):
    """`value` checked against `shape` (a `TypedDict`, or any type pydantic validates) with no conversion of
    types (no number from a string, no string from a number), keeping only the fields the shape names.

    Raises:
        `error` (a RecordJSONError): one line naming `what`, the first field that is wrong (e.g.
        `columns[0].ttft_s`) and what it should be.
    """
    from pydantic import ValidationError

    try:
        return _adapter(shape).validate_python(value, strict=True)
    except ValidationError as err:
        errors = err.errors()
        where = _where(value, errors[0]["loc"], errors[0]["type"] == "missing")
        if errors[0]["type"] == "missing":
            said = "is missing"
        else:
            said = "should be " + " or ".join(dict.fromkeys(
                e["msg"].removeprefix("Input should be ") for e in errors
                if _where(value, e["loc"], False) == where and e["msg"].startswith("Input should be ")))
        raise error(f"{what} {f'field {where}' if where else 'JSON'} {said}"[:300]) from None


def _where(value, loc: tuple, missing: bool) -> str:
    """A pydantic error's location as a path into `value` (`columns[0].ttft_s`): the union members pydantic
    names are left out, and a key that is not a plain name (a record's own text) is shown as `[…]`."""
    parts, node = [], value
    for position, part in enumerate(loc):
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parts.append(f"[{part}]")
            node = node[part]
        elif isinstance(node, dict) and (part in node or (missing and position == len(loc) - 1)):
            parts.append(f".{part}" if _NAME.fullmatch(str(part)) else "[…]")
            node = node.get(part)
    return "".join(parts).lstrip(".")


def version_refusal(kind: str, key: str, found, readable: tuple[int, ...]) -> str | None:
    """The one line refusing a `kind` record whose `key` (its version field) is `found` when this kvlab reads
    only versions `readable`, or None when it reads it: every reader words a newer, older or unreadable version
    the same way."""
    if isinstance(found, int) and not isinstance(found, bool) and found in readable:
        return None
    versions = " and ".join(filter(None, [", ".join(str(v) for v in readable[:-1]), str(readable[-1])]))
    return (f"{kind} record {key} {repr(found)[:40]} cannot be read by this kvlab, which reads version"
            f"{'s' if len(readable) > 1 else ''} {versions} (a newer kvlab wrote it, or another tool)")
