"""`random`: uniform random eviction, the baseline every eviction paper reports, following kvpress
`presses/random_press.py`: scores drawn from a generator seeded with `seed` at every layer (as kvpress seeds
it), so a seed keeps the same positions as kvpress on the same device. Module named `random_eviction` so it
does not shadow the standard library's `random`."""

from dataclasses import dataclass

from .base import register, require_int
from .scored import ScoredEviction


@register
@dataclass
class RandomEviction(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`) and `seed` (an integer >= 0; kvlab always seeds, kvpress's
    default None draws unseeded)."""

    name = "random"
    summary = "Keeps random prompt positions (seeded): the baseline. Lossy; the prompt's cache shrinks by compression_ratio."
    scorer_name = "random_scores"
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        require_int("seed", self.seed, 0)

    def score(self, inputs):
        from ..eviction.scoring import random_scores

        return random_scores(inputs, self.seed)

    def scorer_code(self) -> str:
        return f"{self.scorer_name}(inputs, seed={self.seed})"
