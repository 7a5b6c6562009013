"""A memory budget typed in GiB (the Plan tab, `kvlab plan --budget-gib`, the `plan` agent tool) as bytes, checked
finite and under MAX_BUDGET_GIB before any arithmetic, so no front meets `int(inf)`'s OverflowError.

Each front decides what "no budget" is (an empty field, 0, no flag) before calling `budget_bytes`. Pure: no
model, no gradio.
"""

from __future__ import annotations

import math

from ..strategies.knob_yaml import shown

GIB = 1 << 30
MAX_BUDGET_GIB = 1 << 20
"""Largest budget read, in GiB (1 PiB: far above any accelerator node; past it a plan says nothing new)."""


def budget_bytes(gib, name: str = "the budget", zero_means_none: bool = False) -> int:
    """`gib` GiB (2^30 bytes) as whole bytes; `zero_means_none` only says, in the refusal, that the caller reads 0
    as "no budget".

    Raises:
        ValueError: `gib` is not a number, not finite, not above 0 or above MAX_BUDGET_GIB; one line naming
            `name` and the limit.
    """
    try:
        number = float(gib)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if isinstance(gib, bool) or not (math.isfinite(number) and 0 < number <= MAX_BUDGET_GIB):
        zero = "0 (no budget) or " if zero_means_none else ""
        raise ValueError(f"{name} must be {zero}a finite number of GiB above 0 and at most {MAX_BUDGET_GIB:,} "
                         f"(MAX_BUDGET_GIB), got {shown(gib)}")
    return int(number * GIB)
