"""Plan the exact KV-cache memory of any model at any context and batch, without loading its weights.

`plan(PlanRequest(...))` takes a model source (`bundled`, a catalog hub id, a local
folder or a hub id), context lengths in tokens, a batch size, a dtype and strategies
written as Compare takes them (`{"strategy": "quantized", "backend": "quanto",
"nbits": 4}`, parsed by the same registry), and returns a `Plan`: per strategy and
context the cache bytes (total and per layer type), the weights bytes, their sum,
whether it fits a budget, the longest context that fits, and a one-line
explanation.

Method: `kvlab.plan.probe` finds the layer groups and what each layer writes
to its cache from a shrunk copy of the model on the meta device;
`kvlab.plan.meter` runs each strategy's real cache on one layer per group and
counts its bytes with `kvlab.accounting`, and `kvlab.plan.measured` keeps what it
measured per model and strategy, so a later plan of the same model measures only
contexts it has not seen; this module multiplies by the layers
of each group, adds the weights, searches the budget and explains. A context of
10^7 tokens is numbers, not memory: nothing is allocated at full size.

Schedule: by default each context is one prompt prefilled in one forward (a sink
cache streams it through its window in chunks, as Compare does); with
`prefill_tokens` the first `prefill_tokens` are the prompt and the rest are decoded
one token at a time, which matters for quantized caches (their residual).
`offloaded` and `offloaded_static` need CUDA to run; they are planned from the
on-device cache they offload (`dynamic`, `static`), with the bytes that stay on the
GPU counted apart. This module plans; it does not render (see `kvlab.cli.plan`).

Limits: the request's contexts (`MAX_CONTEXT_TOKENS`), batch (`MAX_BATCH`), contexts and strategies per
request are checked by `PlanRequest.check`, and the model's config by `kvlab.plan.config_limits` before
anything is built from it. `plan_steps` plans one strategy per step, so a caller can stop a plan between
steps by closing it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .budget_input import GIB, MAX_BUDGET_GIB
from .config_limits import check_config
from .explain import explain, strategy_notes
from .measured import meter_for
from .meter import FAR_TOKENS, GroupLaw, MeasureError, PlanLimit
from .probe import Architecture, ProbeError, describe_architecture
from ..strategies import StrategyError, make_strategy
from ..strategies.dynamic import Dynamic
from ..strategies.knob_yaml import shown
from ..strategies.static import Static

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_CONTEXTS = 64
MAX_STRATEGIES = 16
MAX_BATCH = 1 << 20
MAX_CONTEXT_TOKENS = 1 << 32
MAX_ELEMENTS = 1 << 62
"""Largest key or value tensor the meter may describe (elements); torch sizes are 64-bit."""
OFFLOADED_RESIDENT_LAYERS = 2
"""Offloaded layers on the GPU at once in transformers' offloading: the one attending and the next, prefetched."""


WARM_UP_MODEL = "HuggingFaceTB/SmolLM2-1.7B-Instruct"
"""The catalog model `warm_up` plans: small and all full attention, so every strategy runs on it."""


class PlanError(ValueError):
    """The plan cannot be made: bad input, or a model that cannot be probed. The message says why."""


