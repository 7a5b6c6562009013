"""The contract of a quantization backend (`QuantBackend`) and what most backends share.

A backend is one object registered by name (`kvlab.caches.quant.registry`). It owns what kvlab knows about one
way of storing keys and values in fewer bits:
- its knobs and their checks (`check_knobs`; messages list the allowed values) and how a column with them reads
  (`title`, `caveat`, `runtime_note`, `warm_up_knobs`);
- its cache layer for a model (`layer_factory`), the cache built from it (`build_cache`, after `prepare` and
  `probe_reason`) and the code that builds the same (`cache_code`);
- why it cannot serve a model here (`unavailable_reason`: a missing package, a head_dim its groups cannot split,
  a model without full-attention layers; a hybrid model's sliding layers keep their window);
- the `quantize=` values of the eviction strategies it answers to (`parse_quantize`, `quantize_choices`,
  `describe_quantize`, `quantize_unavailable_reason`, `quantize_layer_factory`, `quantize_code`);
- its exact byte layout: `layer_parts` (the packed data, scales/zero points/shifts, the full-precision residual
  and the rest, as `kvlab.accounting` counts them), `held_tokens`, `residual_tokens` and `quantized_shape`
  (Inspect), `residual_length`, `packing_period_elements` and `shared_tensors` (the planner's meter);
- its version string (`version`) and its serving note (`serving`: the nearest vLLM / SGLang / TensorRT-LLM /
  llama.cpp setting, `kvlab.engines.ServingSetting`s).

The `quantized` strategy's knobs are `nbits`, `residual_length`, `q_group_size`, `axis_key` and `axis_value`; a
backend says which it takes (`nbits`, `takes`, `axes`); one it does not take must stay at its default. The layout defaults read a layer by transformers'
`QuantizedLayer` contract (`_quantized_keys`/`_quantized_values` hold the quantized states, `keys`/`values`
the full-precision residual, `residual_length` tokens flushed at once); a backend whose layer keeps other fields
overrides them. Checks raise ValueError (the strategies turn it into their StrategyError). Nothing here runs a
model or chooses a strategy.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

import torch

GROUP_WISE_KNOBS = ("residual_length", "q_group_size", "axis_key", "axis_value")
"""The `quantized` strategy's knobs a group-wise backend takes and a per-tensor one refuses."""
QUANTIZE_GROUP_SIZE = 64
"""`q_group_size` of the group-wise layers the `quantize=` knob makes (transformers' default)."""
QUANTIZED_ATTRIBUTES = ("_quantized_keys", "_quantized_values")
"""Where transformers' quantized layers (`QuantizedLayer`) keep their quantized states."""
PERIOD_ELEMENTS_PER_GROUP = 40
"""Packing period of quantized tensors in elements, per `q_group_size` value (lcm of 8/nbits per byte and 10 per
32-bit word, hqq's 3-bit packing)."""

