"""`knorm`: key-norm eviction (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache
Compression", arXiv:2406.11430), following kvpress `presses/knorm_press.py`: keeps the positions whose keys have
the smallest L2 norm (norms in float32 at least). Needs no attention weights."""

from dataclasses import dataclass

from .base import register
from .scored import ScoredEviction


@register
@dataclass
class Knorm(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`)."""

    name = "knorm"
    summary = ("Keeps the prompt positions whose keys have the smallest norm. Lossy; the prompt's cache shrinks by "
               "compression_ratio; the cheapest score.")
    scorer_name = "knorm_scores"

    def score(self, inputs):
        from ..eviction.scoring import knorm_scores

        return knorm_scores(inputs)
