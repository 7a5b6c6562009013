"""Resilient generation: a column's cache budget and the chain of smaller caches it falls back to.

transformers' documentation shows a "resilient" generate that catches a CUDA out-of-memory error and retries
with an offloaded cache. kvlab makes that gradual and visible:

- `Budget`: a budget in bytes (or none: fall back on out-of-memory errors only) and the strategies to fall back
  to, in order (None: `default_chain`). `parse_budget` reads a column's `budget_mib:` and `fallback:`.
- `ResilientSteps` iterates a `kvlab.engine.Decoder`. Before each step it predicts the bytes the cache will hold
  after it on the model's device, layer by layer (`kvlab.accounting.predicted_next_cache_bytes`); when that exceeds the budget,
  the run moves to the next strategy of the chain (`Decoder.replace_cache`: the next step re-prefills every
  token id so far into the new cache, so no generated text is lost). A `torch.OutOfMemoryError` (CUDA out of
  memory) raised by a step does the same, and the step runs again. Each switch is a `Fallback` record.

This module decides and switches; `kvlab.compare.runner` streams the events and `kvlab.compare.fidelity`
replays the switches when it scores the run. It does not render.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .accounting import cache_bytes, cache_bytes_by_device, predicted_next_cache_bytes
from .strategies import Strategy, StrategyError, make_strategy
from .strategies.base import parse_strategy_item
from .strategies.knob_yaml import shown

MIB = 1 << 20
MAX_BUDGET_MIB = 1 << 20
"""Largest budget a column may set (1 TiB), in MiB."""
MAX_FALLBACKS = 6
"""Longest fallback chain a column may name."""
CHAIN_ORDER = ("dynamic", "offloaded", "quantized", "sink")
"""The default chain, largest cache first (offloaded only where the model runs on CUDA). A column falls back to
the members after its own strategy (all of them for a strategy not in this list)."""
DEFAULT_QUANTIZED_BACKENDS = ("hqq", "quanto")
"""Backends tried, in order, for the default chain's int4 quantized cache."""
DEFAULT_SINK_WINDOW = 256
DEFAULT_RESIDUAL_LENGTH = 128
MIN_SINK_WINDOW = 8
CHAIN_SEPARATOR = ">"


def format_size(n_bytes: int) -> str:
    """Bytes for messages: `4.02 MiB` from 1 MiB up, else `20.0 KiB`."""
    return f"{n_bytes / MIB:.2f} MiB" if n_bytes >= MIB else f"{n_bytes / 1024:.1f} KiB"


def format_over(predicted: int, budget: int) -> str:
    """`4.02 MiB > budget 4.00 MiB`, with exact bytes when the rounded sizes read the same."""
    need, limit = format_size(predicted), format_size(budget)
    if need == limit:
        need, limit = f"{predicted:,} B", f"{budget:,} B"
    return f"{need} > budget {limit}"


def strategy_item(strategy: Strategy) -> str:
    """A strategy in the command-line syntax, knobs that differ from their defaults only:
    `quantized:backend=hqq:residual_length=32`."""
    defaults = type(strategy)().knobs() if _default_ok(type(strategy)) else {}
    knobs = [f"{k}={_yaml_scalar(v)}" for k, v in strategy.knobs().items() if defaults.get(k, object()) != v]
    return ":".join([strategy.name, *knobs])


def _default_ok(cls) -> bool:
    try:
        cls()
    except (StrategyError, TypeError):
        return False
    return True


def _yaml_scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def format_chain(strategies) -> str:
    """A fallback chain in the command-line syntax, items joined by ` > `."""
    return f" {CHAIN_SEPARATOR} ".join(strategy_item(s) for s in strategies)


@dataclass(frozen=True)
class Budget:
    """A column's cache budget and fallback chain.

    budget_bytes: most bytes the cache may hold on the model's device (None: no budget, out-of-memory
    fallback only). fallback: the strategies to switch to, in order (None: `default_chain` at run time).
    """

    budget_bytes: int | None
    fallback: tuple[Strategy, ...] | None = None

    def describe(self) -> str:
        """`budget 4.00 MiB`, or `OOM fallback` without a budget."""
        return "OOM fallback" if self.budget_bytes is None else f"budget {format_size(self.budget_bytes)}"

    def spec(self) -> dict:
        """The column keys that give this budget back (`budget_mib`, `fallback`)."""
        spec = {}
        if self.budget_bytes is not None:
            spec["budget_mib"] = self.budget_bytes / MIB
        if self.fallback is not None:
            spec["fallback"] = [{"strategy": s.name, **s.knobs()} for s in self.fallback]
        return spec


