"""Cache strategies, one module each, and their registry `STRATEGIES`."""

from . import dynamic, no_cache, offloaded, quantized, sliding_window, static  # noqa: F401  (registration)
from .base import STRATEGIES, Strategy, StrategyError, make_strategy, register

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "make_strategy", "register"]
