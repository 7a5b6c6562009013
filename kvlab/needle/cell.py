"""One needle cell under one cache: prefill, greedy answer, teacher-forced key score, cache bytes.

The prompt goes through the strategy's cache with the engine's `Decoder` (the strategy's own `forward`, as
Compare's decoder calls it: a sink cache streams a long prompt in window-sized chunks), which then chooses up
to `new_tokens` greedy tokens. The key's teacher-forced log-probability reuses that one prefill: while the
greedy tokens equal the key's tokens, the decode's own logits are the teacher-forced ones; at the first
token that differs (or when the answer ends early) the rest of the key is fed by the engine's
`teacher_force` through a copy of the cache (`kvlab.caches.copying.copy_cache`), or through the cache itself
once decoding is over. Nothing is prefilled twice.

Scoring: `hit` when the key string appears in the decoded answer (as Quest's passkey script scores it,
arXiv:2406.10774); `key_logprob` is the sum over the key's tokens (those of " " + key) of their
log-probabilities, in nats; `key_rank` is the rank (1 = most likely) of the key's first non-blank token at
its position. This module runs one cell; it does not loop over a grid or emit events.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accounting import cache_bytes
from ..caches.copying import copy_cache
from ..engine import Decoder, teacher_force
from ..generation import GenerationSettings
from .prompt import PasskeyPrompt


@dataclass(frozen=True)
class CellOutcome:
    """What one cache did on one prompt. answer_ids: the greedy tokens (at most new_tokens, ending at an
    end-of-sequence token if one came). key_logprob: nats. key_rank: 1 = the most likely token.
    cache_bytes: exact bytes the cache held after the answer. prefill_s: seconds of the prefill forward and
    the first token's choice (the Decoder's first step)."""

    answer_ids: tuple[int, ...]
    answer_text: str
    hit: bool
    key_logprob: float
    key_rank: int
    cache_bytes: int
    prefill_s: float


def first_key_token(tokenizer, key_ids) -> int:
    """Index in `key_ids` of the first token that carries a character of the key (a tokenizer may give the
    leading space its own token)."""
    for index, token in enumerate(key_ids):
        if tokenizer.decode([token]).strip():
            return index
    return 0


def run_cell(loaded, strategy, prompt: PasskeyPrompt, new_tokens: int, eos: set[int] = frozenset()) -> CellOutcome:
    """Run `prompt` through a fresh cache of `strategy` and score it (see the module docstring).

    Raises:
        StrategyError: the strategy cannot take this prompt (`Strategy.check_fits`), before any compute;
        whatever building the cache or a forward raises (the caller reports it in the column).
    """
    ids = torch.tensor([list(prompt.prompt_ids)], device=loaded.device)
    key = list(prompt.key_ids)
    strategy.check_fits(ids.shape[1], max(new_tokens, len(key)))
    cache = strategy.build_cache(loaded, ids.shape[1] + max(new_tokens, len(key)))
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    decoder = Decoder(loaded, strategy, cache, ids, settings, keep_logits=True)
    rows: list[torch.Tensor] = []
    answer: list[int] = []
    following_key, held = True, 0
    for step in decoder:
        row = torch.log_softmax(step.logits.float(), dim=-1)
        answer.append(step.token_id)
        done = step.token_id in eos or len(answer) >= new_tokens
        if done:
            held = cache_bytes(cache) if cache is not None else 0
        if following_key and step.index < len(key):
            rows.append(row)
            if step.token_id != key[step.index] or done:
                following_key = False
                if step.index + 1 < len(key):
                    rows += _teacher_force_rest(loaded, strategy, cache if done else copy_cache(cache),
                                                decoder.sequence, key, step.index)
        if done:
            break
    logprob = float(sum(row[token] for row, token in zip(rows, key)))
    first = first_key_token(loaded.tokenizer, key)
    rank = int((rows[first] > rows[first][key[first]]).sum()) + 1
    text = loaded.tokenizer.decode(answer, skip_special_tokens=True)
    return CellOutcome(tuple(answer), text, prompt.key in text, logprob, rank, held, decoder.ttft_s)


def _teacher_force_rest(loaded, strategy, cache, sequence: torch.Tensor, key: list[int], step: int) -> list:
    """Log-softmax rows (vocab,) predicting key[step + 1:], teacher-forced through `cache`, which holds
    `sequence` (1, seq): the prompt and the answer before `key[step]` (`kvlab.engine.teacher_force`)."""
    fed = torch.cat([sequence, torch.tensor([[key[step]]], device=sequence.device)], dim=1)
    forced = teacher_force(loaded, strategy, cache, fed, key[step + 1:], feed_from=sequence.shape[1])
    return [torch.log_softmax(s.logits.float(), dim=-1) for s in forced]