def parse_budget(budget_mib=None, fallback=None) -> Budget | None:
    """A column's `budget_mib` (MiB, a number > 0) and `fallback` (a list of strategy specs or items, or one
    string of items joined by `>`) as a `Budget`; None when neither is given.

    Raises:
        StrategyError: a budget that is not a positive number up to MAX_BUDGET_MIB, an empty or too long chain,
            an unknown strategy or knob in it, or a strategy that keeps no cache.
    """
    if budget_mib is None and fallback is None:
        return None
    budget_bytes = None
    if budget_mib is not None:
        if isinstance(budget_mib, bool) or not isinstance(budget_mib, (int, float)) or not math.isfinite(budget_mib) \
                or not 0 < budget_mib <= MAX_BUDGET_MIB:
            raise StrategyError(f"budget_mib must be a number of MiB in (0, {MAX_BUDGET_MIB}] (e.g. 4 or 0.5), "
                                f"got {shown(budget_mib)}")
        budget_bytes = int(round(budget_mib * MIB))
    return Budget(budget_bytes, None if fallback is None else parse_chain(fallback))


def require_cache(strategy: Strategy, budget: Budget | None) -> Budget | None:
    """`budget`, after checking that `strategy` keeps a cache for it to act on.

    Raises:
        StrategyError: a budget or fallback on a strategy without a cache (`no_cache`).
    """
    if budget is not None and not strategy.use_cache:
        raise StrategyError(f"{strategy.name} keeps no cache, so a budget or fallback has nothing to act on")
    return budget


def parse_chain(fallback) -> tuple[Strategy, ...]:
    """Strategies from a `fallback` value (see `parse_budget`).

    Raises:
        StrategyError: as `parse_budget`.
    """
    items = fallback
    if isinstance(fallback, str):
        items = [part.strip() for part in fallback.split(CHAIN_SEPARATOR) if part.strip()]
    if not isinstance(items, (list, tuple)) or not items:
        raise StrategyError(f"fallback must list at least one strategy (e.g. \"quantized:backend=hqq {CHAIN_SEPARATOR} "
                            f"sink\"), or be left out for the default chain; got {shown(fallback)}")
    if len(items) > MAX_FALLBACKS:
        raise StrategyError(f"fallback names {len(items)} strategies; at most {MAX_FALLBACKS}")
    chain = []
    for item in items:
        try:
            spec = parse_strategy_item(item) if isinstance(item, str) else item
        except ValueError as err:
            raise StrategyError(f"fallback: {err}") from None
        strategy = make_strategy(spec)
        if not strategy.use_cache:
            raise StrategyError(f"fallback: {strategy.name} keeps no cache, so it cannot take over a run's cache")
        chain.append(strategy)
    return tuple(chain)


