"""`quantized`: transformers' QuantizedCache (KIVI-style; Liu et al. 2024,
"KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache").

The newest `residual_length` tokens stay in full precision; older ones are
quantized per group of `q_group_size` channels (quanto, hqq) or per tensor (fp8).
A fresh cache is built for every run, so no backend setting leaks between runs
(`generate()` mutates a `cache_config` dict handed to it)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .base import Strategy, StrategyError, register, require_int, sliding_layer_types

BACKENDS = {
    "quanto": {"nbits": (2, 4), "default_nbits": 4, "axes": (0, -1), "package": "optimum.quanto", "pip": "optimum-quanto"},
    "hqq": {"nbits": (1, 2, 3, 4, 8), "default_nbits": 4, "axes": (0, 1), "package": "hqq", "pip": "hqq"},
    "fp8": {"nbits": (8,), "default_nbits": 8, "axes": (0,), "package": None, "pip": None},
}
DEFAULT_RESIDUAL_LENGTH = 128
DEFAULT_Q_GROUP_SIZE = 64


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@register
@dataclass
class Quantized(Strategy):
    """Knobs: `backend` (quanto | hqq | fp8), `nbits` (quanto 2/4, hqq 1/2/3/4/8,
    fp8 8), `residual_length` (recent tokens kept in full precision),
    `q_group_size` (channels per quantization group), `axis_key`/`axis_value`
    (quanto 0/-1, hqq 0/1). fp8 is per tensor: its group knobs are ignored."""

    name = "quantized"
    summary = ("Stores older keys/values in 2-8 bits, the newest residual_length tokens in full precision. "
               "Lossy; saves memory once the run outgrows residual_length, costs (de)quantization time.")
    lossy = True
    backend: str = "quanto"
    nbits: int | None = None
    residual_length: int = DEFAULT_RESIDUAL_LENGTH
    q_group_size: int = DEFAULT_Q_GROUP_SIZE
    axis_key: int = 0
    axis_value: int = 0

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise StrategyError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        rules = BACKENDS[self.backend]
        if self.nbits is None:
            self.nbits = rules["default_nbits"]
        if self.nbits not in rules["nbits"]:
            raise StrategyError(
                f"nbits={self.nbits!r} is not supported by the {self.backend} backend; allowed: {list(rules['nbits'])}"
            )
        if self.backend == "fp8":
            return
        require_int("residual_length", self.residual_length, 0)
        require_int("q_group_size", self.q_group_size, 1)
        for axis_name in ("axis_key", "axis_value"):
            if getattr(self, axis_name) not in rules["axes"]:
                raise StrategyError(
                    f"{axis_name}={getattr(self, axis_name)!r} is not supported by the {self.backend} backend; "
                    f"allowed: {list(rules['axes'])}"
                )

    def describe(self) -> str:
        if self.label:
            return self.label
        if self.backend == "fp8":
            return "quantized fp8"
        return f"quantized {self.backend} int{self.nbits} r{self.residual_length}"

    def caveat(self) -> str:
        if self.backend == "fp8":
            return "fp8: every token stored in 8 bits with one scale per tensor"
        return (f"the prompt is quantized at prefill; then up to residual_length={self.residual_length} new tokens "
                f"wait in full precision before being quantized, so a run generating fewer tokens than that "
                f"saves only on its prompt")

    def unavailable_reason(self, loaded) -> str | None:
        package = BACKENDS[self.backend]["package"]
        if package and not _installed(package):
            return f"the {self.backend} backend needs the `{BACKENDS[self.backend]['pip']}` package, which is not installed"
        sliding = sliding_layer_types(loaded)
        if sliding:
            return f"QuantizedCache supports full-attention models only, and this model has {', '.join(sliding)} layers"
        return None

    def _cache_kwargs(self) -> dict:
        if self.backend == "fp8":
            return {}
        return {
            "nbits": self.nbits,
            "residual_length": self.residual_length,
            "q_group_size": self.q_group_size,
            "axis_key": self.axis_key,
            "axis_value": self.axis_value,
        }

    def build_cache(self, loaded, max_total_tokens: int):
        """A fresh QuantizedCache.

        Raises:
            StrategyError: q_group_size does not divide the model's head_dim (the
                backends then fail mid-run with a shape error).
        """
        from transformers import QuantizedCache

        from ..models import head_dim

        width = head_dim(loaded.config.get_text_config(decoder=True))
        if self.backend != "fp8" and width % self.q_group_size:
            raise StrategyError(
                f"q_group_size={self.q_group_size} must divide this model's head_dim ({width}); "
                f"try {', '.join(str(g) for g in (16, 32, 64, 128) if width % g == 0)}"
            )

        return QuantizedCache(backend=self.backend, config=loaded.config, **self._cache_kwargs())

    def cache_code(self):
        args = "".join(f", {key}={value!r}" for key, value in self._cache_kwargs().items())
        return ["from transformers import QuantizedCache"], (
            f"cache = QuantizedCache(backend={self.backend!r}, config=model.config{args})"
        )
