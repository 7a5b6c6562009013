"""A model's architecture as the cache planner needs it, found without weights.

From a transformers config this module finds:

- the layer groups: layers with the same cache layer type and settings
  (transformers' own `get_layer_types_and_kwargs`, the table `DynamicCache(config=...)`
  and `StaticCache` dispatch on), with how many layers each has;
- what one attention layer of each group writes to `Cache.update`: the per-token
  shapes of its keys and values. A shrunk copy of the config, one layer per group
  and everything else unchanged, is built on the meta device and run for a few
  tokens with a recording cache, so the shapes are the model's own (grouped-query
  heads, head_dim, the compressed latent of multi-head latent attention);
- the full-size model on the meta device: its parameters (tied embeddings counted
  once), and a stand-in for `kvlab.models.LoadedModel` that strategies build their
  caches from (its rotary embedding is rebuilt on the CPU for the sink cache).

Nothing is allocated at full size and no weights are read. This module probes;
measuring bytes is `kvlab.plan.meter`'s job.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

PROBE_TOKENS = 3
"""Tokens fed through the shrunk model to record what each layer writes to its cache."""

LINEAR_LAYER_TYPES = ("conv", "linear_attention", "hybrid", "hybrid_sliding")
"""transformers' cache layer types that hold recurrent or convolution states instead of (or beside) keys and values."""

WINDOW_KWARGS = ("sliding_window",)


class ProbeError(RuntimeError):
    """The model cannot be built or probed from its config; the message says why."""


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one cache layer type and its settings.

    layer_type: transformers' name (`full_attention`, `sliding_attention`,
    `chunked_attention`, `linear_attention`, `dummy`, ...). window: the sliding
    window or attention chunk, tokens (None for none). indices: the layers' indices
    in the full model. key_shape, value_shape: (heads, width) of what one layer
    writes per token and batch row with `Cache.update` (None for layers that never
    call it).
    """

    layer_type: str
    window: int | None
    indices: tuple[int, ...]
    key_shape: tuple[int, int] | None = None
    value_shape: tuple[int, int] | None = None

    @property
    def count(self) -> int:
        return len(self.indices)

    @property
    def label(self) -> str:
        """Name used in plans and JSON, e.g. `sliding_attention (window 1024)`."""
        return self.layer_type if self.window is None else f"{self.layer_type} (window {self.window})"

    @property
    def is_linear(self) -> bool:
        """Holds recurrent/convolution states (a state-space or linear-attention layer)."""
        return self.layer_type in LINEAR_LAYER_TYPES

    @property
    def elements_per_token(self) -> int:
        """Key + value elements one token adds per batch row and layer (0 without keys/values)."""
        if self.key_shape is None or self.value_shape is None:
            return 0
        return self.key_shape[0] * self.key_shape[1] + self.value_shape[0] * self.value_shape[1]


@dataclass
class StandIn:
    """What `Strategy.build_cache(loaded, ...)` reads of a loaded model: `config`, `model`, `device`."""

    config: object
    model: object
    device: torch.device = field(default_factory=lambda: torch.device("meta"))


@dataclass
class Architecture:
    """A model as the planner sees it.

    groups: the layer groups, in order of their first layer. layers: decoder layers
    in all. parameters: parameter count of the full model (tied embeddings once).
    parameter_bytes: bytes of those parameters at the dtype asked for. stand_in: a
    meta-device stand-in for `LoadedModel`. model_class: the class
    `AutoModelForCausalLM` builds. max_position_embeddings: the model's trained
    context, tokens (None when the config has none). key: `config_key` of the config as given, read
    before anything was built from it (building a model writes fields such as its dtype into the config): what
    the probes, and the planner's kept measurements (`kvlab.plan.measured`), are cached under.
    """

    config: object
    groups: list[LayerGroup]
    layers: int
    parameters: int
    parameter_bytes: int
    stand_in: StandIn
    model_class: str
    max_position_embeddings: int | None
    key: str = ""


def config_key(config) -> str:
    """A string identifying a config's content (for caching probes)."""
    return config.to_json_string(use_diff=False)


