"""`tova`: TOVA (Oren et al. 2024, "Transformers are Multi-State RNNs", arXiv:2401.06104), following kvpress
`presses/tova_press.py`: the prompt's last query's attention to each position, averaged over all query heads
(one ranking shared by every KV head); kvpress always keeps the last position, which TOVA itself may drop;
kvlab follows kvpress. Applied at prefill; `compress_every: 1` evicts one position per decoding step, as
TOVA's paper does."""

from dataclasses import dataclass

from .base import register
from .scored import ScoredEviction


@register
@dataclass
class TOVA(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`)."""

    name = "tova"
    summary = ("Keeps the prompt positions the last prompt token attends to most, averaged over heads. Lossy; the "
               "prompt's cache shrinks by compression_ratio.")
    scorer_name = "tova_scores"

    def score(self, inputs):
        from ..eviction.scoring import tova_scores

        return tova_scores(inputs)
