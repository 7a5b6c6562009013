"""Cache strategies, one module each, and their registry `STRATEGIES` (in display order); the engine columns
(`engine_column`) and theirs, `ENGINE_COLUMNS`."""

from . import no_cache, dynamic, static, offloaded, quantized, rotation_quantized, vllm_kv_cache  # noqa: F401,I001  (registration order)
from . import llamacpp_quantized, sliding_window, sink  # noqa: F401,I001
from . import snapkv, pyramidkv, tova, observed_attention, knorm, expected_attention, random_eviction  # noqa: F401,I001
from . import triattention  # noqa: F401,I001
from . import engine_llamacpp, engine_openai  # noqa: F401,I001  (the engine columns, apart from STRATEGIES)
from .base import ENGINE_COLUMNS, STRATEGIES, Strategy, StrategyError, make_strategy, register

__all__ = ["ENGINE_COLUMNS", "STRATEGIES", "Strategy", "StrategyError", "make_strategy", "register"]
