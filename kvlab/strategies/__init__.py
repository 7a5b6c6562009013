"""Cache strategies, one module each, and their registry `STRATEGIES` (in display order)."""

from . import no_cache, dynamic, static, offloaded, quantized, sliding_window, sink  # noqa: F401,I001  (registration order)
from .base import STRATEGIES, Strategy, StrategyError, make_strategy, register

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "make_strategy", "register"]
