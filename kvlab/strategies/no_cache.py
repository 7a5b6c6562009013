"""`no_cache`: `use_cache=False`, the whole sequence is recomputed at every step."""

from dataclasses import dataclass

from ..engines import no_equivalent
from .base import Strategy, register


@register
@dataclass
class NoCache(Strategy):
    name = "no_cache"
    summary = "Keeps nothing: every new token re-reads the whole sequence. Zero cache memory, time per token grows with length."
    use_cache = False

    def build_cache(self, loaded, max_total_tokens: int):
        return None

    def forward(self, loaded, cache, sequence, new_tokens: int):
        """Recompute the whole `sequence` (1, seq); returns last-position logits (1, vocab)."""
        out = loaded.model(input_ids=sequence, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1, :]

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        return 0

    def forward_code(self) -> tuple[list[str], list[str]]:
        return [], ["out = model(input_ids=sequence, use_cache=False, logits_to_keep=1)  # the whole sequence again"]

    def generate_kwargs_code(self) -> str:
        return "use_cache=False"

    def serving_settings(self) -> list:
        return no_equivalent("every engine keeps a KV cache; recomputing the whole prefix each step is what a cache "
                             "avoids")
