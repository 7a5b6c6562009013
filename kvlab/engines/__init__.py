"""What the serving engines (vLLM, SGLang, TensorRT-LLM, llama.cpp) offer for a KV cache, as kvlab maps its
strategies onto them: one engine's nearest setting (`ServingSetting`), the engines, and the pages and versions
each setting was checked against (`kvlab.engines.settings`).

The strategies (`kvlab.strategies`, each class's `serving_settings()`) and the quantization backends
(`kvlab.caches.quant`, each backend's `serving()`) speak this vocabulary; nothing here runs an engine.
"""

from .settings import ENGINES, ServingSetting, no_equivalent

__all__ = ["ENGINES", "ServingSetting", "no_equivalent"]
