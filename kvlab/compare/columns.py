"""A comparison's columns: `Column` (a strategy, its per-column overrides and budget), the run modes and limits.

Weight-free: the preset schema (`kvlab.presets`), the planner's tab and the runner
import it; it builds strategies and budgets from specs and validates them. It
does not load models or run anything (running is `kvlab.compare.runner`'s job).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..budget import Budget, parse_budget, require_cache
from ..strategies import Strategy, StrategyError, make_strategy
from ..strategies.base import parse_strategy_item

MODES = ("fair", "parallel", "sequential")
"""How a comparison's columns share the machine (see `kvlab.compare.runner`)."""
MAX_COLUMNS = 8
COLUMN_KEYS = ("generation", "budget_mib", "fallback")
"""What a column spec may hold besides its strategy and knobs."""


@dataclass
class Column:
    """One column: a strategy, optional per-column generation overrides and an optional cache budget.

    A spec that cannot become a strategy (unknown name, bad knob) may still be a column: `strategy` is None,
    `rejected` says why and `title` names it; it reports that reason in its own row and runs nothing.
    """

    strategy: Strategy | None
    overrides: dict = field(default_factory=dict)
    rejected: str = ""
    title: str = ""
    budget: Budget | None = None

    @classmethod
    def from_spec(cls, spec: dict | Strategy | "Column") -> "Column":
        """`{"strategy": name, knobs..., "generation": {...}, "budget_mib": 4, "fallback": [...]}` -> Column.

        Raises:
            StrategyError: bad knobs, a bad budget or fallback chain, or a budget on a strategy without a cache.
        """
        if isinstance(spec, Column):
            return spec
        if isinstance(spec, Strategy):
            return cls(spec)
        spec = dict(spec)
        overrides = spec.pop("generation", None) or {}
        budget = parse_budget(spec.pop("budget_mib", None), spec.pop("fallback", None))
        try:
            strategy = make_strategy(spec)
        except StrategyError as err:
            if "unknown setting" not in str(err):
                raise
            raise StrategyError(f"{err}; a column also takes {', '.join(COLUMN_KEYS)}") from None
        return cls(strategy, dict(overrides), budget=require_cache(strategy, budget))

    @classmethod
    def or_rejected(cls, spec: dict, title: str = "") -> "Column":
        """`from_spec`, or a rejected column carrying the reason when the spec is invalid."""
        try:
            return cls.from_spec(spec)
        except StrategyError as err:
            return cls(None, rejected=str(err), title=title or str(spec.get("strategy", "?")))

    @classmethod
    def from_text(cls, item: str, fallback: str | None = None) -> "Column":
        """One column in compare syntax (`sink:window_length=64`, `snapkv:budget_mib=2`), or a rejected column
        titled `item` carrying the reason; a budgeted column falls back along `fallback` (compare syntax) unless
        it names its own chain."""
        try:
            spec = parse_strategy_item(item)
        except ValueError as err:
            return cls(None, rejected=str(err), title=item)
        if fallback and "budget_mib" in spec:
            spec.setdefault("fallback", fallback)
        return cls.or_rejected(spec, title=item)

    def describe(self) -> str:
        """The column's name: the strategy's `describe()`, plus the budget when there is one."""
        name = self.strategy.describe() if self.strategy is not None else self.title
        return f"{name} · {self.budget.describe()}" if self.budget is not None else name
