"""Decode-loop mistakes, as strategies that can be stepped in lockstep beside the correct loop.

Each variant is a `dynamic` cache fed by a hand-written loop with one classic mistake in its `forward`; the
`kvlab.engine.Decoder` drives it like any strategy, so `kvlab.inspect.diverge.DivergeSession` compares it with
the correct loop (a `dynamic` reference) token by token and layer by layer, and `DivergeStep.cache_length`
against `seen_tokens` shows what the cache holds. They are not registered: Compare and the planner never list
them; `LOOP_VARIANTS` names them for Inspect and the `diverge` command.

This module defines the loops; it does not measure or render them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..strategies.dynamic import Dynamic


@dataclass
class LoopVariant(Dynamic):
    """A `dynamic` cache fed by a loop with a mistake; `explanation` says what goes wrong in one line."""

    lossy: ClassVar[bool] = True
    explanation: ClassVar[str] = ""
    code: ClassVar[str] = ""

    def title(self) -> str:
        return self.name

    def caveat(self) -> str:
        return self.explanation

    def forward_code(self) -> tuple[list[str], list[str]]:
        return [], [self.code]


@dataclass
class FullSequenceLoop(LoopVariant):
    """Feeds every id so far at every step, with the cache."""

    name: ClassVar[str] = "loop:full_sequence"
    explanation: ClassVar[str] = (
        "feeds the whole sequence with the cache at every step: the cache appends every token again (its length "
        "grows by the sequence length per step, not by one) and each new query attends to duplicated, "
        "wrongly positioned keys")
    code: ClassVar[str] = "out = model(input_ids=generated_ids, past_key_values=past, use_cache=True)"

    def forward(self, loaded, cache, sequence, new_tokens: int):
        out = loaded.model(input_ids=sequence, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]


@dataclass
class RestartedPositionsLoop(LoopVariant):
    """Passes `position_ids` counted from 0 for the new ids (the cache's length forgotten)."""

    name: ClassVar[str] = "loop:positions_from_zero"
    explanation: ClassVar[str] = (
        "passes position_ids = arange(new tokens) at every step: each new token is rotated as if it were the "
        "first token of the text, so its query and key sit at position 0 while the cache's keys sit where they "
        "were; the cache's length is right and the error hides in the positions")
    code: ClassVar[str] = ("out = model(input_ids=input_ids, past_key_values=past, use_cache=True, "
                           "position_ids=torch.arange(input_ids.shape[1])[None])")

    def forward(self, loaded, cache, sequence, new_tokens: int):
        positions = torch.arange(new_tokens, device=sequence.device)[None]
        out = loaded.model(input_ids=sequence[:, -new_tokens:], cache=cache, use_cache=True,
                           position_ids=positions, logits_to_keep=1)
        return out.logits[:, -1, :]


LOOP_VARIANTS: dict[str, type[LoopVariant]] = {cls.name: cls for cls in (FullSequenceLoop, RestartedPositionsLoop)}
"""Loop-variant name -> class, in display order."""
