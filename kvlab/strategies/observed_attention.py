"""`observed_attention`: H2O-style heavy hitters (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle", arXiv:2306.14048),
following kvpress `presses/observed_attention_press.py`: each position's attention from every later prompt query,
averaged over the queries that could see it and over each KV head's query group. kvpress needs eager attention
to read the weights; kvlab computes them from the layer's queries and keys, so any attention kernel serves, up to
`OBSERVED_ATTENTION_MAX_TOKENS` prompt tokens ((heads, seq, seq) float32 weights per layer). Applied at
prefill; `compress_every: 1` evicts at every decoding step as H2O does, scoring with the tokens fed since
the last compression (H2O accumulates the attention every token ever paid; not done here)."""

from dataclasses import dataclass

from .base import StrategyError, register
from .scored import ScoredEviction


@register
@dataclass
class ObservedAttention(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`)."""

    name = "observed_attention"
    summary = ("Keeps the prompt positions that received the most attention from the prompt's own queries (H2O). "
               "Lossy; the prompt's cache shrinks by compression_ratio.")
    scorer_name = "observed_attention_scores"

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        from ..eviction.scoring import OBSERVED_ATTENTION_MAX_TOKENS

        super().check_fits(prompt_tokens, max_new_tokens)
        if prompt_tokens > OBSERVED_ATTENTION_MAX_TOKENS:
            raise StrategyError(f"observed_attention scores at most {OBSERVED_ATTENTION_MAX_TOKENS} prompt tokens "
                                f"(got {prompt_tokens}): its weights are (heads, seq, seq)")

    def score(self, inputs):
        from ..eviction.scoring import observed_attention_scores

        return observed_attention_scores(inputs)
