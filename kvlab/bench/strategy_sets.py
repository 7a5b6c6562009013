"""Which cache strategies the bench measures: the default sets, `--strategies`, and finding a role in a set.

A set maps a label (the name printed in tables and plots) to a spec for
`kvlab.strategies.make_strategy`. The defaults keep their short labels
(`quantized int4`, `sink 4+252`); `--strategies` (the syntax of `python -m kvlab
compare --strategies`) replaces the overhead, fair and scaling sets, labelled by
each strategy's `describe()`. Checks that need a particular kind of strategy
(no_cache, dynamic, sink, quantized int4) look it up with `find`, by what the
strategy is rather than by its label. This module resolves specs; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Callable

SINK_SPEC = {"strategy": "sink", "window_length": 256, "num_sink_tokens": 4}
QUANTIZED_INT4 = {"strategy": "quantized", "backend": "quanto", "nbits": 4}
OVERHEAD_STRATEGIES = {
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": QUANTIZED_INT4,
}
FAIR_STRATEGIES = {
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": QUANTIZED_INT4,
    "sink 4+252": SINK_SPEC,
}
SCALING_STRATEGIES = {
    "no_cache": {"strategy": "no_cache"},
    "dynamic": {"strategy": "dynamic"},
    "static": {"strategy": "static"},
    "quantized int4": QUANTIZED_INT4,
    "quantized int2": {"strategy": "quantized", "backend": "quanto", "nbits": 2},
    "sink 4+252": SINK_SPEC,
}
REPLACED_SECTIONS = ("overhead", "fair", "scaling")
"""The sections whose strategy set `--strategies` replaces."""


def parse_strategies(text: str) -> dict[str, dict]:
    """label -> spec from `--strategies` text such as `dynamic,quantized:backend=hqq:nbits=4`.

    Each spec is resolved through the registry (`make_strategy`), so unknown names
    and bad knobs fail here, before anything is measured; labels are
    `describe()`, with ` #2`, ` #3`... added to repeats of the same label.

    Raises:
        ValueError: empty text, a knob not written as key=value, or a `StrategyError`
            (unknown strategy or knob, invalid value; the message lists the allowed ones).
    """
    from ..strategies import make_strategy
    from ..strategies.base import parse_strategy_list

    specs = parse_strategy_list(text)
    if not specs:
        raise ValueError("--strategies is empty: name at least one, e.g. dynamic,static")
    lineup: dict[str, dict] = {}
    for spec in specs:
        label = make_strategy(spec).describe()
        unique, count = label, 1
        while unique in lineup:
            count += 1
            unique = f"{label} #{count}"
        lineup[unique] = spec
    return lineup


def split_available(loaded, lineup: dict[str, dict]) -> tuple[dict[str, dict], list[dict]]:
    """(the strategies of `lineup` that can run on `loaded` here, [{strategy, reason}] for the others)."""
    from ..strategies import make_strategy

    usable, skipped = {}, []
    for label, spec in lineup.items():
        reason = make_strategy(spec).unavailable_reason(loaded)
        if reason:
            skipped.append({"strategy": label, "reason": reason})
        else:
            usable[label] = spec
    return usable, skipped


def usable_lineup(ctx, default: dict[str, dict], section: str) -> tuple[dict[str, dict], list[dict]]:
    """The section's strategies (`--strategies` or `default`) that can run here, and the skipped ones.

    Raises:
        RuntimeError: none of them can run here (the message gives each reason).
    """
    usable, skipped = split_available(ctx.loaded, ctx.lineup(default))
    for entry in skipped:
        ctx.say(f"{section}: skipping {entry['strategy']}: {entry['reason']}")
    if not usable:
        reasons = "; ".join(f"{s['strategy']}: {s['reason']}" for s in skipped)
        raise RuntimeError(f"no strategy of this section can run here ({reasons})")
    return usable, skipped


def is_no_cache(strategy) -> bool:
    return not strategy.use_cache


def is_dynamic(strategy) -> bool:
    return strategy.name == "dynamic"


def is_sink(strategy) -> bool:
    return strategy.name == "sink"


def is_quantized_int4(strategy) -> bool:
    """A `quantized` column at 4 bits per value, of any backend (a per-tensor backend such as fp8 takes 8 only)."""
    return strategy.name == "quantized" and strategy.nbits == 4


def find(lineup: dict[str, dict], role: Callable[[object], bool]):
    """(label, strategy) of the first strategy in `lineup` for which `role(strategy)` holds, or (None, None)."""
    from ..strategies import make_strategy

    for label, spec in lineup.items():
        strategy = make_strategy(spec)
        if role(strategy):
            return label, strategy
    return None, None
