"""What a run costs, counted before it is queued, and how long that takes on this machine.

A run's cost is counted in token steps, the work of one decode step of one column:

- each column pays one step per new token it may generate;
- its prompt tokens cost 1/PREFILL_TOKENS_PER_STEP of a step each (prefill reads the whole prompt in one forward:
  on the bundled model with 2 cores a 256-token prefill took as long as 15 decode steps, a 1,024-token one as
  long as 24 less the longer context's slower steps);
- a column without a cache (`no_cache`) re-reads its whole sequence at every step, so each of its steps costs
  the sequence it reads as prefill does (`full_sequence_columns`).

Counts are upper bounds: a column may stop early at end-of-text. Before a tokenizer is at hand a prompt's
tokens are estimated from its length (`prompt_tokens`, CHARS_PER_TOKEN, erring long).

`Throughput` turns steps into seconds from the runs that finished here (median seconds per step of the
recent ones), starting from a conservative prior. No model and no clock of its own: callers pass elapsed times.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass

PREFILL_TOKENS_PER_STEP = 16
"""Prompt tokens that cost one decode step (prefill runs them in one forward)."""
CHARS_PER_TOKEN = 3
"""Characters per token when a prompt's tokens are estimated from its text (English is nearer 4: this errs long)."""
TEMPLATE_TOKENS = 16
"""Tokens a chat template adds around a message, at most, for the bundled models."""
PRIOR_S_PER_STEP = 0.1
"""Seconds per token step before any run has finished here (a 2-vCPU machine measured 0.05-0.07)."""
RECENT_RUNS = 8
"""Finished runs the measured rate is the median of."""


def prompt_tokens(*texts: str | None) -> int:
    """Estimated tokens of a prompt made of `texts` (message, system prompt) with its chat template."""
    chars = sum(len(text or "") for text in texts)
    return math.ceil(chars / CHARS_PER_TOKEN) + TEMPLATE_TOKENS


SHOWN_DIGITS = 15
"""Counts up to this many digits are written out in full; larger ones as a power of ten."""


def count_text(count: int) -> str:
    """`count` for a message: `1,024`, or `about 10^308` for a count past SHOWN_DIGITS digits (a typed length of
    1e308 must not push the rest of a one-line refusal past its length cap)."""
    if abs(count) < 10 ** SHOWN_DIGITS:
        return f"{count:,}"
    return f"about 10^{int((abs(count).bit_length() - 1) * math.log10(2))}"


@dataclass(frozen=True)
class RunCost:
    """A run's work before it runs. columns: columns (or caches) it runs; new_tokens: tokens each may generate
    or score, one forward each; prompt_tokens: tokens each reads in prefill; full_sequence_columns: how many of
    the columns have no cache and re-read their whole sequence at every step."""

    columns: int
    new_tokens: int
    prompt_tokens: int = 0
    full_sequence_columns: int = 0

    @property
    def steps(self) -> int:
        """Token steps: columns × (new tokens + prompt tokens ÷ PREFILL_TOKENS_PER_STEP), plus for each column
        without a cache new tokens × (its mean sequence ÷ PREFILL_TOKENS_PER_STEP)."""
        columns, new, prompt = max(1, self.columns), max(0, self.new_tokens), max(0, self.prompt_tokens)
        prefill = -(-prompt // PREFILL_TOKENS_PER_STEP)  # whole-number arithmetic: any count, however large
        rereads = -(-new * (2 * prompt + new) // (2 * PREFILL_TOKENS_PER_STEP))
        return columns * (new + prefill) + max(0, self.full_sequence_columns) * rereads

    def describe(self) -> str:
        """The count in words, e.g. "8 columns × (512 new + 1,024 prompt tokens)"."""
        words = f"{self.columns} column{'s' if self.columns != 1 else ''} × ({count_text(self.new_tokens)} new"
        words += f" + {count_text(self.prompt_tokens)} prompt tokens)" if self.prompt_tokens else " tokens)"
        if self.full_sequence_columns:
            words += f", {self.full_sequence_columns} without a cache"
        return words


class Throughput:
    """Seconds per token step on this machine: the median of the last RECENT_RUNS finished runs' elapsed
    seconds ÷ steps, or `prior_s` before any. Thread-safe."""

    def __init__(self, prior_s: float = PRIOR_S_PER_STEP, recent: int = RECENT_RUNS):
        self.prior_s = prior_s
        self._samples: deque[float] = deque(maxlen=recent)
        self._guard = threading.Lock()

    def record(self, cost: RunCost, elapsed_s: float) -> None:
        """A run of `cost` finished in `elapsed_s` seconds (a stopped or failed run is not recorded)."""
        if cost.steps > 0 and elapsed_s > 0:
            with self._guard:
                self._samples.append(elapsed_s / cost.steps)

    def s_per_step(self) -> float:
        with self._guard:
            return statistics.median(self._samples) if self._samples else self.prior_s

    def measured(self) -> int:
        """How many finished runs the rate comes from (0: the prior)."""
        with self._guard:
            return len(self._samples)

    def estimate_s(self, cost: RunCost) -> float:
        """Seconds `cost` is expected to take here."""
        return cost.steps * self.s_per_step()
