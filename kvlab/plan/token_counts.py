"""Token counts typed by a person: `1024, 32k, 128k` (k = 1024, m = 1024²).

One parser for the Plan tab and `kvlab plan --context`, so the two accept the
same text. It checks the form of each part only; ranges (a context below 1) are
the planner's to check, with its own message.
"""

from __future__ import annotations

import re

TOKEN_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}
"""Suffix -> tokens it multiplies by (k = 1024, m = 1024²), as the Plan tab documents."""
_PART = re.compile(r"(-?\d+)([kKmM]?)")


def parse_token_counts(text, name: str = "context length") -> tuple[int, ...]:
    """Whole token counts from `1024, 32k, 128k` (parts split by commas, spaces or semicolons; `_` inside a
    number is ignored), sorted, each once.

    Raises:
        ValueError: empty, or a part that is not a whole number of tokens with an optional k/m suffix; the
            message names `name` and the part.
    """
    parts = [part for part in re.split(r"[,\s;]+", str(text or "").strip()) if part]
    if not parts:
        raise ValueError(f"no {name} given: type one or more, e.g. 1k, 32k, 128k")
    values = []
    for part in parts:
        match = _PART.fullmatch(part.replace("_", ""))
        if match is None:
            raise ValueError(f"{name}s are whole numbers of tokens such as 1024 or 32k (k = 1024), got {part!r}")
        values.append(int(match.group(1)) * TOKEN_UNITS[match.group(2).lower()])
    return tuple(sorted(set(values)))
