"""One needle cell under one cache: prefill, greedy answer, teacher-forced key score, cache bytes.

The prompt goes through the strategy's cache with `kvlab.engine.forward` (the strategy's own `forward`, as
Compare's decoder calls it: a sink cache streams a long prompt in window-sized chunks), then up to
`new_tokens` greedy tokens follow. The key's teacher-forced log-probability reuses that one prefill: while the
greedy tokens equal the key's tokens, the decode's own logits are the teacher-forced ones; at the first
token that differs (or when the answer ends early) the rest of the key is fed through a copy of the cache
(`fork_cache`), or through the cache itself once decoding is over. Nothing is prefilled twice.

Scoring: `hit` when the key string appears in the decoded answer (as Quest's passkey script scores it,
arXiv:2406.10774); `key_logprob` is the sum over the key's tokens (those of " " + key) of their
log-probabilities, in nats; `key_rank` is the rank (1 = most likely) of the key's first non-blank token at
its position. This module runs one cell; it does not loop over a grid or emit events.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from ..accounting import cache_bytes
from ..engine import forward
from .prompt import PasskeyPrompt


@dataclass(frozen=True)
class CellOutcome:
    """What one cache did on one prompt. answer_ids: the greedy tokens (at most new_tokens, ending at an
    end-of-sequence token if one came). key_logprob: nats. key_rank: 1 = the most likely token.
    cache_bytes: exact bytes the cache held after the answer. prefill_s: seconds of the prefill forward."""

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


def fork_cache(cache):
    """An independent copy of `cache` to feed other tokens into (`copy.deepcopy`). Tensor subclasses that
    cannot be deep-copied (quanto's packed tensors in a `QuantizedLayer`) are shared instead: transformers'
    quantized layers replace them on update and never write into them (`QuantizedLayer.update`,
    transformers/cache_utils.py), so the original stays as it was."""
    try:
        return copy.deepcopy(cache)
    except RuntimeError:
        memo = {id(value): value for layer in getattr(cache, "layers", [])
                for value in vars(layer).values()
                if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor}
        return copy.deepcopy(cache, memo)


def _teacher_force(loaded, strategy, cache, sequence: torch.Tensor, to_feed) -> list[torch.Tensor]:
    """Feed `to_feed` one token at a time after `sequence` (1, seq) through `cache`; the log-softmax row
    (vocab,) after each."""
    rows = []
    for token in to_feed:
        sequence = torch.cat([sequence, torch.tensor([[token]], device=sequence.device)], dim=1)
        rows.append(torch.log_softmax(forward(loaded, strategy, cache, sequence, 1)[0].float(), dim=-1))
    return rows


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
    started = time.perf_counter()
    logits = forward(loaded, strategy, cache, ids, ids.shape[1])
    prefill_s = time.perf_counter() - started
    rows: list[torch.Tensor] = []
    answer: list[int] = []
    sequence = ids
    following_key = True
    while True:
        row = torch.log_softmax(logits[0].float(), dim=-1)
        token = int(torch.argmax(row))
        step = len(answer)
        answer.append(token)
        done = token in eos or len(answer) >= new_tokens
        if done:
            held = cache_bytes(cache) if cache is not None else 0
        if following_key and step < len(key):
            rows.append(row)
            if token != key[step] or done:
                following_key = False
                if step + 1 < len(key):
                    fork = cache if done else fork_cache(cache)
                    rows += _teacher_force(loaded, strategy, fork, sequence, key[step:-1])
        if done:
            break
        sequence = torch.cat([sequence, torch.tensor([[token]], device=sequence.device)], dim=1)
        logits = forward(loaded, strategy, cache, sequence, 1)
    logprob = float(sum(row[token] for row, token in zip(rows, key)))
    first = first_key_token(loaded.tokenizer, key)
    rank = int((rows[first] > rows[first][key[first]]).sum()) + 1
    text = loaded.tokenizer.decode(answer, skip_special_tokens=True)
    return CellOutcome(tuple(answer), text, prompt.key in text, logprob, rank, held, prefill_s)