_INNER_NAMES: dict[type, list[str] | None] = {}
"""Inner tensor names per tensor subclass (`__tensor_flatten__` rebuilds size strings each call)."""


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def check_int(name: str, value, low: int) -> None:
    """Raise ValueError unless `value` is an integer >= `low`, naming the allowed range."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def inner_tensor_names(tensor: torch.Tensor) -> list[str] | None:
    """The inner tensors' attribute names of a tensor subclass (quanto's packed tensors), None for a plain one."""
    kind = type(tensor)
    if kind not in _INNER_NAMES:
        plain = kind in (torch.Tensor, torch.nn.Parameter) or not hasattr(tensor, "__tensor_flatten__")
        _INNER_NAMES[kind] = None if plain else list(tensor.__tensor_flatten__()[0])
    return _INNER_NAMES[kind]


def four_dim(value) -> torch.Tensor | None:
    """`value` when it is a (batch, kv_heads, seq, head_dim) tensor, else None."""
    return value if isinstance(value, torch.Tensor) and value.dim() == 4 else None


@dataclass(frozen=True)
class QuantBackend:
    """One quantization backend (see the module docstring for what it owns).

    Fields: `name` (the registry key and `quantized:backend=` value), `pip` (the PyPI package it needs, None:
    transformers alone), `package` (its import name, checked before a run), `in_quantized` (offered by the
    `quantized` strategy; rotation has its own), `nbits` and `default_nbits` (bits per value it takes),
    `takes` (which of GROUP_WISE_KNOBS it takes: all four for a group-wise backend, none for fp8, which
    quantizes `granularity`, per tensor), `axes` (`axis_key`/`axis_value` values it takes).
    """

    name: str
    pip: str | None = None
    package: str | None = None
    in_quantized: bool = True
    nbits: tuple[int, ...] = ()
    default_nbits: int | None = None
    axes: tuple[int, ...] = (0,)
    takes: tuple[str, ...] = GROUP_WISE_KNOBS
    granularity: str = "group-wise"

    @property
    def group_wise(self) -> bool:
        """It quantizes groups of `q_group_size` channels."""
        return "q_group_size" in self.takes

    # ----- identity -----

    def version(self) -> str:
        """The package behind the backend and its installed version, e.g. `optimum-quanto 0.2.7`."""
        pip = self.pip or "transformers"
        try:
            return f"{pip} {importlib.metadata.version(pip)}"
        except importlib.metadata.PackageNotFoundError:
            return f"{pip} not installed"

    def missing_package(self) -> bool:
        """Its package is needed and not installed."""
        return bool(self.package) and not installed(self.package)

    # ----- the `quantized` strategy's knobs -----

    def check_knobs(self, knobs: dict, defaults: dict) -> dict:
        """Check the `quantized` strategy's `knobs` (its fields; `defaults` their defaults) for this backend and
        return the resolved ones it changes (`nbits` when None).

        Raises:
            ValueError: a knob value the backend does not take (the message lists the allowed values).
        """
        nbits = self.default_nbits if knobs.get("nbits") is None else knobs["nbits"]
        if nbits not in self.nbits:
            raise ValueError(f"nbits={nbits!r} is not supported by the {self.name} backend ({self.version()}); "
                             f"allowed: {list(self.nbits)}")
        changed = [name for name in GROUP_WISE_KNOBS if name not in self.takes and knobs[name] != defaults[name]]
        if changed:
            from .registry import BACKENDS

            others = " or ".join(b.name for b in BACKENDS.values() if b.in_quantized and b.group_wise)
            raise ValueError(f"the {self.name} backend quantizes {self.granularity} and takes no "
                             f"{', '.join(changed)}; use the {others} backend to quantize group-wise")
        for name, low in (("residual_length", 0), ("q_group_size", 1)):
            if name in self.takes:
                check_int(name, knobs[name], low)
        for axis_name in ("axis_key", "axis_value"):
            if axis_name in self.takes and knobs[axis_name] not in self.axes:
                raise ValueError(f"{axis_name}={knobs[axis_name]!r} is not supported by the {self.name} backend "
                                 f"({self.version()}); allowed: {list(self.axes)}")
        return {"nbits": nbits}

    def layer_kwargs(self, knobs: dict) -> dict:
        """The keyword arguments its layer class takes for these (checked) knobs: `nbits` and the knobs it takes
        (none for a backend that takes none, as fp8's layer)."""
        if not self.takes:
            return {}
        return {"nbits": knobs["nbits"], **{name: knobs[name] for name in self.takes}}

    def title(self, knobs: dict) -> str:
        """The column's short name: `quantized quanto int4 r128` (`quantized fp8` without a residual)."""
        if "residual_length" not in self.takes:
            return f"quantized {self.name}"
        return f"quantized {self.name} int{knobs['nbits']} r{knobs['residual_length']}"

    def caveat(self, knobs: dict) -> str:
        """What to keep in mind reading a column with these knobs (its full-precision residual, when it has one)."""
        if "residual_length" not in self.takes:
            return ""
        return (f"the prompt is quantized at prefill; then up to residual_length={knobs['residual_length']} new "
                f"tokens wait in full precision before being quantized, so a run generating fewer tokens than that "
                f"saves only on its prompt")

    def runtime_note(self) -> str:
        """One sentence on how this process runs the backend when that differs from the usual, else ''."""
        return ""

    def warm_up_knobs(self, knobs: dict) -> dict:
        """Knobs changed for the warm-up run: residual 1, so its decode steps quantize as a run's do."""
        return {"residual_length": 1} if "residual_length" in self.takes else {}

    # ----- refusal -----

    def unavailable_reason(self, config, knobs: dict) -> str | None:
        """Why the backend cannot quantize `config`'s model with `knobs` here, or None: its package is missing,
        the model has no full-attention layer (a hybrid model's sliding layers keep their window), or
        `q_group_size` does not divide head_dim."""
        from ..hybrid import FULL_ATTENTION, layer_types_of, non_full_layer_types

        if self.missing_package():
            return f"the {self.name} backend needs the `{self.pip}` package, which is not installed"
        if FULL_ATTENTION not in layer_types_of(config):
            return (f"this model has no full-attention layers to quantize (all its layers are "
                    f"{', '.join(non_full_layer_types(config))})")
        return self.group_size_reason(config, knobs)

    def group_size_reason(self, config, knobs: dict) -> str | None:
        """Why `q_group_size` cannot group this model's head_dim, or None (a per-tensor backend has no groups)."""
        from ..hybrid import head_dim_of

        width = head_dim_of(config)
        if not self.group_wise or width is None or width % knobs["q_group_size"] == 0:
            return None
        return (f"q_group_size={knobs['q_group_size']} must divide this model's head_dim ({width}); "
                f"try {', '.join(str(g) for g in (16, 32, 64, 128) if width % g == 0)}")

    def probe_reason(self, config, dtype, device, knobs: dict) -> str | None:
        """The backend's error on this model's key shapes, dtype and device with these knobs, as a sentence, or
        None; see `kvlab.caches.quant.probe`."""
        from .probe import probe_reason

        return probe_reason(self, config, dtype, device, knobs)

    # ----- layers and caches -----

    def layer_classes(self) -> tuple[type, ...]:
        """The cache layer classes this backend makes (`owns` matches them and their subclasses)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """One-time preparation before its layers are made (e.g. loading a kernel); nothing by default."""

    def make_layer(self, **kwargs):
        """A fresh layer of its class with `kwargs` (`layer_kwargs`)."""
        return self.layer_classes()[0](**kwargs)

    def layer_factory(self, config, knobs: dict):
        """A function returning a fresh quantized layer for `config`'s model with these checked knobs."""
        kwargs = self.layer_kwargs(knobs)
        return lambda: self.make_layer(**kwargs)

    def build_cache(self, config, knobs: dict):
        """A fresh cache for `config`'s model: its full-attention layers this backend's, the others what
        `DynamicCache(config=config)` makes them (`kvlab.caches.hybrid.quantize_full_layers`)."""
        from transformers.cache_utils import Cache

        from ..hybrid import quantize_full_layers

        self.prepare()
        return Cache(layers=quantize_full_layers(config, self.layer_factory(config, knobs)))

    def cache_code(self, knobs: dict) -> tuple[list[str], str]:
        """(imports, code building a variable `cache` with these knobs) for the reproduce-it snippet."""
        raise NotImplementedError

    # ----- the `quantize=` knob of the eviction strategies -----

    def quantize_choices(self) -> str:
        """The `quantize=` values it answers to, for messages: `quanto2, quanto4`."""
        return ", ".join(f"{self.name}{bits}" for bits in self.nbits)

    def parse_quantize(self, text: str) -> dict | None:
        """Layer knobs for a `quantize=` value it answers to (`quanto4` -> {"nbits": 4}), else None."""
        rest = text[len(self.name):] if text.startswith(self.name) else None
        return {"nbits": int(rest)} if rest in {str(bits) for bits in self.nbits} else None

    def describe_quantize(self, knobs: dict) -> str:
        """The quantized part of an eviction column's name: `quanto int4`."""
        return f"{self.name} int{knobs['nbits']}"

    def quantize_unavailable_reason(self, value: str, knobs: dict, config) -> str | None:
        """Why `quantize=value` cannot hold this model's keys, or None (its package; groups of
        QUANTIZE_GROUP_SIZE channels must divide head_dim)."""
        from ..hybrid import head_dim_of

        if self.missing_package():
            return f"quantize={value} needs the `{self.package}` package, which is not installed"
        width = head_dim_of(config)
        if self.group_wise and width is not None and width % QUANTIZE_GROUP_SIZE:
            return (f"quantize={value} groups {QUANTIZE_GROUP_SIZE} channels, which does not divide this model's "
                    f"head_dim ({width})")
        return None

    def quantize_layer_kwargs(self, knobs: dict, residual_length: int) -> dict:
        """Its layer's keyword arguments for `quantize=` knobs with the eviction strategy's `residual_length` (and
        QUANTIZE_GROUP_SIZE for a group-wise backend)."""
        if not self.takes:
            return {}
        group = {"q_group_size": QUANTIZE_GROUP_SIZE} if self.group_wise else {}
        return {**knobs, **group, **({"residual_length": residual_length} if "residual_length" in self.takes else {})}

    def quantize_layer_factory(self, knobs: dict, config, residual_length: int):
        """A function returning a fresh layer that holds what an eviction kept (`kvlab.eviction.cache`)."""
        self.prepare()
        kwargs = self.quantize_layer_kwargs(knobs, residual_length)
        return lambda: self.make_layer(**kwargs)

    def quantize_code(self, knobs: dict, residual_length: int) -> tuple[list[str], str, str]:
        """(imports, lines to run first or '', the `quantized_layer=` expression making its layer) for an eviction
        column's snippet."""
        raise NotImplementedError

    # ----- byte layout -----

    def owns(self, layer) -> bool:
        """Whether `layer` is one of this backend's layers."""
        return isinstance(layer, self.layer_classes())

    def holds_quantized(self, layer) -> bool:
        """Whether `layer` holds quantized states now (a layer made but not yet written holds none)."""
        return any(getattr(layer, name, None) is not None for name in QUANTIZED_ATTRIBUTES)

    def split_state(self, state) -> tuple[list, list]:
        """(packed data, scales/zero points/shifts) of one quantized state: a tensor subclass's inner tensors
        by name (`_data` is packed), a tuple's first item as packed and the rest (a meta dict, a scale) as
        scales, a plain tensor as packed."""
        if isinstance(state, torch.Tensor):
            names = inner_tensor_names(state)
            if names is None:
                return [state], []
            return ([getattr(state, n) for n in names if "data" in n],
                    [getattr(state, n) for n in names if "data" not in n])
        if isinstance(state, (tuple, list)) and state:
            packed, scales = self.split_state(state[0])
            return packed, scales + list(state[1:])
        return [], [state]

    def layer_parts(self, layer) -> dict[str, list]:
        """What each of the layer's attributes is, by `kvlab.accounting.LAYER_PARTS` name: `packed` and
        `scales` (its quantized states, `split_state`), `residual` (full-precision keys/values beside them;
        `keys_values` while nothing is quantized yet), `other` (anything else, e.g. a length counter)."""
        parts: dict[str, list] = {"keys_values": [], "packed": [], "scales": [], "residual": [], "other": []}
        quantized = self.holds_quantized(layer)
        for name, value in vars(layer).items():
            if name in QUANTIZED_ATTRIBUTES:
                packed, scales = self.split_state(value)
                parts["packed"] += packed
                parts["scales"] += scales
            elif name in ("keys", "values"):
                parts["residual" if quantized else "keys_values"].append(value)
            else:
                parts["other"].append(value)
        return parts

    def held_tokens(self, layer) -> int:
        """Tokens whose keys/values a layer holding quantized states holds: quantized and residual."""
        return int(layer.get_seq_length())

    def residual_tokens(self, layer) -> int:
        """Tokens in the layer's full-precision residual (the newest ones)."""
        residual = four_dim(getattr(layer, "keys", None))
        return residual.shape[-2] if residual is not None else 0

    def quantized_shape(self, layer) -> tuple[int, ...] | None:
        """The (batch, kv_heads, seq, head_dim) its quantized keys stand for, None before any is quantized."""
        state = getattr(layer, "_quantized_keys", None)
        if state is None:
            return None
        if isinstance(state, (tuple, list)) and not hasattr(state, "shape"):
            state = state[0]
        return tuple(state.shape)

    def residual_length(self, layer) -> int | None:
        """Tokens its full-precision residual gathers before they are quantized together (None: no residual)."""
        return getattr(layer, "residual_length", None)

    def packing_period_elements(self, layer) -> int:
        """Elements after which a quantized tensor's packed size repeats (the planner extrapolates by it)."""
        return PERIOD_ELEMENTS_PER_GROUP * getattr(layer, "q_group_size", 1)

    def shared_tensors(self, layer):
        """Tensors the layer shares with the cache's other layers (counted once per cache), or None."""
        return None

    # ----- serving -----

    def serving(self, knobs: dict) -> list:
        """The nearest setting per serving engine (`kvlab.engines.ServingSetting`s, one per engine) for these
        knobs (the `quantized` strategy's, or the layer knobs of a `quantize=` value)."""
        raise NotImplementedError
