"""Compare's record kind: the fields a Compare record holds beside the envelope (`kvlab.record`), one column's
shape, and how the older versions become the current one.

Versions: 1, records from before any version was written (no `format` key; told apart by their `model` and
`columns`); 2, `format: "kvlab.compare"` and `format_version: 2`, with `environment`, `measured_at` and the
ITL figures; 3, each column's timing fields nested in one `timing` record (`kvlab.measure.ColumnTiming`) and
the run's `timing.policy`, possibly `summary_s`, `fidelity` and each column's `fidelity_status`; 4, the
envelope every wing writes (`kind`/`version` in place of `format`/`format_version`). Versions 1 and 2 are
upgraded by `kvlab.measure.record.upgrade_v2` (a version-1 record has none of the fields it moves), version 3
needs nothing but the envelope's keys. Data only: no model, no files.
"""

from __future__ import annotations

from typing_extensions import NotRequired, Required, TypedDict

from ..columns import MAX_COLUMNS
from ..generation import GenerationSettings
from ..measure.record import upgrade_v2
from ..measure.record_json import json_shape
from ..record import RecordKind
from .events import ColumnResult

VERSION = 4
"""The Compare record version this kvlab writes."""


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
    other_cores: float | None
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
COLUMN = json_shape(ColumnResult, {"fallbacks": list[_Fallback]})
"""One column: `ColumnResult.to_json()` (index, name, strategy and knobs required)."""
BODY = {"preset": NotRequired[str | None], "prompt": NotRequired[_Prompt | None], "mode": NotRequired[str | None],
        "settings": NotRequired[json_shape(GenerationSettings) | None], "summary_s": NotRequired[float | None],
        "fidelity": NotRequired[_Fidelity | None], "timing": NotRequired[_RunTiming | None],
        "slots": NotRequired[list[int]], "memory": NotRequired[_Memory], "refused": NotRequired[list[_Refused]]}
"""A Compare record's own fields (`kvlab.compare.summary.run_record`, plus a page export's `slots`, `memory` and
`refused`); docs/records.md describes them."""


def upgrade(record: dict, version: int) -> dict:
    """A version-1, -2 or -3 record's fields in the version-4 layout (the envelope's keys are the reader's)."""
    return upgrade_v2(record) if version <= 2 else record


COMPARE = RecordKind("kvlab.compare", "Compare", VERSION, (1, 2, 3, VERSION), COLUMN, BODY, MAX_COLUMNS, upgrade,
                     legacy=("format", "format_version"), unversioned=1)
"""The Compare record: written by `kvlab.compare.summary.run_record`, read by `kvlab.compare.replay`."""
