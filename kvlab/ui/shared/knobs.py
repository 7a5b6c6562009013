"""The strategy-card form every tab shares: a strategy name plus one text field per knob.

The fields come from the strategy dataclasses themselves (`knob_defaults`), so
a newly registered strategy gets its card in Compare, Chat and Perplexity with
no UI code. Text in a field is read as a YAML scalar (`4`, `true`, `hqq`); an
empty field keeps the dataclass default. `strategy_choices(loaded, capability)`
lists the registry's names that have a capability (`usable_in_chat`, ...),
marking those that cannot run on the loaded model. `card_form` says what a card
shows for a strategy (about text, knob fields, status, and the column's cache
budget and fallback chain, see `kvlab.budget`) as plain property dicts the tab
modules hand to gradio; `column_budget` reads the last two back.

Pure: no gradio, no model loading.
"""

from __future__ import annotations

import dataclasses
import inspect

from kvlab.budget import Budget, format_chain, parse_budget, parse_chain
from kvlab.strategies import ENGINE_COLUMNS, STRATEGIES, Strategy, StrategyError, make_strategy
from kvlab.strategies.base import names_with
from kvlab.strategies.knob_yaml import load_knob_value

from .markup import md_text
from .theme import status_html
from ..hosting.zerogpu import hidden_knobs

NO_STRATEGY = "(none)"
BUDGET_PLACEHOLDER = "none"
FALLBACK_PLACEHOLDER = "default: quantized hqq int4 > sink"
BUDGET_HELP = "cache budget (MiB)"
FALLBACK_HELP = "fallback chain (items joined by >)"
UNAVAILABLE_MARK = "  ⊘ unavailable here"
"""Appended to a strategy's label in a dropdown when it cannot run on the loaded model."""


def column_class(name: str) -> type[Strategy] | None:
    """The registered strategy or engine column (`ENGINE_COLUMNS`, Compare's only) named `name`, or None."""
    return STRATEGIES.get(name) or ENGINE_COLUMNS.get(name)


def compare_names() -> list[str]:
    """What a Compare card offers: every registered strategy, then the engine columns."""
    return [*STRATEGIES, *ENGINE_COLUMNS]


def knob_defaults(strategy_name: str) -> dict:
    """Knob name -> default for a registered strategy or engine column, in field order (`label` is not a knob,
    and knobs hidden here, such as static's `compile` on ZeroGPU, are left out: the strategy then keeps their
    default).

    Raises:
        KeyError: no strategy or engine column has that name.
    """
    hidden = hidden_knobs().get(strategy_name, frozenset())
    defaults = {}
    cls = column_class(strategy_name)
    if cls is None:
        raise KeyError(strategy_name)
    for f in dataclasses.fields(cls):
        if f.name == "label" or f.name in hidden:
            continue
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
        else:
            defaults[f.name] = None
    return defaults


def max_knobs(names: list[str] | None = None) -> int:
    """The most knobs any of `names` (default: every registered strategy and engine column) has: how many fields a
    card needs."""
    return max((len(knob_defaults(name)) for name in (compare_names() if names is None else names)), default=0)


def knob_text(value) -> str:
    """A knob value as a form field shows it: None -> '', booleans lower case."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_knob(text, default):
    """A knob field's text -> value: empty keeps the default, else YAML scalars (`4`, `true`, `hqq`) read by
    `load_knob_value` (no anchors or aliases, length capped); text it refuses stays text, for the strategy's own
    check to refuse in its column."""
    if text is None or not str(text).strip():
        return default
    try:
        return load_knob_value("", str(text).strip())
    except ValueError:
        return str(text).strip()


def column_spec(strategy_name: str, knob_texts: list[str]) -> dict:
    """`{"strategy": name, knob: value, ...}` from a card's strategy and its knob fields (in field order).

    Only knobs that differ from their defaults are written, so specs stay short.
    """
    spec = {"strategy": strategy_name}
    for (name, default), text in zip(knob_defaults(strategy_name).items(), knob_texts):
        value = parse_knob(text, default)
        if value != default:
            spec[name] = value
    return spec


def strategy_from_card(name: str, knob_texts: list[str], allowed: list[str] | None = None) -> Strategy:
    """The strategy a card describes.

    Args:
        name: the picked strategy; knob_texts: its knob fields, in field order.
        allowed: the names this card offers (default: every registered strategy and engine column).

    Raises:
        StrategyError: nothing picked, a name not offered, or an invalid knob (the message lists allowed values).
    """
    allowed = compare_names() if allowed is None else allowed
    if not name or name == NO_STRATEGY or name not in allowed or column_class(name) is None:
        raise StrategyError(f"unknown strategy {name!r}; allowed: {', '.join(allowed)}")
    return make_strategy(column_spec(name, knob_texts))


def plan_columns(slots: list[tuple[str, list[str]]]) -> tuple[list[tuple[int, Strategy]], dict[int, str]]:
    """Validate Compare's column slots.

    Args:
        slots: per slot, (strategy name or NO_STRATEGY, knob field texts).

    Returns:
        ([(slot, Strategy), ...] for the valid picked slots, {slot: error message} for invalid ones).
    """
    valid, errors = [], {}
    for slot, (name, knob_texts) in enumerate(slots):
        if not name or name == NO_STRATEGY:
            continue
        try:
            valid.append((slot, strategy_from_card(name, knob_texts)))
        except StrategyError as err:
            errors[slot] = str(err)
    return valid, errors


def strategy_help(name: str) -> str:
    """The strategy's one-line summary (Markdown); its knob notes (class docstring), when it has some, behind an
    info toggle (`<details>`, closed) so a card shows its knobs first."""
    cls = column_class(name)
    doc = inspect.getdoc(cls) or ""
    generated = doc.startswith(cls.__name__ + "(")
    if generated or not doc:
        return cls.summary
    return f"{cls.summary}\n\n<details class=\"kv-more\"><summary>about the knobs</summary>\n\n{' '.join(doc.split())}\n\n</details>"


def availability(loaded, names: list[str] | None = None) -> dict[str, str | None]:
    """Strategy name -> why it cannot run on `loaded` here (None = it can), with default knobs; a recurrent model's
    reasons are `kvlab.recurrent.runner.recurrent_refusal`'s."""
    from kvlab.recurrent.runner import recurrent_refusal

    reasons = {}
    for name in STRATEGIES if names is None else names:
        try:
            strategy = make_strategy({"strategy": name})
        except StrategyError:
            reasons[name] = None  # its defaults need a knob set; the column reports the problem when it runs
            continue
        recurrent = getattr(loaded, "is_recurrent", False)
        reasons[name] = recurrent_refusal(strategy) if recurrent else strategy.unavailable_reason(loaded)
    return reasons


