"""What the serving engines (vLLM, SGLang, TensorRT-LLM, llama.cpp) offer for a KV cache, as kvlab maps its
strategies onto them: one engine's nearest setting (`ServingSetting`), the engines, and the pages and versions
each setting was checked against (`kvlab.engines.settings`), the engines' KV types chosen by bits
(`kvlab.engines.kv_types`), and copies of the engines' own lists of choices that a unit test holds every flag
value to (`kvlab.engines.choices`).

The strategies (`kvlab.strategies`, each class's `serving_settings()`) and the quantization backends
(`kvlab.caches.quant`, each backend's `serving()`) speak this vocabulary; nothing here runs an engine.
"""

from .settings import ENGINES, ServingSetting, no_equivalent

__all__ = ["ENGINES", "ServingSetting", "no_equivalent"]
