"""The grid of a needle run: context lengths x needle depths x seeds, parsed from text and checked.

Checking never raises for one bad value: each bad length or depth becomes a one-line problem and the rest of
the grid stays (`Grid.problems`); only a grid with nothing left to run, or more cells than MAX_CELLS, is
refused as a whole (`GridError`). This module does not build prompts or run a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..strategies.knob_yaml import shown

MAX_CELLS = 150
"""Most cells (lengths x depths x seeds) one run may hold; each cell is one prefill per column."""
MAX_NEW_TOKENS = 32
"""Most greedy tokens a cell may generate for its answer."""
DEFAULT_NEW_TOKENS = 8
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
SUFFIXES = {"k": 1024}


class GridError(ValueError):
    """The grid cannot run at all (empty after checks, or more cells than MAX_CELLS); the message says why."""


def parse_tokens(text: str) -> int:
    """`512` -> 512, `1k` / `1K` -> 1024, `1.5k` -> 1536. Raises ValueError naming the item."""
    item = str(text).strip().lower()
    scale = SUFFIXES.get(item[-1:], 1)
    number = item[:-1] if scale != 1 else item
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"length {shown(text)} is not a token count (e.g. 512, 1k, 2k)") from None
    if not math.isfinite(value * scale) or value != int(value * scale) / scale or value <= 0:
        raise ValueError(f"length {shown(text)} must be a positive whole number of tokens")
    return int(value * scale)


def split_items(text) -> list[str]:
    """Items of a comma- or space-separated list (a list or tuple is taken as is)."""
    if isinstance(text, (list, tuple)):
        return [str(item) for item in text]
    return [item for item in str(text or "").replace(",", " ").split() if item]


@dataclass
class Grid:
    """The checked grid: `lengths` (target prompt tokens), `depths` (0..1), `seeds`, `new_tokens` (greedy tokens
    per answer), and `problems` (one line per value left out, e.g. a length past max_position_embeddings)."""

    lengths: list[int]
    depths: list[float]
    seeds: list[int]
    new_tokens: int = DEFAULT_NEW_TOKENS
    problems: list[str] = field(default_factory=list)

    @property
    def cells(self) -> list[tuple[int, float, int]]:
        """(length, depth, seed) in run order: shortest length first, then depth, then seed."""
        return [(n, d, s) for n in self.lengths for d in self.depths for s in self.seeds]


def _depths(depths, problems: list[str]) -> list[float]:
    """The valid depths of `depths` in order, once each; a problem line for each item left out."""
    good: list[float] = []
    for item in split_items(depths):
        try:
            value = float(item)
        except ValueError:
            problems.append(f"depth {shown(item)} is not a number in [0, 1]")
            continue
        if not 0.0 <= value <= 1.0:
            problems.append(f"depth {item} is outside [0, 1] (0 = needle first, 1 = needle last); left out")
        elif value not in good:
            good.append(value)
    return good


def parse_grid(lengths, depths=DEFAULT_DEPTHS, seeds=(0,), new_tokens: int = DEFAULT_NEW_TOKENS, *,
               max_positions: int | None = None, min_tokens: int = 1, key_tokens=None) -> Grid:
    """Parse and check a grid. `lengths`, `depths`, `seeds`: text (`512,1k,2k`) or lists.

    A length past `max_positions` (the model's max_position_embeddings) or under `min_tokens` (the bare
    prompt), a depth outside [0, 1] and an unreadable item are left out with a problem line each.
    `key_tokens(seeds) -> int` (e.g. `functools.partial(kvlab.needle.prompt.key_tokens, tokenizer)`) gives the
    tokens the keys take: fewer `new_tokens` could never hit, so they are raised to it with a problem line.

    Raises:
        GridError: no length, depth or seed left; `new_tokens` outside 1..MAX_NEW_TOKENS; more than MAX_CELLS.
    """
    problems: list[str] = []
    good_lengths: list[int] = []
    for item in split_items(lengths):
        try:
            value = parse_tokens(item)
        except ValueError as err:
            problems.append(str(err))
            continue
        if max_positions and value > max_positions:
            problems.append(f"length {item} ({value:,} tokens) is past the model's max_position_embeddings "
                            f"({max_positions:,}); left out")
        elif value < min_tokens:
            problems.append(f"length {item} is under the {min_tokens} tokens the bare passkey prompt takes; left out")
        elif value not in good_lengths:
            good_lengths.append(value)
    good_depths = _depths(depths, problems)
    good_seeds: list[int] = []
    for item in split_items(seeds):
        try:
            good_seeds.append(int(item))
        except ValueError:
            problems.append(f"seed {shown(item)} is not a whole number; left out")
    if not isinstance(new_tokens, int) or not 1 <= new_tokens <= MAX_NEW_TOKENS:
        raise GridError(f"new tokens must be a whole number in 1..{MAX_NEW_TOKENS}, got {shown(new_tokens)}")
    missing = [name for name, values in (("length", good_lengths), ("depth", good_depths), ("seed", good_seeds))
               if not values]
    if missing:
        raise GridError("; ".join([*problems, f"the grid is empty: no valid {', '.join(missing)}"]))
    if key_tokens is not None and new_tokens < (needed := key_tokens(good_seeds)):
        if needed > MAX_NEW_TOKENS:
            raise GridError(f"the key takes {needed} tokens, more than the {MAX_NEW_TOKENS} new tokens a cell may have")
        problems.append(f"new tokens {new_tokens} is fewer than the {needed} tokens the key takes (no cell could hit); "
                        f"raised to {needed}")
        new_tokens = needed
    grid = Grid(sorted(good_lengths), good_depths, good_seeds, new_tokens, problems)
    if len(grid.cells) > MAX_CELLS:
        raise GridError(f"{len(grid.cells)} cells ({len(good_lengths)} lengths x {len(good_depths)} depths x "
                        f"{len(good_seeds)} seeds) is more than the {MAX_CELLS} a run may hold")
    return grid


def expand_sweeps(items: list[str]) -> list[str]:
    """Strategy items (compare syntax) with knob sweeps spelled out: `sink:window_length=64|128` ->
    `sink:window_length=64`, `sink:window_length=128` (several swept knobs give every combination)."""
    expanded: list[str] = []
    for item in items:
        variants = [""]
        for k, part in enumerate(item.split(":")):
            name, sep, values = part.partition("=")
            options = [f"{name}{sep}{v}" for v in values.split("|")] if sep and "|" in values else [part]
            variants = [f"{v}:{o}" if k else o for v in variants for o in options]
        expanded.extend(variants)
    return expanded
