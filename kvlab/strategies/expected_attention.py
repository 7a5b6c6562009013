"""`expected_attention`: Expected Attention (Devoto et al. 2025, "Expected Attention: KV Cache Compression by
Estimating Attention from Future Queries Distribution", arXiv:2510.00636), following kvpress
`presses/expected_attention_press.py`: models the next `n_future_positions` queries as a Gaussian (mean and
covariance of the prompt's pre-rotary queries after the first `n_sink`, rotated by the averaged future rotary
matrix), scores each position by its expected attention times its value norm, and keeps the first `n_sink`."""

from dataclasses import dataclass

from .base import StrategyError, register, require_int
from .knob_yaml import shown
from .scored import ScoredEviction

MAX_FUTURE_POSITIONS = 65_536
"""Most future positions `n_future_positions` averages over (kvpress's default is 512; the rotary tables cost
2 × head_dim × 4 bytes per position)."""


@register
@dataclass
class ExpectedAttention(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`) and kvpress's: `n_future_positions` (512), `n_sink` (4),
    `use_covariance` (true), `use_vnorm` (true), `epsilon` (0.0)."""

    name = "expected_attention"
    summary = ("Keeps the prompt positions future queries are expected to attend to (a Gaussian model of the "
               "queries), times the value norm. Lossy; the prompt's cache shrinks by compression_ratio.")
    scorer_name = "expected_attention_scores"
    n_future_positions: int = 512
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        require_int("n_future_positions", self.n_future_positions, 1, MAX_FUTURE_POSITIONS)
        require_int("n_sink", self.n_sink, 0)
        for knob in ("use_covariance", "use_vnorm"):
            if not isinstance(getattr(self, knob), bool):
                raise StrategyError(f"{knob} must be true or false, got {shown(getattr(self, knob))}")
        if 0 < self.compress_every <= self.n_sink:
            raise StrategyError(f"expected_attention: compress_every must be more than n_sink={self.n_sink} (the "
                                f"query statistics skip the first n_sink tokens fed), got {self.compress_every}")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, (int, float)) or self.epsilon < 0:
            raise StrategyError(f"epsilon must be a number >= 0, got {shown(self.epsilon)}")

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        super().check_fits(prompt_tokens, max_new_tokens)
        compressed = prompt_tokens - (0 if self.query_aware else self.question_tokens)
        if compressed <= self.n_sink + 1:
            raise StrategyError(f"expected_attention needs a prompt longer than n_sink + 1 = {self.n_sink + 1} "
                                f"tokens (got {compressed})")

    def score(self, inputs):
        from ..eviction.scoring import expected_attention_scores

        return expected_attention_scores(inputs, self.n_future_positions, self.n_sink, self.use_covariance,
                                         self.use_vnorm, self.epsilon)

    def scorer_code(self) -> str:
        return (f"{self.scorer_name}(inputs, n_future_positions={self.n_future_positions}, n_sink={self.n_sink}, "
                f"use_covariance={self.use_covariance}, use_vnorm={self.use_vnorm}, epsilon={self.epsilon})")
