"""`snapkv`: SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation",
arXiv:2404.14469), following kvpress `presses/snapkv_press.py`: the prompt's last `window_size` queries vote
for the earlier positions (mean attention, pooled over `kernel_size`, averaged over each KV head's query
group); the window itself is always kept. Scores come from the layer's own queries (no eager attention).
Does not: cluster votes across heads differently per query head (kvpress averages the group)."""

from dataclasses import dataclass

from .base import StrategyError, register, require_int
from .scored import ScoredEviction


@register
@dataclass
class SnapKV(ScoredEviction):
    """Knobs: the budget (see `ScoredEviction`), `window_size` (observation window, tokens; kvpress 64) and
    `kernel_size` (pooling width, odd; kvpress 5)."""

    name = "snapkv"
    summary = ("Keeps the prompt positions the last window_size prompt tokens attend to most (per layer and KV "
               "head), and the window. Lossy; the prompt's cache shrinks by compression_ratio.")
    scorer_name = "snapkv_scores"
    window_size: int = 64
    kernel_size: int = 5

    def __post_init__(self):
        super().__post_init__()
        require_int("window_size", self.window_size, 1)
        require_int("kernel_size", self.kernel_size, 1)
        if 0 < self.compress_every <= self.window_size:
            raise StrategyError(f"{self.name}: compress_every must be more than window_size={self.window_size} "
                                f"(the window is the last tokens fed since the last compression), got "
                                f"{self.compress_every}")
        if self.kernel_size % 2 == 0:
            raise StrategyError(f"kernel_size must be odd (1, 3, 5, ...), got {self.kernel_size}")

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        super().check_fits(prompt_tokens, max_new_tokens)
        compressed = prompt_tokens - (0 if self.query_aware else self.question_tokens)
        if compressed <= self.window_size:
            raise StrategyError(f"{self.name} needs a prompt longer than window_size={self.window_size} tokens "
                                f"(got {compressed}); lower window_size")

    def score(self, inputs):
        from ..eviction.scoring import snapkv_scores

        return snapkv_scores(inputs, self.window_size, self.kernel_size)

    def scorer_code(self) -> str:
        return f"{self.scorer_name}(inputs, window_size={self.window_size}, kernel_size={self.kernel_size})"
