"""A run's columns: `Column` (a strategy, its per-column overrides and budget) and `parse_columns`, the one place
the rules on how many columns a run takes, which are picked twice and which are rejected live.

Every wing that runs columns (Compare, Needle, the quality report and its Perplexity view) reads its columns
through `parse_columns`, passing its own limit and options; a front (the page, the command line, the MCP
tools) hands the text or items it was given straight to its wing. Weight-free: builds strategies and budgets
from specs and validates them; it loads no model and runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .budget import Budget, parse_budget, require_cache
from .strategies import Strategy, StrategyError, make_strategy
from .strategies.base import parse_strategy_item, split_strategy_list

MAX_COLUMNS = 8
"""Most columns a Compare or Needle run takes (the page's eight cards)."""
COLUMN_KEYS = ("generation", "budget_mib", "fallback")
"""What a column spec may hold besides its strategy and knobs."""
TWICE = "{name!r} is picked twice: give each column different knobs"


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
    def or_rejected(cls, spec: dict | Strategy | "Column", title: str = "") -> "Column":
        """`from_spec`, or a rejected column carrying the reason when the spec is invalid."""
        try:
            return cls.from_spec(spec)
        except StrategyError as err:
            return cls(None, rejected=str(err), title=title or str(spec.get("strategy", "?")))

    @classmethod
    def from_text(cls, item: str, fallback: str | None = None,
                  prepare: Callable[[dict], dict] | None = None) -> "Column":
        """One column in compare syntax (`sink:window_length=64`, `snapkv:budget_mib=2`), or a rejected column
        titled `item` carrying the reason; a budgeted column falls back along `fallback` (compare syntax) unless
        it names its own chain; `prepare` may rewrite the parsed spec first (a wing's aliases and defaults)."""
        try:
            spec = parse_strategy_item(item)
        except ValueError as err:
            return cls(None, rejected=str(err), title=item)
        if fallback and "budget_mib" in spec:
            spec.setdefault("fallback", fallback)
        return cls.or_rejected(prepare(spec) if prepare else spec, title=item)

    def describe(self) -> str:
        """The column's name: the strategy's `describe()`, plus the budget when there is one."""
        name = self.strategy.describe() if self.strategy is not None else self.title
        return f"{name} · {self.budget.describe()}" if self.budget is not None else name


def parse_columns(source, limit: int, *, empty: str = "pick at least one column", counted: str = "",
                  fallback: str | None = None, prepare: Callable[[dict], dict] | None = None,
                  unique: bool = False, budget_refusal: str = "", check: Callable[[Strategy], str] | None = None,
                  strict: bool = False) -> list[Column]:
    """A run's columns from a comma list in compare syntax (`dynamic,sink:window_length=64`) or a list of such
    items, spec dicts, `Strategy`s or `Column`s, in order.

    A column that cannot run becomes a rejected column carrying its reason (`Column.rejected`), reported in its
    own place while the others run: a bad item, and, when the wing asks, a second column of the same name
    (`unique`), a column with a cache budget (`budget_refusal`, the wing's reason) or one `check` refuses
    (`check(strategy)` returns the reason, '' when it may run).

    Args:
        limit: most columns the wing runs.
        empty: the one line for no column at all; counted: what the count includes, said after "columns" in
            the message for too many (e.g. " (sweeps included)").
        fallback: the chain a budgeted text item falls back along when it names none (compare syntax).
        prepare: rewrites each spec dict before it becomes a strategy (a wing's aliases and default knobs).
        strict: raise the first column that cannot run instead of keeping it rejected (a `Column` given already
            rejected stays: its front chose to report it in its own place).

    Raises:
        ValueError: no columns, or more than `limit` (before any item is parsed).
        StrategyError: with `strict`, the first column that cannot run.
    """
    items = split_strategy_list(source) if isinstance(source, str) else list(source or [])
    if not items:
        raise ValueError(empty)
    if len(items) > limit:
        raise ValueError(f"at most {limit} columns{counted}, got {len(items)}")
    columns, seen = [], set()
    for item in items:
        column = _column(item, fallback, prepare)
        name = column.describe()
        reason = _refusal(column, name in seen and unique, budget_refusal, check) if column.strategy else ""
        if strict and (reason or (column.rejected and not isinstance(item, Column))):
            raise StrategyError(reason or column.rejected)
        if reason:
            column = Column(None, rejected=reason, title=name)
        seen.add(name)
        columns.append(column)
    return columns


def _column(item, fallback: str | None, prepare: Callable[[dict], dict] | None) -> Column:
    if isinstance(item, str):
        return Column.from_text(item, fallback, prepare)
    if isinstance(item, dict):
        return Column.or_rejected(prepare(dict(item)) if prepare else item)
    return Column.or_rejected(item)


def _refusal(column: Column, twice: bool, budget_refusal: str, check) -> str:
    """Why a column that parsed may not run in this wing ('' when it may)."""
    if budget_refusal and column.budget is not None:
        return budget_refusal
    if twice:
        return TWICE.format(name=column.describe())
    return check(column.strategy) if check is not None else ""