def strategy_names(capability: str | None = None, engines: bool = False) -> list[str]:
    """Registered names in registry order; with `capability`, only those whose default instance has it; with
    `engines`, the engine columns after them (Compare's cards)."""
    names = list(STRATEGIES) if capability is None else names_with(capability)
    return names + list(ENGINE_COLUMNS) if engines else names


def strategy_choices(loaded, capability: str | None = None, none_choice: bool = True,
                     engines: bool = False) -> list[tuple[str, str]]:
    """(label, value) pairs for a strategy dropdown; names that cannot run on `loaded` are marked.

    Args:
        loaded: the loaded model, or None when none is loaded yet (nothing is marked).
        capability: list only names with it (e.g. `usable_in_chat`); None lists every registered name.
        none_choice: start with NO_STRATEGY (an empty Compare column).
        engines: list the engine columns too (Compare's cards).
    """
    names = strategy_names(capability, engines)
    reasons = availability(loaded, names) if loaded is not None else {}
    choices = [(NO_STRATEGY, NO_STRATEGY)] if none_choice else []
    choices += [(name + UNAVAILABLE_MARK if reasons.get(name) else name, name) for name in names]
    return choices


def card_form(name: str, knobs: dict, loaded, knob_count: int) -> dict:
    """What a card shows for strategy `name`: property dicts for `about`, `knobs` (one per field), `status`, `text`.

    Args:
        knobs: knob values to show instead of the defaults (e.g. a preset's).
        loaded: the loaded model (marks an unavailable strategy), or None.
        knob_count: how many knob fields the card has; the ones `name` does not need are hidden.
    """
    cls = column_class(name) if name != NO_STRATEGY else None
    if cls is None:
        about = "Pick a strategy to add a column." if name == NO_STRATEGY else md_text(f"unknown strategy {name!r}")
        return {
            "about": {"value": about, "visible": True},
            "knobs": [{"value": "", "label": "", "visible": False} for _ in range(knob_count)],
            "status": {"value": "", "visible": False},
            "text": {"value": "", "visible": False},
            "budget": {"value": "", "visible": False},
            "fallback": {"value": "", "visible": False},
        }
    reason = availability(loaded, [name]).get(name) if loaded is not None else None
    about = strategy_help(name) + (f"\n\n**⊘ unavailable here:** {reason}" if reason else "")
    defaults = list(knob_defaults(name).items())
    fields = []
    for j in range(knob_count):
        if j < len(defaults):
            knob, default = defaults[j]
            fields.append({"value": knob_text(knobs.get(knob, default)), "label": knob, "visible": True,
                           "placeholder": "auto" if default is None else knob_text(default)})
        else:
            fields.append({"value": "", "label": "", "visible": False})
    return {
        "about": {"value": about, "visible": True},
        "knobs": fields,
        "status": {"value": status_html(name, "unavailable" if reason else "ready", "", reason or ""), "visible": True},
        "text": {"value": "", "visible": True},
        "budget": {"value": knob_text(knobs.get("budget_mib")), "visible": _takes_budget(cls)},
        "fallback": {"value": fallback_text(knobs.get("fallback")), "visible": _takes_budget(cls)},
    }


def _takes_budget(cls: type[Strategy]) -> bool:
    """A card offers a cache budget to a strategy that keeps a cache (not to an engine column: its engine keeps
    its own)."""
    return cls.use_cache and not cls.engine_name


def fallback_text(fallback) -> str:
    """A preset's `fallback:` (a list of specs, or a string) as the card's field shows it: `a > b`; a value
    that does not parse is shown as it is, so the run reports the problem."""
    if fallback is None:
        return ""
    try:
        return format_chain(parse_chain(fallback))
    except StrategyError:
        return str(fallback)


def column_budget(budget_text, fallback_text_value) -> Budget | None:
    """The `Budget` of a card's two budget fields (empty: none).

    Raises:
        StrategyError: a budget that is not a positive number, or a bad chain (the message says what to fix).
    """
    budget = parse_knob(budget_text, None)
    chain = (fallback_text_value or "").strip() or None
    return parse_budget(budget, chain)


def knob_index(strategy_name: str, knob: str) -> int:
    """Position of `knob` among `strategy_name`'s knob fields.

    Raises:
        KeyError: the strategy has no such knob.
    """
    names = list(knob_defaults(strategy_name))
    if knob not in names:
        raise KeyError(f"{strategy_name} has no knob {knob!r}; its knobs: {names}")
    return names.index(knob)
