"""`quantized`: transformers' QuantizedCache (KIVI-style; Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit
Quantization for KV Cache") with the backend the `backend` knob names.

The newest `residual_length` tokens stay in full precision; older ones are quantized per group of `q_group_size`
channels (quanto, hqq) or per tensor (fp8). Everything that depends on the backend (which knobs it takes, its
cache layer, its refusal reason, its snippet, its serving note) is the backend object's
(`kvlab.caches.quant`); this module holds the knobs and asks it. A fresh cache is built for every run.

transformers refuses `QuantizedCache` on a model with sliding-window layers; there the full-attention layers get
the backend's quantized layers and the sliding layers keep their window as transformers' default cache does
(`kvlab.caches.quant.transformers_layers.HybridQuantizedCache`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .base import Strategy, StrategyError, register

DEFAULT_RESIDUAL_LENGTH = 128
DEFAULT_Q_GROUP_SIZE = 64


@register
@dataclass
class Quantized(Strategy):
    """Knobs: `backend` (quanto | hqq | fp8, any backend of `kvlab.caches.quant` offered here), `nbits` (quanto
    2/4, hqq 1/2/3/4/8, fp8 8), `residual_length` (recent tokens kept in full precision), `q_group_size`
    (channels per quantization group), `axis_key`/`axis_value` (quanto 0/-1, hqq 0/1). fp8 is per tensor and
    takes none of the group knobs. A non-default axis is tried on the model's shapes before the run and refused
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
        from ..caches.quant import quantized_backend

        try:
            resolved = quantized_backend(self.backend).check_knobs(
                self.knobs(), {f.name: f.default for f in fields(self)})
        except ValueError as err:
            raise StrategyError(str(err)) from err
        self.nbits = resolved["nbits"]

    @property
    def quantizer(self):
        """The backend object the `backend` knob names (`kvlab.caches.quant.QuantBackend`)."""
        from ..caches.quant import quantized_backend

        return quantized_backend(self.backend)

    def title(self) -> str:
        return self.quantizer.title(self.knobs())

    def runtime_note(self) -> str:
        return self.quantizer.runtime_note()

    def caveat(self) -> str:
        return self.quantizer.caveat(self.knobs())

    @property
    def follows_layer_types(self) -> bool:
        """On a hybrid model its sliding layers keep their window."""
        return True

    def unavailable_reason(self, loaded) -> str | None:
        return self.quantizer.unavailable_reason(loaded.config, self.knobs())

    def build_cache(self, loaded, max_total_tokens: int):
        """A fresh QuantizedCache (on a model with sliding layers, `HybridQuantizedCache`: the full-attention
        layers quantized, the sliding ones as transformers keeps them). The first call per backend, knobs and
        model shape in a process also runs the backend once on small tensors (`QuantBackend.probe_reason`), so
        its one-time set-up is never timed.

        Raises:
            StrategyError: q_group_size does not divide the model's head_dim, or the backend fails on this
                model's shapes with these knobs (both would otherwise fail mid-run with a shape error).
        """
        backend, knobs = self.quantizer, self.knobs()
        problem = backend.group_size_reason(loaded.config, knobs)
        if problem:
            raise StrategyError(problem)
        backend.prepare()
        problem = backend.probe_reason(loaded.config, loaded.model.dtype, loaded.device, knobs)
        if problem:
            raise StrategyError(problem)
        return backend.build_cache(loaded.config, knobs)

    def warm_up_key(self) -> tuple:
        """The backend set-up depends on the backend and how it packs, not on `residual_length`."""
        return (type(self), self.backend, self.nbits, self.q_group_size, self.axis_key, self.axis_value)

    def warm_up(self, loaded, **kwargs) -> None:
        """The default warm-up with the backend's warm-up knobs (`residual_length` 1 for a group-wise backend),
        so its decode steps quantize and de-quantize as a run's do once its residual is full."""
        Strategy.warm_up(replace(self, **self.quantizer.warm_up_knobs(self.knobs())), loaded, **kwargs)

    def cache_code(self):
        """`QuantizedCache(...)` where every layer is full attention; transformers refuses it on a model with
        sliding layers, so the snippet then builds the same layers by hand."""
        return self.quantizer.cache_code(self.knobs())

    def serving_settings(self) -> list:
        """The backend's serving note for these knobs (`QuantBackend.serving`)."""
        return self.quantizer.serving(self.knobs())
