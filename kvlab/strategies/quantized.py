"""`quantized`: transformers' QuantizedCache (KIVI-style; Liu et al. 2024,
"KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache").

The newest `residual_length` tokens stay in full precision; older ones are
quantized per group of `q_group_size` channels (quanto, hqq) or per tensor (fp8).
A fresh cache is built for every run, so no backend setting leaks between runs
(`generate()` mutates a `cache_config` dict handed to it).

transformers refuses `QuantizedCache` on a model with sliding-window layers; there the
full-attention layers get the backend's quantized layers and the sliding layers keep
their window as transformers' default cache does (`kvlab.caches.hybrid`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
from dataclasses import dataclass, fields, replace

from .base import Strategy, StrategyError, register, require_int, sliding_layer_types

BACKENDS = {
    "quanto": {"nbits": (2, 4), "default_nbits": 4, "axes": (0, -1), "package": "optimum.quanto", "pip": "optimum-quanto"},
    "hqq": {"nbits": (1, 2, 3, 4, 8), "default_nbits": 4, "axes": (0, 1), "package": "hqq", "pip": "hqq"},
    "fp8": {"nbits": (8,), "default_nbits": 8, "axes": (0,), "package": None, "pip": None},
}
DEFAULT_RESIDUAL_LENGTH = 128
DEFAULT_Q_GROUP_SIZE = 64
GROUP_WISE_KNOBS = ("residual_length", "q_group_size", "axis_key", "axis_value")
"""Knobs of the group-wise backends (quanto, hqq); fp8 quantizes per tensor and takes none of them."""
PROBE_TOKENS = (1, 2, 3, 5, 17, 64, 129)
"""Token counts a non-default axis is tried on before a run: the backends' bit-packing fails on some
lengths and not others, so one length proves nothing."""

_probed: dict[tuple, str | None] = {}
_probe_lock = threading.Lock()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def backend_version(backend: str) -> str:
    """The package behind `backend` and its installed version, e.g. `optimum-quanto 0.2.7` (fp8: transformers)."""
    pip = BACKENDS[backend]["pip"] or "transformers"
    try:
        return f"{pip} {importlib.metadata.version(pip)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{pip} not installed"


@register
@dataclass
class Quantized(Strategy):
    """Knobs: `backend` (quanto | hqq | fp8), `nbits` (quanto 2/4, hqq 1/2/3/4/8,
    fp8 8), `residual_length` (recent tokens kept in full precision),
    `q_group_size` (channels per quantization group), `axis_key`/`axis_value`
    (quanto 0/-1, hqq 0/1). fp8 is per tensor and takes none of the group knobs.
    A non-default axis is tried on the model's shapes before the run and refused
    with the backend's error when it fails."""

    name = "quantized"
    summary = ("Stores older keys/values in 2-8 bits, the newest residual_length tokens in full precision. "
               "Lossy; saves memory once the run outgrows residual_length, costs (de)quantization time.")
    lossy = True
    title_knobs = ("backend", "nbits", "residual_length")
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
            raise StrategyError(f"nbits={self.nbits!r} is not supported by the {self.backend} backend "
                                f"({backend_version(self.backend)}); allowed: {list(rules['nbits'])}")
        if self.backend == "fp8":
            defaults = {f.name: f.default for f in fields(self)}
            changed = [name for name in GROUP_WISE_KNOBS if getattr(self, name) != defaults[name]]
            if changed:
                raise StrategyError(f"the fp8 backend quantizes per tensor and takes no {', '.join(changed)}; "
                                    "use the quanto or hqq backend to quantize group-wise")
            return
        require_int("residual_length", self.residual_length, 0)
        require_int("q_group_size", self.q_group_size, 1)
        for axis_name in ("axis_key", "axis_value"):
            if getattr(self, axis_name) not in rules["axes"]:
                raise StrategyError(
                    f"{axis_name}={getattr(self, axis_name)!r} is not supported by the {self.backend} backend "
                    f"({backend_version(self.backend)}); allowed: {list(rules['axes'])}"
                )

    def title(self) -> str:
        if self.backend == "fp8":
            return "quantized fp8"
        return f"quantized {self.backend} int{self.nbits} r{self.residual_length}"

    def runtime_note(self) -> str:
        from ..caches.backends import prepare_quanto

        return (prepare_quanto(build=False) or "") if self.backend == "quanto" else ""

    def caveat(self) -> str:
        if self.backend == "fp8":
            return "fp8: every token stored in 8 bits with one scale per tensor"
        return (f"the prompt is quantized at prefill; then up to residual_length={self.residual_length} new tokens "
                f"wait in full precision before being quantized, so a run generating fewer tokens than that "
                f"saves only on its prompt")

    @property
    def follows_layer_types(self) -> bool:
        """On a hybrid model its sliding layers keep their window (`kvlab.caches.hybrid`)."""
        return True

    def unavailable_reason(self, loaded) -> str | None:
        from ..caches.hybrid import FULL_ATTENTION, layer_types_of

        package = BACKENDS[self.backend]["package"]
        if package and not _installed(package):
            return f"the {self.backend} backend needs the `{BACKENDS[self.backend]['pip']}` package, which is not installed"
        if FULL_ATTENTION not in layer_types_of(loaded.config):
            return (f"this model has no full-attention layers to quantize (all its layers are "
                    f"{', '.join(sliding_layer_types(loaded))})")
        return self._group_size_reason(loaded)

    def _group_size_reason(self, loaded) -> str | None:
        """Why `q_group_size` cannot group this model's head_dim, or None (fp8 has no groups)."""
        from ..caches.hybrid import head_dim_of

        width = head_dim_of(loaded.config)
        if self.backend == "fp8" or width is None or width % self.q_group_size == 0:
            return None
        return (f"q_group_size={self.q_group_size} must divide this model's head_dim ({width}); "
                f"try {', '.join(str(g) for g in (16, 32, 64, 128) if width % g == 0)}")

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
        """A fresh QuantizedCache (on a model with sliding layers, `kvlab.caches.hybrid.HybridQuantizedCache`: the
        full-attention layers quantized, the sliding ones as transformers keeps them). The first call per backend, knobs and model shape in a process also runs the
        backend once on small tensors (`_try_on_model_shapes`), so its one-time set-up is never timed.

        Raises:
            StrategyError: q_group_size does not divide the model's head_dim, or the backend fails on this
                model's shapes with these knobs (both would otherwise fail mid-run with a shape error).
        """
        from transformers import QuantizedCache

        from ..caches.hybrid import HybridQuantizedCache

        problem = self._group_size_reason(loaded)
        if problem:
            raise StrategyError(problem)
        if self.backend == "quanto":
            from ..caches.backends import prepare_quanto

            prepare_quanto(build=False)
        problem = self._try_on_model_shapes(loaded)
        if problem:
            raise StrategyError(problem)
        if sliding_layer_types(loaded):
            return HybridQuantizedCache(self.backend, loaded.config, **self._cache_kwargs())
        return QuantizedCache(backend=self.backend, config=loaded.config, **self._cache_kwargs())

    def _try_on_model_shapes(self, loaded) -> str | None:
        """Quantize, flush and de-quantize keys/values of this model's shape, dtype and device with these knobs,
        once per process: the backend's one-time set-up (imports, kernel loading, first-call dispatch) happens
        here, outside any timed step. A non-default axis is tried at every PROBE_TOKENS length (the backends'
        bit-packing fails on some lengths only). Returns the backend's error as a sentence, or None."""
        import torch

        from ..caches.hybrid import backend_layer_class
        from ..models.loading import head_dim

        cfg = loaded.config.get_text_config(decoder=True)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        shape = (kv_heads, head_dim(cfg))
        dtype, device = loaded.model.dtype, torch.device(loaded.device)
        if device.type == "meta":
            return None  # shapes only (the planner): nothing runs, nothing to set up or check
        key = (self.backend, self.nbits, self.q_group_size, self.axis_key, self.axis_value, shape, dtype, str(device))
        lengths = PROBE_TOKENS if (self.axis_key, self.axis_value) != (0, 0) else PROBE_TOKENS[-1:]
        with _probe_lock:
            if key in _probed:
                return _probed[key]
            _probed[key] = None
            knobs = self._cache_kwargs() if self.backend == "fp8" else {**self._cache_kwargs(), "residual_length": 1}
            for tokens in lengths:
                layer = backend_layer_class(self.backend)(**knobs)
                try:
                    for step in (tokens, 1, 1):
                        states = torch.randn(1, kv_heads, step, shape[1], dtype=dtype, device=device)
                        layer.update(states, states.clone())
                except Exception as err:  # noqa: BLE001 - any backend failure is the answer
                    _probed[key] = (
                        f"the {self.backend} backend ({backend_version(self.backend)}) fails with "
                        f"axis_key={self.axis_key}, axis_value={self.axis_value}, nbits={self.nbits} on this "
                        f"model's keys ({kv_heads} KV heads x {shape[1]} dims, {tokens} tokens: "
                        f"{type(err).__name__}: {str(err).splitlines()[0][:120]}); use axis_key=0 and axis_value=0")
                    break
            return _probed[key]

    def warm_up_key(self) -> tuple:
        """The backend set-up depends on the backend and how it packs, not on `residual_length`."""
        return (type(self), self.backend, self.nbits, self.q_group_size, self.axis_key, self.axis_value)

    def warm_up(self, loaded, **kwargs) -> None:
        """The default warm-up with `residual_length` 1 (quanto, hqq), so its decode steps quantize and
        de-quantize as a run's do once its residual is full."""
        strategy = self if self.backend == "fp8" else replace(self, residual_length=1)
        Strategy.warm_up(strategy, loaded, **kwargs)

    def cache_code(self):
        """`QuantizedCache(...)` where every layer is full attention; transformers refuses it on a model with
        sliding layers, so the snippet then builds the same layers by hand (`kvlab.caches.hybrid`)."""
        from ..caches.hybrid import backend_layer_class

        layer = backend_layer_class(self.backend).__name__
        args = "".join(f", {key}={value!r}" for key, value in self._cache_kwargs().items())
        layer_args = ", ".join(f"{key}={value!r}" for key, value in self._cache_kwargs().items())
        return (["from transformers import Cache, DynamicCache, QuantizedCache",
                 f"from transformers.cache_utils import {layer}, get_layer_types_and_kwargs"],
                f"layer_types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))\n"
                f"if set(layer_types) == {{\"full_attention\"}}:\n"
                f"    cache = QuantizedCache(backend={self.backend!r}, config=model.config{args})\n"
                f"else:  # transformers refuses QuantizedCache here: quantize the full-attention layers, keep the "
                f"sliding ones' window\n"
                f"    cache = Cache(layers=[{layer}({layer_args}) if kind == \"full_attention\" else layer\n"
                f"                          for kind, layer in zip(layer_types, DynamicCache(config=model.config).layers)])")
