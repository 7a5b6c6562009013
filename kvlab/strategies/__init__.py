"""Cache strategies, one module each, and their registry `STRATEGIES` (in display order)."""

from . import no_cache, dynamic, static, offloaded, quantized, rotation_quantized, vllm_kv_cache  # noqa: F401,I001  (registration order)
from . import llamacpp_quantized, sliding_window, sink  # noqa: F401,I001
from . import snapkv, pyramidkv, tova, observed_attention, knorm, expected_attention, random_eviction  # noqa: F401,I001
from . import triattention  # noqa: F401,I001
from .base import STRATEGIES, Strategy, StrategyError, make_strategy, register

__all__ = ["STRATEGIES", "Strategy", "StrategyError", "make_strategy", "register"]