def _offload_equivalent(strategy):
    """(the on-device strategy to measure, whether sliding layers stay on the GPU) for offloaded strategies, else
    (strategy, None)."""
    if strategy.name == "offloaded":
        return Dynamic(), False
    if strategy.name == "offloaded_static":
        return Static(max_cache_len=strategy.max_cache_len), True
    return strategy, None


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    model: `bundled`, a catalog hub id, a local folder, a hub id, or a transformers config. contexts: context
    lengths, tokens, each >= 1. batch: sequences, >= 1. dtype: one of `DTYPES`.
    strategies: specs as Compare takes them (`{"strategy": name, **knobs}`).
    budget_bytes: memory for weights + cache on the accelerator, bytes (None: no budget).
    prefill_tokens: prompt tokens prefilled in one forward (None: the whole context).
    """

    model: object = "bundled"
    contexts: tuple[int, ...] = (1024, 32768, 131072)
    batch: int = 1
    dtype: str = "bfloat16"
    strategies: tuple = ({"strategy": "dynamic"},)
    budget_bytes: int | None = None
    prefill_tokens: int | None = None

    def check(self) -> list:
        """Validate and return the strategies built from their specs.

        Raises:
            PlanError: a context, batch, dtype, budget or prefill out of range, or an
                unknown strategy/knob (the message lists the allowed values).
        """
        _require_ints("context", self.contexts, 1, MAX_CONTEXT_TOKENS)
        if not self.contexts or len(self.contexts) > MAX_CONTEXTS:
            raise PlanError(f"give between 1 and {MAX_CONTEXTS} context lengths, got {len(self.contexts)}")
        _require_ints("batch", [self.batch], 1, MAX_BATCH)
        if self.dtype not in DTYPES:
            raise PlanError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.budget_bytes is not None and (not isinstance(self.budget_bytes, (int, float))
                                              or not 0 < self.budget_bytes <= MAX_BUDGET_GIB * GIB):
            raise PlanError(f"the budget must be a number of bytes above 0 and at most {MAX_BUDGET_GIB:,} GiB "
                            f"(MAX_BUDGET_GIB), got {shown(self.budget_bytes)}")
        if self.prefill_tokens is not None:
            _require_ints("prefill", [self.prefill_tokens], 1, min(self.contexts))
        if not self.strategies or len(self.strategies) > MAX_STRATEGIES:
            raise PlanError(f"give between 1 and {MAX_STRATEGIES} strategies, got {len(self.strategies)}")
        try:
            return [make_strategy(spec) for spec in self.strategies]
        except StrategyError as err:
            raise PlanError(str(err)) from err


def _require_ints(name: str, values, low: int, high: int) -> None:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise PlanError(f"{name} must be an integer from {low:,} to {high:,}, got {value!r}")


@dataclass
class PlanCell:
    """One strategy at one context. Bytes are exact; `error` says why a cell has none.

    cache_bytes: all layers, the whole batch. cache_bytes_by_layer_type: the same per
    layer group label. cache_bytes_on_device: what stays in accelerator memory (less
    than cache_bytes only for offloaded caches). total_bytes: weights + cache. fits:
    weights + on-device cache <= budget (None without a budget).
    """

    context: int
    weights_bytes: int
    cache_bytes: int | None = None
    cache_bytes_by_layer_type: dict[str, int] = field(default_factory=dict)
    cache_bytes_on_device: int | None = None
    fits: bool | None = None
    error: str | None = None

    @property
    def total_bytes(self) -> int | None:
        return None if self.cache_bytes is None else self.weights_bytes + self.cache_bytes


@dataclass
class StrategyPlan:
    """Plan of one strategy: `status` ok | unavailable | error, `message` the reason when not ok,
    `max_context_in_budget` tokens (None without a budget or when unbounded: then `max_context_unbounded`)."""

    name: str
    spec: dict
    status: str
    message: str
    explanation: str
    notes: list[str]
    cells: list[PlanCell]
    max_context_in_budget: int | None = None
    max_context_unbounded: bool = False

    def to_json(self) -> dict:
        shared = {"explanation": self.explanation, "max_context_in_budget": self.max_context_in_budget,
                  "max_context_unbounded": self.max_context_unbounded}
        return {
            "name": self.name, "spec": self.spec, "status": self.status, "message": self.message,
            "notes": self.notes, **shared,
            "contexts": [{"context": cell.context, "cache_bytes": cell.cache_bytes,
                          "cache_bytes_by_layer_type": cell.cache_bytes_by_layer_type,
                          "cache_bytes_on_device": cell.cache_bytes_on_device, "weights_bytes": cell.weights_bytes,
                          "total_bytes": cell.total_bytes, "fits": cell.fits, "error": cell.error, **shared}
                         for cell in self.cells],
        }


@dataclass
class Plan:
    """The answer: `model` (name, origin, class, layers, layer groups, parameters, notes), the request's
    settings, and one `StrategyPlan` per strategy in request order."""

    model: dict
    settings: dict
    strategies: list[StrategyPlan]

    def to_json(self) -> dict:
        return {"model": self.model, "settings": self.settings,
                "strategies": [strategy.to_json() for strategy in self.strategies]}


@dataclass(frozen=True)
class PlanProgress:
    """One step of `plan_steps`: `done` of `total` strategies planned so far, `label` the step just done."""

    done: int
    total: int
    label: str


def plan_steps(request: PlanRequest) -> Iterator[PlanProgress | Plan]:
    """`plan` one step at a time: a `PlanProgress` once the model is probed and after each strategy, then the
    `Plan`. Closing the generator between two steps stops the plan; nothing more is measured.

    Raises:
        PlanError: as `plan`, before the first step is yielded.
    """
    from .catalog import ConfigError, resolve_config

    strategies = request.check()
    try:
        resolved = resolve_config(request.model)
        check_config(resolved.config)
        arch = describe_architecture(resolved.config, DTYPES[request.dtype])
    except (ConfigError, ProbeError) as err:
        raise PlanError(str(err)) from err
    widest = max([group.elements_per_token for group in arch.groups] + [1])
    if request.batch * widest * FAR_TOKENS >= MAX_ELEMENTS:
        raise PlanError(f"batch {request.batch:,} is too large to plan for this model "
                        f"(at most {MAX_ELEMENTS // (widest * FAR_TOKENS) - 1:,})")
    yield PlanProgress(0, len(strategies), f"probed {resolved.name}")
    planned = []
    for strategy, spec in zip(strategies, request.strategies):
        planned.append(_plan_strategy(arch, strategy, spec, request))
        yield PlanProgress(len(planned), len(strategies), planned[-1].name)
    yield Plan(_model_info(arch, resolved, request), _settings(request), planned)


def plan(request: PlanRequest) -> Plan:
    """Plan every strategy of `request` at every context (see the module docstring).

    Raises:
        PlanError: bad input, an unknown model (the message lists the catalog), a config over one of
            `kvlab.plan.config_limits`'s limits, or a config transformers cannot build. A strategy the model
            cannot use is not an error: its `StrategyPlan` has status `unavailable` or `error` and the reason.
    """
    *_, result = plan_steps(request)
    return result


def _model_info(arch: Architecture, resolved, request: PlanRequest) -> dict:
    notes = [resolved.notes] if resolved.notes else []
    limit = arch.max_position_embeddings
    if limit and max(request.contexts) > limit:
        notes.append(f"contexts above {limit:,} tokens exceed the model's max_position_embeddings "
                     f"(what it was trained for); the bytes are still what the cache would hold")
    return {
        "name": resolved.name, "origin": resolved.origin, "model_class": arch.model_class, "layers": arch.layers,
        "layer_groups": {group.label: group.count for group in arch.groups}, "parameters": arch.parameters,
        "max_position_embeddings": limit, "notes": notes,
    }


def _settings(request: PlanRequest) -> dict:
    return {"contexts": list(request.contexts), "batch": request.batch, "dtype": request.dtype,
            "budget_bytes": request.budget_bytes, "prefill_tokens": request.prefill_tokens}


def _spec_dict(spec, strategy) -> dict:
    return dict(spec) if isinstance(spec, dict) else {"strategy": strategy.name, **strategy.knobs()}


class _Totals:
    """Whole-model bytes of one strategy at a context: cache (all layers), on-device part, per layer type."""

    def __init__(self, arch: Architecture, strategy, request: PlanRequest):
        self.arch, self.strategy, self.request = arch, strategy, request
        self.measured, self.resident_sliding = _offload_equivalent(strategy)
        kept = meter_for(arch, self.measured, request.batch, DTYPES[request.dtype])
        self.meter, self.states = kept.meter, kept.states

    def prefill_for(self, context: int) -> int | None:
        prefill = self.request.prefill_tokens
        return None if prefill is None or prefill >= context else prefill

    def by_group(self, context: int) -> dict:
        """group -> bytes of all its layers at `context`. Raises StrategyError (too long) or MeasureError."""
        prefill = self.prefill_for(context)
        self.strategy.check_fits(prefill or context, context - (prefill or context))
        per_layer = dict(self.meter.group_bytes(context, prefill))
        per_layer.update(self.states)
        shared = self.meter.shared_bytes  # e.g. rotation quantization's tables: once per cache, not per layer
        return {group: sum(per_layer.get(part, 0) * part.count + shared.get(part, 0)
                           for part in self.meter.parts_of(group)) for group in self.arch.groups}

    def on_device(self, by_group: dict) -> int:
        if self.resident_sliding is None:
            return sum(by_group.values())
        resident = [group for group in by_group if group.is_linear
                    or (self.resident_sliding and group.layer_type in ("sliding_attention", "chunked_attention"))]
        moved = [group for group in by_group if group not in resident]
        largest = max((by_group[group] // group.count for group in moved), default=0)
        in_flight = min(OFFLOADED_RESIDENT_LAYERS, sum(group.count for group in moved))
        return sum(by_group[group] for group in resident) + in_flight * largest

    def fitting_bytes(self, context: int) -> int | None:
        """Weights + on-device cache at `context` (None when the strategy refuses that context)."""
        try:
            return self.arch.parameter_bytes + self.on_device(self.by_group(context))
        except StrategyError:
            return None


def _plan_strategy(arch: Architecture, strategy, spec, request: PlanRequest) -> StrategyPlan:
    name, spec_json = strategy.describe(), _spec_dict(spec, strategy)
    measured, _ = _offload_equivalent(strategy)
    reason = measured.unavailable_reason(arch.stand_in)
    failed = [PlanCell(context, arch.parameter_bytes) for context in request.contexts]
    if reason is not None:
        for cell in failed:
            cell.error = reason
        return StrategyPlan(name, spec_json, "unavailable", reason, f"unavailable: {reason}", [], failed)
    try:
        totals = _Totals(arch, strategy, request)
        cells = [_cell(totals, context, request.budget_bytes) for context in request.contexts]
        laws = {part: totals.meter.law(part) for group in totals.meter.groups for part in totals.meter.parts_of(group)}
        bound, unbounded = (None, False) if request.budget_bytes is None else _max_context(totals, laws, request)
    except MeasureError as err:
        message = f"{name}: {err}" if isinstance(err, PlanLimit) else f"{name} cannot serve this model: {err}"
        for cell in failed:
            cell.error = message
        return StrategyPlan(name, spec_json, "error", message, message, [], failed)
    errors = [cell.error for cell in cells if cell.error]
    status, message = ("ok", "") if len(errors) < len(cells) else ("error", errors[0])
    return StrategyPlan(name, spec_json, status, message, explain(strategy, arch, laws, totals.states),
                        strategy_notes(strategy, arch, totals, cells), cells, bound, unbounded)


def _cell(totals: _Totals, context: int, budget: int | None) -> PlanCell:
    cell = PlanCell(context, totals.arch.parameter_bytes)
    try:
        by_group = totals.by_group(context)
    except StrategyError as err:
        cell.error = str(err)
        return cell
    cell.cache_bytes = sum(by_group.values())
    cell.cache_bytes_by_layer_type = {group.label: size for group, size in by_group.items()}
    cell.cache_bytes_on_device = totals.on_device(by_group)
    if budget is not None:
        cell.fits = cell.weights_bytes + cell.cache_bytes_on_device <= budget
    return cell


def _max_context(totals: _Totals, laws: dict[object, GroupLaw], request: PlanRequest) -> tuple[int | None, bool]:
    """(longest context whose weights + on-device cache fit the budget at every step, unbounded?).

    Past the last knee the bytes grow (about) linearly: the measured slope over 2^20 tokens gives an
    estimate, kept when it fits and one token more does not, else refined by bisection around it."""
    budget = request.budget_bytes

    def fits(context: int) -> bool:
        needed = [totals.fitting_bytes(context)]
        peak = _previous_residual_peak(totals, context)
        if peak is not None:
            needed.append(totals.fitting_bytes(peak))
        return all(size is not None and size <= budget for size in needed)

    if not fits(1):
        return 0, False
    if fits(FAR_TOKENS):
        return None, True
    start = max([law.knee or 1 for law in laws.values()] + [1])
    low, high = 1, FAR_TOKENS
    if fits(start):
        span = 1 << 20
        base, ahead = totals.fitting_bytes(start), totals.fitting_bytes(start + span)
        if ahead is not None and ahead > base:
            guess = start + (budget - base) * span // (ahead - base)
            if fits(guess) and not fits(guess + 1):
                return guess, False  # exactly linear past the knees: the estimate is the answer
            low, high = _bracket(fits, start, guess)
    while low + 1 < high:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, False


def _bracket(fits, start: int, guess: int) -> tuple[int, int]:
    """(low, high) around `guess` with fits(low) and not fits(high), widening from 1024 tokens; fits(start) holds."""
    width = 1024
    low, high = max(start, guess - width), min(FAR_TOKENS, guess + width)
    while low > start and not fits(low):
        low, width = max(start, low - 2 * width), width * 2
    while high < FAR_TOKENS and fits(high):
        low, high, width = high, min(FAR_TOKENS, high + 2 * width), width * 2
    return low, high


def _previous_residual_peak(totals: _Totals, context: int) -> int | None:
    """The last earlier context at which a quantized residual was full (its bytes peak), under a decode schedule."""
    prefill = totals.prefill_for(context)
    residual = totals.meter.residual_length
    if prefill is None or not residual or residual < 2:
        return None
    decoded = context - prefill
    last = decoded - (decoded - (residual - 1)) % residual
    return prefill + last if 0 <= last < decoded else None


def gib(size: int | None) -> float | None:
    """Bytes as GiB (2^30 bytes), None stays None."""
    return None if size is None else size / GIB


def warm_up() -> None:
    """Pay a first plan's one-time costs now: imports, quanto's and hqq's first use, the sink cache's rotary
    set-up, transformers' cache and meta-device model code. Plans `WARM_UP_MODEL` once with every registered
    strategy that builds with its defaults, plus hqq and fp8, at two contexts under a budget (about 5 s on 2
    busy cores; a later plan of another model then takes well under a second).

    Raises:
        PlanError: the catalog entry cannot be planned.
    """
    from ..strategies import STRATEGIES

    specs = [{"strategy": name} for name in STRATEGIES]
    specs += [{"strategy": "quantized", "backend": "hqq"}, {"strategy": "quantized", "backend": "fp8"}]
    buildable = []
    for spec in specs:
        try:
            make_strategy(spec)
        except StrategyError:
            continue
        buildable.append(spec)
    for start in range(0, len(buildable), MAX_STRATEGIES):  # every spec, in requests of at most MAX_STRATEGIES
        plan(PlanRequest(model=WARM_UP_MODEL, contexts=(1024, 4096),
                         strategies=tuple(buildable[start:start + MAX_STRATEGIES]), budget_bytes=16 * GIB))
