"""The planner's measurements, kept per model and strategy, so a later plan of the same model reads them back.

A plan measures each strategy's real cache on the model's meta-device stand-in (`kvlab.plan.meter`). What one
`StrategyMeter` measured (one layer per group at each context it was asked for, its growth laws, the
states of recurrent layers) depends only on the model's config, the strategy (its class and every knob), the
batch and the dtype. `meter_for` keeps one meter per such key, so a second plan of that model and strategy
reuses every figure already measured and measures only contexts it has not seen (a new context list, a budget
search's new points): every figure is still measured, never derived from a formula. At most
`MEASUREMENTS_KEPT` keys are kept; the least recently used goes first. A failed measurement is not kept.

Plans run one at a time on kvlab's compute thread (`kvlab.compute`); the lock only keeps the table whole.
This module keeps measurements; it does not measure or plan.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .meter import StrategyMeter, linear_state_bytes
from .probe import Architecture, config_key

MEASUREMENTS_KEPT = 256
"""(model, strategy, batch, dtype) measurements kept at once: the whole catalog under the Plan tab's six opening
cards and as many again; a few KiB each (figures and the probe's meta-device stand-in, no tensor data)."""


@dataclass
class Measured:
    """What a plan needs of one strategy on one model: its `meter` (which remembers every context it measured)
    and `states`, bytes of one layer of each recurrent/convolution group (`linear_state_bytes`)."""

    meter: StrategyMeter
    states: dict


_kept: "OrderedDict[tuple, Measured]" = OrderedDict()
_lock = threading.Lock()
_counts = {"hits": 0, "misses": 0}


def strategy_key(strategy) -> tuple:
    """What identifies a strategy's cache: its class and every knob (the label aside), so two strategies that
    differ in any knob, or a subclass, never share measurements."""
    knobs = sorted((name, repr(value)) for name, value in strategy.knobs().items())
    return type(strategy).__module__, type(strategy).__qualname__, tuple(knobs)


def measurement_key(arch: Architecture, strategy, batch: int, dtype: torch.dtype) -> tuple:
    """The key `meter_for` keeps a measurement under: the model's whole config (`Architecture.key`, as given),
    the strategy, batch and dtype."""
    return arch.key or config_key(arch.config), strategy_key(strategy), batch, str(dtype)


def meter_for(arch: Architecture, strategy, batch: int, dtype: torch.dtype) -> Measured:
    """The kept `Measured` of `strategy` on `arch` at `batch` and `dtype`, made (and the states measured) on the
    first call for that key.

    Raises:
        MeasureError: the recurrent states cannot be measured under this strategy (nothing is kept).
    """
    key = measurement_key(arch, strategy, batch, dtype)
    with _lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
            _counts["hits"] += 1
            return found
        _counts["misses"] += 1
    made = Measured(StrategyMeter(arch, strategy, batch, dtype), linear_state_bytes(arch, strategy, batch, dtype))
    with _lock:
        _kept[key] = made
        while len(_kept) > MEASUREMENTS_KEPT:
            _kept.popitem(last=False)
    return made


def cache_info() -> dict:
    """{hits, misses, kept}: how often `meter_for` found a kept measurement, made a new one, and how many it
    keeps now."""
    with _lock:
        return {**_counts, "kept": len(_kept)}


def forget_all() -> None:
    """Drop every kept measurement and reset the counts (tests; a deployer never needs it)."""
    with _lock:
        _kept.clear()
        _counts.update(hits=0, misses=0)
