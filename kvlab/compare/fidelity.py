"""Fidelity of each column against a baseline column (dynamic by default).

Two views, because a lossy cache can keep the text and still change the model:

- text: fraction of the baseline's tokens matched position by position, and the
  first index where the column's tokens leave the baseline's;
- teacher-forced: the baseline's continuation is fed through the column's own
  cache token by token (one full forward for exact caches), and at every position the column's next-token
  distribution is compared with the baseline's (computed the same way under the
  baseline's cache): top-1 agreement and mean KL(baseline || column) in nats. An engine column's
  distributions are its engine's (llama.cpp's logits over the same ids); a server's are not read, so it is
  not scored.

Scoring covers at most FIDELITY_MAX_TOKENS continuation tokens. A budgeted
column that fell back to smaller caches is scored with the same switches at the
same tokens, so its score covers the whole run. The text view needs no model
and is filled with the summary (`prepare_fidelity`); the teacher-forced pass
(`score_fidelity`) runs after it, one column per step. The model work is
`kvlab.engine.score_continuation`; this module picks the baseline and compares.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

from ..engine import RunStopped, score_continuation
from ..strategies import StrategyError, make_strategy
from .events import ColumnResult, FidelityScored

FIDELITY_MAX_TOKENS = 256


def text_agreement(baseline_ids: list[int], column_ids: list[int]) -> tuple[float, int | None]:
    """(fraction of baseline tokens matched at the same position, first divergence index or None)."""
    if not baseline_ids:
        return (1.0 if not column_ids else 0.0), (None if not column_ids else 0)
    matched = sum(1 for a, b in zip(baseline_ids, column_ids) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(baseline_ids, column_ids)) if a != b), None)
    if first is None and len(baseline_ids) != len(column_ids):
        first = min(len(baseline_ids), len(column_ids))
    return matched / len(baseline_ids), first


def compare_distributions(baseline: torch.Tensor, column: torch.Tensor) -> tuple[float, float]:
    """(top-1 agreement, mean KL(baseline || column) in nats) of two (T, vocab) log-prob tables."""
    top1 = (baseline.argmax(-1) == column.argmax(-1)).float().mean().item()
    kl = (baseline.exp() * (baseline - column)).sum(-1).clamp_min(0).mean().item()
    return top1, kl


def pick_baseline(columns, results: list[ColumnResult], baseline: int | None) -> int | None:
    """Index of the baseline: the given one if ok, else the first ok `dynamic` without a budget, else the first
    ok column without a budget whose cache keeps everything, else the first ok column."""
    ok = [i for i, r in enumerate(results) if r.status == "ok" and r.token_ids]
    if baseline is not None and baseline in ok:
        return baseline
    free = [i for i in ok if columns[i].budget is None]
    dynamic = [i for i in free if columns[i].strategy.name == "dynamic"]
    exact = [i for i in free if columns[i].strategy.keeps_everything]
    return (dynamic or exact or ok or [None])[0]


def switches_of(result: ColumnResult) -> list[tuple[int, object]]:
    """(token index, strategy) of each fallback switch in a column's run, for `score_continuation`."""
    return [(switch["at_token"], make_strategy(switch["to_spec"])) for switch in result.fallbacks]


def prepare_fidelity(columns, results: list[ColumnResult], baseline: int | None) -> tuple[int | None, list[int]]:
    """Before any model work: pick the baseline (marked `is_baseline`), fill every ok column's text `agreement`
    and `first_divergence`, and return (baseline index or None, the columns the teacher-forced pass will score:
    the baseline first, then the other ok columns in order). A column told to make fewer tokens than the
    baseline (its own `max_new_tokens` override) is compared with that many of the baseline's tokens."""
    base_index = pick_baseline(columns, results, baseline)
    if base_index is None:
        return None, []
    base = results[base_index]
    base.is_baseline = True
    order = [base_index] + [i for i, r in enumerate(results) if i != base_index and r.status == "ok" and r.token_ids]
    for i in order:
        limit = (columns[i].overrides or {}).get("max_new_tokens")
        reference = base.token_ids[:limit] if isinstance(limit, int) else base.token_ids
        results[i].agreement, results[i].first_divergence = text_agreement(reference, results[i].token_ids)
    return base_index, order


def mark_unscored(results: list[ColumnResult], order: list[int], why: str) -> None:
    """`fidelity_status = "not scored: <why>"` on each column of `order` that has no status yet."""
    for i in order:
        if not results[i].fidelity_status:
            results[i].fidelity_status = f"not scored: {why}"


def _score(loaded, strategy, prompt_ids, continuation: list[int], stop, result: ColumnResult) -> torch.Tensor:
    """The column's log-probabilities for the baseline's continuation: kvlab's engine under its strategy, or an
    engine column's own engine (`EngineColumn.score_continuation`), which may raise StrategyError (a server)."""
    if strategy.engine_name:
        return strategy.score_continuation(loaded, prompt_ids[0].tolist(), list(continuation), stop,
                                           torch.get_num_threads())
    return score_continuation(loaded, strategy, prompt_ids, continuation, stop, switches_of(result))


def score_fidelity(loaded, prompt_ids, columns, results: list[ColumnResult], order: list[int],
                   stop: threading.Event) -> Iterator[FidelityScored]:
    """Fill top1_agreement, mean_kl and fidelity_tokens on each column of `order` (from `prepare_fidelity`, the
    baseline first), one column per step (`kvlab.engine.score_continuation` under each column's strategy),
    yielding a `FidelityScored` after each. Stopped: returns, leaving the rest unscored. A column whose scoring
    fails keeps the error in its message and `fidelity_status`; the others go on."""
    if not order:
        return
    base_index, base = order[0], results[order[0]]
    continuation = base.token_ids[:FIDELITY_MAX_TOKENS]
    reference = None
    for done, i in enumerate(order, 1):
        result = results[i]
        try:
            scored = _score(loaded, columns[i].strategy, prompt_ids, continuation, stop, result)
        except RunStopped:
            return
        except Exception as err:  # noqa: BLE001 - scoring failure is reported in the column, the run goes on
            if not (columns[i].strategy.engine_name and isinstance(err, StrategyError)):  # not an engine's "none"
                result.message = (result.message + "; " if result.message else "") + f"fidelity not scored: {err}"
            result.fidelity_status = f"not scored: {err}"
            yield FidelityScored(i, result, done, len(order))
            if i == base_index:
                mark_unscored(results, order, "the baseline could not be scored")
                return
            continue
        reference = scored if i == base_index else reference
        result.top1_agreement, result.mean_kl = compare_distributions(reference, scored)
        result.fidelity_tokens, result.fidelity_status = len(continuation), "scored"
        yield FidelityScored(i, result, done, len(order))
