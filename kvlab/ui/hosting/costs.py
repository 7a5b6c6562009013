"""The cost of each model-bound entry point, from its raw inputs, before it is queued (`kvlab.sharing.cost`).

Each function reads what a tab or tool was given (text as typed, numbers that may be empty) and never raises:
an input it cannot read counts as small, and the run itself then says what is wrong where the user looks. The
counts are upper bounds (`kvlab.sharing.cost.RunCost`). No gradio.
"""

from __future__ import annotations

import math

from kvlab.needle.grid import parse_tokens, split_items
from kvlab.sharing.cost import RunCost, prompt_tokens

NO_CACHE = "no_cache"
"""The strategy that re-reads its whole sequence at every step."""


def whole(value, default: int = 1) -> int:
    """`value` as a whole number >= 0, or `default` when it is empty or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return int(number) if math.isfinite(number) and number >= 0 else default


def compare_cost(strategies: list[str], max_new_tokens, *texts: str | None) -> RunCost:
    """A comparison: one column per strategy item (compare syntax, `name:knob=value`), each generating up to
    `max_new_tokens` after a prompt made of `texts` (message, system prompt)."""
    names = [str(item).split(":")[0].strip() for item in strategies]
    return RunCost(columns=len(names), new_tokens=whole(max_new_tokens), prompt_tokens=prompt_tokens(*texts),
                   full_sequence_columns=names.count(NO_CACHE))


def needle_cost(strategies: list[str], lengths, depths, seeds, new_tokens) -> RunCost:
    """A passkey grid: every cell (length × depth × seed) is one prefill of its length and up to `new_tokens`
    greedy tokens, in each column of `strategies` (compare syntax); a `no_cache` column re-reads its sequence
    at every step, counted as if every cell's tokens were one sequence (an upper bound)."""
    names = [str(item).split(":")[0].strip() for item in strategies]
    readable = []
    for item in split_items(lengths):
        try:
            readable.append(parse_tokens(item))
        except ValueError:
            continue
    repeats = max(1, len(split_items(depths))) * max(1, len(split_items(seeds)))
    cells = max(1, len(readable)) * repeats
    return RunCost(columns=len(names), new_tokens=cells * whole(new_tokens), prompt_tokens=sum(readable) * repeats,
                   full_sequence_columns=names.count(NO_CACHE))


def stream_cost(caches: int, tokens, context=0) -> RunCost:
    """A teacher-forced pass (Perplexity, Report): `tokens` forwards of one token each per cache, after a
    `context` read in prefill."""
    return RunCost(columns=caches, new_tokens=whole(tokens), prompt_tokens=whole(context, 0))


INSPECT_CACHES = 3
"""Caches an Inspect run prefills and steps: its own stepped session and the lockstep pair (the strategy beside
its reference)."""
INSPECT_STEP_BASE = 5
INSPECT_STEP_CONTEXT = 256
"""One Inspect step costs INSPECT_STEP_BASE token steps plus one per INSPECT_STEP_CONTEXT prompt tokens: the
hooked step, the lockstep pair and their per-layer diagnostics (on the bundled model with 2 cores a step took
0.38 s after a 64-token prompt and 0.97 s after 2,048, when a token step takes about 0.09 s)."""


def inspect_cost(steps, *texts: str | None) -> RunCost:
    """An Inspect run: INSPECT_CACHES caches prefilled with a prompt made of `texts` (message, system prompt),
    then up to `steps` steps, each costing INSPECT_STEP_BASE + prompt tokens ÷ INSPECT_STEP_CONTEXT token steps."""
    prompt = prompt_tokens(*texts)
    per_step = INSPECT_STEP_BASE + prompt // INSPECT_STEP_CONTEXT
    return RunCost(columns=INSPECT_CACHES, new_tokens=-(-whole(steps) * per_step // INSPECT_CACHES),
                   prompt_tokens=prompt)