def layer_groups(config) -> list[LayerGroup]:
    """The config's layer groups (no shapes yet), from transformers' `get_layer_types_and_kwargs`.

    Raises:
        ProbeError: the config has no decoder layers.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    if not getattr(text, "num_hidden_layers", None):
        raise ProbeError("the config has no num_hidden_layers: not a decoder language model")
    types, kwargs = get_layer_types_and_kwargs(text)
    found: dict[tuple, list[int]] = {}
    for index, (layer_type, settings) in enumerate(zip(types, kwargs)):
        window = next((settings[name] for name in WINDOW_KWARGS if name in settings), None)
        found.setdefault((layer_type, window), []).append(index)
    return [LayerGroup(layer_type, window, tuple(indices)) for (layer_type, window), indices in found.items()]


def shrunk_config(config, groups: list[LayerGroup]):
    """A copy of `config` with one decoder layer per group (in group order), everything else unchanged."""
    shrunk = copy.deepcopy(config)
    text = shrunk.get_text_config(decoder=True)
    original = getattr(config.get_text_config(decoder=True), "layer_types", None)
    text.num_hidden_layers = len(groups)
    if original is not None:
        try:
            text.layer_types = [original[group.indices[0]] for group in groups]
        except AttributeError:
            pass  # derived from other fields (a read-only property), so it follows num_hidden_layers
    return shrunk


class _RecordingCache:
    """Wraps a cache and records the first (keys, values) shapes each layer writes with `update`."""

    def __init__(self, cache):
        self.cache = cache
        self.shapes: dict[int, tuple[torch.Size, torch.Size]] = {}
        self._update = cache.update
        cache.update = self.update

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.shapes.setdefault(layer_idx, (key_states.shape, value_states.shape))
        return self._update(key_states, value_states, layer_idx, *args, **kwargs)


def meta_model(config, dtype: torch.dtype):
    """`AutoModelForCausalLM.from_config(config)` built on the meta device (no memory for weights).

    Raises:
        ProbeError: transformers cannot build a causal LM from this config.
    """
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as err:
        raise ProbeError(f"transformers cannot build this model from its config: {err}") from err


def probe_shapes(config, groups: list[LayerGroup]) -> list[LayerGroup]:
    """`groups` with the per-token key/value shapes each group's layers write, measured on the meta device.

    The shrunk model runs in bfloat16 (MoE kernels on the meta device need it);
    shapes do not depend on the dtype.

    Raises:
        ProbeError: the forward fails, or a layer writes tensors not laid out
            (batch, heads, tokens, width).
    """
    from transformers import DynamicCache

    probed = [group for group in groups if group.layer_type != "dummy"]
    shrunk = shrunk_config(config, probed)
    model = meta_model(shrunk, torch.bfloat16)
    recorder = _RecordingCache(DynamicCache(config=shrunk))
    ids = torch.ones((1, PROBE_TOKENS), dtype=torch.long, device="meta")
    try:
        with torch.inference_mode():
            model(input_ids=ids, cache=recorder.cache, use_cache=True, logits_to_keep=1)
    except Exception as err:  # noqa: BLE001 - any model's forward; the reason is reported
        raise ProbeError(f"the shrunk model's forward failed on the meta device: {type(err).__name__}: {err}") from err
    shaped = []
    for position, group in enumerate(probed):
        if position not in recorder.shapes:
            shaped.append(group)
            continue
        keys, values = recorder.shapes[position]
        for name, shape in (("keys", keys), ("values", values)):
            if len(shape) != 4 or shape[0] != 1 or shape[2] != PROBE_TOKENS:
                raise ProbeError(f"layer type {group.layer_type} writes {name} of shape {tuple(shape)}, "
                                 f"not (batch, heads, tokens, width)")
        shaped.append(LayerGroup(group.layer_type, group.window, group.indices,
                                 (keys[1], keys[3]), (values[1], values[3])))
    dummies = [group for group in groups if group.layer_type == "dummy"]
    return sorted(shaped + dummies, key=lambda group: group.indices[0])


def _cpu_rotary(model) -> None:
    """Rebuild the decoder's rotary embedding on the CPU so `SinkCache.from_model` can read its `inv_freq`."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "config"):
        return
    try:
        with torch.device("cpu"):
            decoder.rotary_emb = type(rotary)(config=rotary.config)
    except (TypeError, ValueError, KeyError):
        return


_CACHE_SIZE = 32
"""Configs (and config, dtype pairs) whose probes are kept: the whole catalog and more. A kept probe of the
largest catalog model is about 2 MB (its meta-device model's modules, no tensor data)."""
_GROUPS: dict[str, tuple[LayerGroup, ...]] = {}
_MODELS: dict[tuple[str, torch.dtype], object] = {}


def _remember(store: dict, key, make):
    """`store[key]`, made once; the oldest entry goes when the store holds `_CACHE_SIZE`."""
    if key not in store:
        value = make()
        while len(store) >= _CACHE_SIZE:
            store.pop(next(iter(store)))
        store[key] = value
    return store[key]


def _full_model(config, dtype: torch.dtype):
    model = meta_model(config, dtype)
    _cpu_rotary(model)
    return model


def describe_architecture(config, dtype: torch.dtype) -> Architecture:
    """The `Architecture` of `config` with parameters counted at `dtype` (cached per config and dtype).

    Raises:
        ProbeError: transformers cannot build or run the model from this config.
    """
    key = config_key(config)
    groups = list(_remember(_GROUPS, key, lambda: tuple(probe_shapes(config, layer_groups(config)))))
    model = _remember(_MODELS, (key, dtype), lambda: _full_model(config, dtype))
    parameters = list(model.parameters())
    text = config.get_text_config(decoder=True)
    return Architecture(
        config=config,
        groups=groups,
        layers=text.num_hidden_layers,
        parameters=sum(p.numel() for p in parameters),
        parameter_bytes=sum(p.numel() * p.element_size() for p in parameters),
        stand_in=StandIn(config, model),
        model_class=type(model).__name__,
        max_position_embeddings=getattr(text, "max_position_embeddings", None),
        key=key,
    )