def default_chain(loaded, strategy: Strategy, budget_bytes: int | None) -> list[Strategy]:
    """The chain after `strategy`: offloaded (on CUDA), quantized int4 (hqq, else quanto), sink.

    With a budget, the quantized residual is sized to a quarter of the tokens the budget holds densely (at
    most DEFAULT_RESIDUAL_LENGTH) and the sink window to half (at most DEFAULT_SINK_WINDOW, at least
    MIN_SINK_WINDOW), so each step down fits in it.
    """
    from .accounting import bytes_per_token
    from .strategies.offloaded import Offloaded
    from .strategies.quantized import Quantized
    from .strategies.sink import Sink

    fit = budget_bytes // bytes_per_token(loaded.config, loaded.model.dtype) if budget_bytes else None
    residual = DEFAULT_RESIDUAL_LENGTH if fit is None else max(1, min(DEFAULT_RESIDUAL_LENGTH, fit // 4))
    window = DEFAULT_SINK_WINDOW if fit is None else max(MIN_SINK_WINDOW, min(DEFAULT_SINK_WINDOW, fit // 2))
    quantized = [Quantized(backend=b, nbits=4, residual_length=residual) for b in DEFAULT_QUANTIZED_BACKENDS]
    members = {
        "offloaded": [Offloaded()] if torch.device(loaded.device).type == "cuda" else [],
        "quantized": [next((q for q in quantized if q.unavailable_reason(loaded) is None), quantized[0])],
        "sink": [Sink(window_length=window, num_sink_tokens=min(4, window - 1))],
    }
    start = CHAIN_ORDER.index(strategy.name) + 1 if strategy.name in CHAIN_ORDER else 0
    return [member for name in CHAIN_ORDER[start:] for member in members.get(name, [])]


def usable_chain(loaded, strategy: Strategy, budget: Budget) -> tuple[list[Strategy], list[str]]:
    """The fallback chain a column under `budget` can use on `loaded` (the budget's own chain, else
    `default_chain`), and a note per member left out because it cannot run here. When none is left, the last
    note says so: a column that outgrows its budget then has nowhere to go.

    Known before the column runs, so the page shows it from the column's start.
    """
    chain = list(budget.fallback) if budget.fallback is not None else default_chain(
        loaded, strategy, budget.budget_bytes)
    usable, notes = [], []
    for member in chain:
        reason = member.unavailable_reason(loaded)
        if reason:
            notes.append(f"{member.describe()} left out of the fallback chain: {reason}")
        else:
            usable.append(member)
    if chain and not usable:
        notes.append("no fallback can run on this model: over the budget the column keeps its cache and says so")
    return usable, notes


@dataclass
class Fallback:
    """One switch: before step `at_token` the run moved from cache `from_strategy` to `to`.

    reason: why (the prediction over the budget, or the out-of-memory error). bytes_before: bytes the old cache
    held; bytes_after: bytes the new one holds after re-prefilling (None if it never ran a step).
    to_spec: the new strategy's spec, to replay the switch.
    """

    at_token: int
    from_strategy: str
    to: str
    reason: str
    bytes_before: int
    bytes_after: int | None = None
    to_spec: dict = field(default_factory=dict)

    def sentence(self) -> str:
        """`switched to quantized hqq int4 r32 at token 51: the dynamic cache would need ...`"""
        return f"switched to {self.to} at token {self.at_token}: {self.reason}"

    def to_json(self) -> dict:
        return {"at_token": self.at_token, "from": self.from_strategy, "to": self.to, "reason": self.reason,
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after, "to_spec": self.to_spec}


class ResilientSteps:
    """Step a `Decoder` under `budget`, switching its cache down the fallback chain; one `Step` per `next()`.

    Args:
        loaded: the `kvlab.models.LoadedModel` the decoder runs.
        decoder: a fresh `kvlab.engine.Decoder`.
        budget: the column's `Budget`.
        max_total_tokens: input + max_new_tokens (sizes the fallback caches and the prediction).
        usable: `usable_chain(loaded, decoder.strategy, budget)` when the caller has it already (None: read here).

    Attributes:
        fallbacks: every finished switch, in order. notes: chain members left out (cannot run here) and the
            moment the run went over budget with no smaller cache left.

    Raises (from `next`):
        torch.OutOfMemoryError: out of memory with no strategy left in the chain.
    """

    def __init__(self, loaded, decoder, budget: Budget, max_total_tokens: int,
                 usable: tuple[list[Strategy], list[str]] | None = None):
        self.loaded, self.decoder, self.budget, self.max_total = loaded, decoder, budget, max_total_tokens
        chain, notes = usable or usable_chain(loaded, decoder.strategy, budget)
        self.chain, self.notes = list(chain), list(notes)
        self.fallbacks: list[Fallback] = []
        self._pending: Fallback | None = None
        self._over_noted = False

    def __iter__(self) -> "ResilientSteps":
        return self

    def __next__(self):
        decoder = self.decoder
        if decoder.stop_reason is not None or (decoder.stop is not None and decoder.stop.is_set()):
            return next(decoder)
        # 1. The budget: switch before a step whose cache would outgrow it.
        if self.budget.budget_bytes is not None and self._pending is None:
            predicted = self.predicted_bytes()
            if predicted > self.budget.budget_bytes:
                self._over_budget(predicted)
        # 2. The step; out of memory moves to the next cache and runs the step again.
        while True:
            try:
                step = next(decoder)
                break
            except torch.OutOfMemoryError as err:
                if not self.chain:
                    raise
                first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
                self._switch(f"out of memory during the step ({first_line[:160]})")
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        # 3. A switch is complete once the new cache has run its first step.
        if self._pending is not None:
            self._pending.bytes_after = step.cache_bytes if step.cache_bytes is not None else cache_bytes(decoder.cache)
            self.fallbacks.append(self._pending)
            self._pending = None
        return step

    def predicted_bytes(self) -> int:
        """Bytes the cache will hold on the model's device after the next step (dense growth of the tokens it
        holds, scaled by the share of the cache on that device: an offloaded cache keeps most in host memory)."""
        decoder = self.decoder
        by_device = cache_bytes_by_device(decoder.cache)
        total = sum(by_device.values())
        kind = torch.device(self.loaded.device).type
        here = sum(size for device, size in by_device.items() if torch.device(device).type == kind)
        share = here / total if total else 1.0
        config, dtype, strategy = self.loaded.config, self.loaded.model.dtype, decoder.strategy
        held_now, held_next = strategy.held_tokens_now_and_next(config, dtype, decoder.cache, decoder.seen_tokens,
                                                                decoder.next_seen_tokens, self.max_total)
        held_now = held_now if total else [0] * len(held_next)
        growth = predicted_next_cache_bytes(config, dtype, 0, held_now, held_next)
        return here + int(round(share * growth))

    def _over_budget(self, predicted: int) -> None:
        name = self.decoder.strategy.describe()
        need = f"the {name} cache would need {format_over(predicted, self.budget.budget_bytes)}"
        if self.chain:
            self._switch(need)
        elif not self._over_noted:
            self._over_noted = True
            self.notes.append(f"over budget from token {len(self.decoder.token_ids)}: {need}, and no smaller "
                              f"cache is left in the fallback chain")

    def _switch(self, reason: str) -> None:
        """Move the decoder to the next strategy's empty cache; the next step re-prefills into it."""
        decoder = self.decoder
        if self._pending is not None:
            self.fallbacks.append(self._pending)
        before = cache_bytes(decoder.cache)
        old, new = decoder.strategy, self.chain.pop(0)
        decoder.replace_cache(new, new.build_cache(self.loaded, self.max_total))
        self._pending = Fallback(len(decoder.token_ids), old.describe(), new.describe(), reason, before,
                                 to_spec={"strategy": new.name, **new.knobs()})
