"""What every bench section shares: the sections, sizes, figures (median/min/max), checks and orders.

The two timed sides (kvlab's runner and bare transformers) are `kvlab.bench.sides`. `interleaved` and
`rotated` give the A, B / B, A orders sections use so machine drift hits both sides. This module formats no
text, draws nothing and runs no model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SECTIONS = ("overhead", "fair", "parallel", "scaling", "startup", "roofline", "plan", "e2e", "needle", "report")
"""The sections the installed bench runs, in order; the repository's `benchmarks/` adds more
(`register_section`: the app and its browser, which need test-only packages)."""
RECORD_VERSION = 1


@dataclass(frozen=True)
class ExtraSection:
    """A section registered from outside the package: its function (Context -> record) and, for the report,
    (the key that says it has figures, the function writing its lines) or None."""

    run: Callable
    details: tuple[str, Callable] | None = None


EXTRA_SECTIONS: dict[str, ExtraSection] = {}
"""Sections registered with `register_section`, run after SECTIONS."""


def register_section(name: str, run: Callable, details: tuple[str, Callable] | None = None) -> None:
    """Add a section the bench can run (`--only NAME`) after SECTIONS; see `ExtraSection`."""
    EXTRA_SECTIONS[name] = ExtraSection(run, details)


def section_names() -> tuple[str, ...]:
    """Every section this bench can run, in order: SECTIONS, then the registered ones."""
    return SECTIONS + tuple(name for name in EXTRA_SECTIONS if name not in SECTIONS)

PROMPT = "Explain what a key-value cache does in a transformer, in a few sentences."
FILLER = (
    "A key-value cache stores the keys and values of every token a transformer has already seen, so each new "
    "token attends to them without recomputing the whole sequence. Its memory grows with the context; "
    "quantizing it, preallocating it or keeping only a window of it trades exactness, speed and memory. "
)


@dataclass(frozen=True)
class BenchSize:
    """How much to measure. Token counts are new tokens per run; lengths are prompt tokens; `copy_mib` is the
    size of the tensor copied to measure memory bandwidth, in MiB."""

    name: str
    repeats: int
    scaling_repeats: int
    new_tokens: int
    lengths: tuple[int, ...]
    scaling_new_tokens: int
    no_cache_new_tokens: int
    startup_repeats: int
    fresh_launch: bool
    copy_mib: int
    roofline_tokens: int
    compile_static: bool


SIZES = {
    "smoke": BenchSize("smoke", repeats=2, scaling_repeats=2, new_tokens=3, lengths=(32, 64), scaling_new_tokens=2,
                       no_cache_new_tokens=2, startup_repeats=1, fresh_launch=False, copy_mib=256,
                       roofline_tokens=4, compile_static=False),
    "small": BenchSize("small", repeats=3, scaling_repeats=2, new_tokens=32, lengths=(256, 512, 1024),
                       scaling_new_tokens=8, no_cache_new_tokens=3, startup_repeats=2, fresh_launch=True,
                       copy_mib=256, roofline_tokens=32, compile_static=False),
    "full": BenchSize("full", repeats=5, scaling_repeats=3, new_tokens=128, lengths=(256, 512, 1024, 2048, 4096),
                      scaling_new_tokens=16, no_cache_new_tokens=4, startup_repeats=3, fresh_launch=True,
                      copy_mib=512, roofline_tokens=128, compile_static=True),
}


@dataclass
class Context:
    """What a section needs: the loaded model, the size, the prompt's token ids (1, seq), a progress callback,
    where to write profiles (None: nowhere), and the `--strategies` lineup (label -> spec; None: each section's
    default set)."""

    loaded: object
    size: BenchSize
    prompt_ids: object
    say: Callable[[str], None]
    profile_dir: Path | None
    strategies: dict[str, dict] | None = None

    def lineup(self, default: dict[str, dict]) -> dict[str, dict]:
        """The strategies a section measures: `--strategies` when given, else the section's `default`."""
        return dict(default if self.strategies is None else self.strategies)


# ---------------------------------------------------------------- figures


def summarize(values: Sequence[float]) -> dict:
    """{median, min, max, n, values} of a non-empty list of numbers (in the values' own unit)."""
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def make_check(section: str, name: str, values: Sequence[float], target: str, passes: Callable[[float], bool] | None,
               reason: str = "", unit: str = "ratio", value: float | None = None) -> dict:
    """One row of the verdict table: median (or `value`) and min–max of `values`, target, met, reason.

    `passes` None means the issue sets no target (`met` None, status `reported`).
    Empty `values` and no `value` means the check could not be judged (status `n/a (reason)`).
    `reason` is kept only when the target is missed or cannot be judged. `unit` is `ratio`, `fraction`, `s`
    or `MB` (10^6 bytes).
    """
    stats = summarize(values) if values else None
    value = value if value is not None else (stats["median"] if stats else None)
    met = None if passes is None or value is None else bool(passes(value))
    return {"section": section, "name": name, "value": value, "min": stats["min"] if stats else None,
            "max": stats["max"] if stats else None, "unit": unit, "target": target, "met": met,
            "reason": "" if met else reason}


def spread(values: Sequence[float]) -> float:
    """(max - min) / median, a fraction: how far repeats of the same measurement disagree."""
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


def median_decode_s(result) -> float:
    """Median per-token decode latency of a column in seconds (step 0, the prefill, excluded)."""
    steps = result.per_token_s[1:] or result.per_token_s
    return statistics.median(steps)


def interleaved(rep: int, sides: Sequence[T]) -> list[T]:
    """`sides` in order on even repeats and reversed on odd ones (A, B, then B, A), so drift hits both."""
    return list(sides) if rep % 2 == 0 else list(reversed(sides))


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """`items` starting at position `rep` (wrapping), so each one takes its turn going first."""
    start = rep % len(items)
    return list(items[start:]) + list(items[:start])


def filler_ids(tokenizer, length: int):
    """(1, length) token ids of plain English text (FILLER repeated), for long contexts."""
    import torch

    ids: list[int] = []
    while len(ids) < length:
        ids.extend(tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    return torch.tensor([ids[:length]])
