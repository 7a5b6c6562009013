"""What transformers' own quantized-cache backends (quanto, hqq, fp8) share: `TransformersBackend`, and
`HybridQuantizedCache` for models transformers' `QuantizedCache` refuses.

transformers' `QuantizedCache(backend=..., config=...)` (KIVI-style; Liu et al. 2024, "KIVI: A Tuning-Free
Asymmetric 2bit Quantization for KV Cache") keeps the newest `residual_length` tokens in full precision and
quantizes older ones per group of `q_group_size` channels (quanto, hqq) or per tensor (fp8). It refuses any model
whose `config.layer_types` holds anything but full attention (`cache_utils.QuantizedCache.__init__`), so Gemma
2/3, gpt-oss and other hybrid models get `HybridQuantizedCache`: the backend's layers in place of the
full-attention ones, the sliding layers as transformers' default cache keeps them. On a model whose layers are all
full attention that holds the same layers, and the same bytes, as `QuantizedCache`. A fresh cache is built for
every run, so no setting leaks between runs (`generate()` mutates a `cache_config` dict handed to it).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.cache_utils import Cache

from ...engines import ServingSetting
from ...engines.kv_types import engine_settings, fewer_bits_note, llama_setting, llama_type
from ...engines.settings import MEASURED_LLAMACPP
from ..hybrid import quantize_full_layers
from .base import QuantBackend
from .registry import get_backend


@dataclass(frozen=True)
class TransformersBackend(QuantBackend):
    """A backend of transformers' `QuantizedCache`; `layer_name` is its layer class in `transformers.cache_utils`
    (e.g. `QuantoQuantizedLayer`)."""

    layer_name: str = ""

    def layer_classes(self) -> tuple[type, ...]:
        import transformers.cache_utils as cache_utils

        return (getattr(cache_utils, self.layer_name),)

    def build_cache(self, config, knobs: dict):
        """transformers' `QuantizedCache` where every layer is full attention, else `HybridQuantizedCache`."""
        from transformers import QuantizedCache

        from ..hybrid import non_full_layer_types

        self.prepare()
        if non_full_layer_types(config):
            return HybridQuantizedCache(self.name, config, **self.layer_kwargs(knobs))
        return QuantizedCache(backend=self.name, config=config, **self.layer_kwargs(knobs))

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        """`QuantizedCache(...)` where every layer is full attention; transformers refuses it on a model with
        sliding layers, so the snippet then builds the same layers by hand (as `HybridQuantizedCache` does)."""
        layer = self.layer_name
        kwargs = self.layer_kwargs(knobs)
        args = "".join(f", {key}={value!r}" for key, value in kwargs.items())
        layer_args = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
        return (["from transformers import Cache, DynamicCache, QuantizedCache",
                 f"from transformers.cache_utils import {layer}, get_layer_types_and_kwargs"],
                f"layer_types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))\n"
                f"if set(layer_types) == {{\"full_attention\"}}:\n"
                f"    cache = QuantizedCache(backend={self.name!r}, config=model.config{args})\n"
                f"else:  # transformers refuses QuantizedCache here: quantize the full-attention layers, keep the "
                f"sliding ones' window\n"
                f"    cache = Cache(layers=[{layer}({layer_args}) if kind == \"full_attention\" else layer\n"
                f"                          for kind, layer in zip(layer_types, DynamicCache(config=model.config).layers)])")

    def quantize_code(self, knobs: dict, residual_length: int) -> tuple[list[str], str, str]:
        args = ", ".join(f"{key}={value}" for key, value in self.quantize_layer_kwargs(knobs, residual_length).items())
        return [f"from transformers.cache_utils import {self.layer_name}"], "", f"lambda: {self.layer_name}({args})"

    def serving(self, knobs: dict) -> list[ServingSetting]:
        """Integer groups of `nbits` bits: vLLM's integer per-token-head type of as many bits (int4 for 4 or fewer,
        int8 for 8), SGLang's and TensorRT-LLM's 4-bit float type (nvfp4) or fp8, llama.cpp's q4_0 / q8_0 (groups
        of 32 with one scale each)."""
        nbits = int(knobs.get("nbits") or self.default_nbits)
        what = f"{self.name}'s {nbits}-bit integers in groups of {knobs.get('q_group_size', 64)} with a scale and zero point"
        llama = llama_type(nbits)
        llama_bits = 8 if llama == "q8_0" else 4
        return [*engine_settings(nbits, what),
                llama_setting(llama, llama, f"{fewer_bits_note(nbits, llama_bits)}integers in blocks of 32 with one "
                                            "fp16 scale each (no zero point), Hadamard-rotated when head_dim % 64 == 0; "
                                            "kvlab runs this format as llamacpp_quantized",
                              MEASURED_LLAMACPP if llama == "q4_0" else "")]


class HybridQuantizedCache(Cache):
    """transformers' `QuantizedCache` for any model: its full-attention layers are the backend's quantized layers
    (`QuantoQuantizedLayer`, `HQQQuantizedLayer`, `Fp8QuantizedLayer`, built with `layer_kwargs`: `nbits`,
    `axis_key`, `axis_value`, `q_group_size`, `residual_length`; none for fp8), the other layers are what
    `DynamicCache(config=config)` gives them (a sliding layer keeps its window).

    Raises:
        ValueError: an unknown backend, or a model without full-attention layers.
    """

    def __init__(self, backend: str, config, **layer_kwargs):
        try:
            made = get_backend(backend)
        except KeyError as err:
            raise ValueError(str(err.args[0])) from err
        super().__init__(layers=quantize_full_layers(config, lambda: made.make_layer(**layer_kwargs)))
