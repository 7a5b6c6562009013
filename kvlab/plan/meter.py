"""Exact cache bytes of one layer of each group, under a strategy's own cache, at any context length.

`StrategyMeter` builds the strategy's real cache (`Strategy.build_cache` on the
model's meta-device stand-in, so every layer has the class transformers or kvlab
would give it) and writes what the model's attention writes: tensors of the
probed per-token shapes, the planned batch and dtype, through `Cache.update` on
the representative layer of each group. It then counts that layer's bytes with
`kvlab.accounting`.

- On the meta device (plain, sliding, static, sink, quanto and fp8 layers) the
  cache classes run their real code on shape-only tensors, so the count is exact
  at any length (10^7 tokens included) and nothing is allocated.
- Where a cache class cannot run on the meta device (hqq reads values), it runs on
  the CPU at small lengths and the count is extrapolated exactly: the packed size of
  a quantized tensor repeats with a period its backend gives
  (`QuantBackend.packing_period_elements`: for quanto and hqq, groups of
  `q_group_size` values packed 8/nbits per byte, or 10 per 32-bit word for 3 bits,
  repeat every `40 * q_group_size` elements); the meter measures three lengths one
  period apart, checks that the two steps are equal, and extends the line.

Which layers are quantized, and how, the meter asks each layer's quantization backend
(`kvlab.caches.quant.backend_of_layer`). A decode of d tokens one at a time leaves
every layer class holding what one update of d tokens leaves, except a backend
layer with a full-precision residual (transformers' `QuantizedLayer`): it is
quantized whenever it reaches `residual_length` tokens. For those layers the meter
writes the quantized part and the residual as two updates of the sizes the
step-by-step run ends with, which leaves identical tensors.

A group whose layers the strategy's cache makes of different classes (vLLM's TurboQuant presets keep the first
and last layers in the model's dtype, `kvlab.caches.vllm_cache`) is measured per class: `parts_of(group)` gives
one sub-group per class (its layers' indices), each measured on its first layer.

Tensors a cache shares between its layers (rotation quantization's rotation and codebooks, which the backend
names: `QuantBackend.shared_tensors`) are counted once per cache, not once per layer: `group_bytes` gives a
layer's own bytes and `shared_bytes` what the measured layer of each group lists as shared.

Layers that hold recurrent or convolution states (state-space, linear attention)
are measured by running the shrunk model itself for a prefill and one decode step
with the strategy's cache; their bytes must not change between the two.

This module measures; planning and explaining are `kvlab.plan.planner`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..accounting import layer_bytes_by_device, tensor_bytes_by_device
from ..caches.quant import backend_of_layer
from ..caches.quant.base import PERIOD_ELEMENTS_PER_GROUP
from .probe import Architecture, LayerGroup, StandIn, meta_model, shrunk_config
from ..strategies import StrategyError

META = torch.device("meta")
MAX_CPU_ELEMENTS = 2**23
"""Most key (or value) elements one CPU measurement may allocate (32 MiB in bfloat16)."""

CPU_MEASURE_THREADS = 1
"""torch intra-op threads while measuring on the CPU (restored after). The tensors are a few thousand elements:
more threads only wake an OpenMP team per operation, which on 2 busy cores made each hqq call about 30 ms instead
of under 1 ms."""

FAR_TOKENS = 2**33
"""A context far beyond any window or model limit, where the meter reads how each group ends up growing."""

UNSUPPORTED_LAYER_TYPES = ("hybrid", "hybrid_sliding")


class MeasureError(RuntimeError):
    """The strategy's cache cannot be measured on this model; the message gives the reason."""


class PlanLimit(MeasureError):
    """The strategy can run on the model, but Plan cannot measure it (the message says why)."""


@dataclass(frozen=True)
class GroupLaw:
    """How one layer of a group grows with the context (prefilled in one forward).

    kind: `none` (holds nothing), `linear` (exactly `bytes_per_token` per token),
    `flat_after` (linear until `knee` tokens, then constant), `constant`, or
    `periodic` (quantized: linear in steps, `bytes_per_token` on average).
    bytes_at_one: bytes after one token. far_bytes: bytes at `FAR_TOKENS` tokens.
    """

    kind: str
    bytes_per_token: float
    bytes_at_one: int
    far_bytes: int
    knee: int | None = None


def split_schedule(layer, prefill: int, decoded: int) -> list[int]:
    """Update sizes that leave `layer` holding what a prefill of `prefill` tokens then `decoded` single-token
    decode steps leave (see the module docstring)."""
    if decoded == 0:
        return [prefill]
    backend = backend_of_layer(layer)
    residual = backend.residual_length(layer) if backend is not None else None
    if residual is None:
        return [prefill, decoded]
    kept = decoded % residual if residual > 0 else 0
    return [prefill + decoded - kept] + ([kept] if kept else [])


def _layer_bytes(cache, index: int) -> int:
    if index >= len(cache.layers):
        return 0
    return sum(layer_bytes_by_device(cache.layers[index]).values())


class StrategyMeter:
    """Exact bytes of one layer of each KV group of `arch` under `strategy`'s cache.

    Args:
        arch: the probed model (`kvlab.plan.probe.describe_architecture`).
        strategy: a `kvlab.strategies.Strategy` (the one Compare would run).
        batch: sequences in the batch, >= 1.
        dtype: dtype of the keys and values written.

    Raises (from `group_bytes`):
        MeasureError: the cache refuses the model or the shapes (the reason is transformers' or kvlab's).
    """

    def __init__(self, arch: Architecture, strategy, batch: int, dtype: torch.dtype):
        self.arch, self.strategy, self.batch, self.dtype = arch, strategy, batch, dtype
        self.groups = [group for group in arch.groups if group.key_shape is not None]
        self._on_cpu: set[int] = set()
        self._memo: dict[tuple[int, int], dict[LayerGroup, int]] = {}
        self._cpu_memo: dict[tuple, int] = {}
        self.residual_length: int | None = None
        self.quantized = False
        self.quantized_indices: set[int] = set()
        """Layers whose cache is quantized (on a hybrid model the full-attention ones only)."""
        self.shared_bytes: dict[LayerGroup, int] = {}
        """group -> bytes of the tensors its measured layer shares with the cache's other layers (counted once)."""
        self.parts: dict[LayerGroup, tuple[LayerGroup, ...]] = {}
        """group -> its sub-groups by layer class, for a group whose layers the cache makes of several classes."""

    def parts_of(self, group: LayerGroup) -> tuple[LayerGroup, ...]:
        """The sub-groups `group` is measured as: itself, or one per layer class of the strategy's cache (known
        after the first `group_bytes`)."""
        return self.parts.get(group, (group,))

    def group_bytes(self, context: int, prefill: int | None = None) -> dict[LayerGroup, int]:
        """Bytes of one layer of each KV group after `context` tokens: `prefill` (default: all of them) in one
        forward, the rest decoded one at a time; tensors shared between layers are left out (`shared_bytes`)."""
        prefill = context if prefill is None else prefill
        key = (context, prefill)
        if key not in self._memo:
            cache = self._build(context)
            measured = {}
            for group in self.groups:
                for part in self.parts_of(group):
                    measured[part] = 0 if cache is None else self._measure(part, context, prefill, cache)
            self._memo[key] = measured
        return self._memo[key]

    def law(self, group: LayerGroup) -> GroupLaw:
        """How one layer of `group` grows with a context prefilled in one forward (measured, see `GroupLaw`)."""
        one, two = self.group_bytes(1)[group], self.group_bytes(2)[group]
        half, far = self.group_bytes(FAR_TOKENS // 2)[group], self.group_bytes(FAR_TOKENS)[group]
        step = two - one
        if far == 0:
            return GroupLaw("none", 0.0, 0, 0)
        if far == half:
            if far == one:
                return GroupLaw("constant", 0.0, one, far)
            return GroupLaw("flat_after", float(step), one, far, self._knee(group, one, step, far))
        if far == one + (FAR_TOKENS - 1) * step and half == one + (FAR_TOKENS // 2 - 1) * step:
            return GroupLaw("linear", float(step), one, far)
        return GroupLaw("periodic", (far - half) / (FAR_TOKENS - FAR_TOKENS // 2), one, far)

    def _knee(self, group: LayerGroup, one: int, step: int, far: int) -> int:
        """The first context at which the group's bytes reach their final value."""
        if step > 0 and (far - one) % step == 0:
            guess = 1 + (far - one) // step
            if self.group_bytes(guess)[group] == far and self.group_bytes(guess - 1)[group] < far:
                return guess
        low, high = 1, FAR_TOKENS // 2
        while low < high:
            middle = (low + high) // 2
            if self.group_bytes(middle)[group] >= far:
                high = middle
            else:
                low = middle + 1
        return low

    def _build(self, context: int):
        try:
            cache = self.strategy.build_cache(self.arch.stand_in, context)
        except StrategyError as err:
            raise MeasureError(str(err)) from err
        except (ValueError, TypeError, RuntimeError, ImportError) as err:
            raise MeasureError(f"{type(err).__name__}: {err}") from err
        if cache is not None and cache.layers:
            # a pruned cache that quantizes what it kept makes its quantized layers after the prefill
            made = getattr(cache, "quantized_layer", None)
            layers = [made() if made is not None and self.strategy.is_evicting and not layer.is_sliding else layer
                      for layer in cache.layers]
            self.quantized_indices = {index for index, layer in enumerate(layers)
                                      if backend_of_layer(layer) is not None}
            first = layers[min(self.quantized_indices)] if self.quantized_indices else layers[0]
            backend = backend_of_layer(first)
            self.residual_length = backend.residual_length(first) if backend is not None else None
            self.quantized = bool(self.quantized_indices)
            if not self.parts:
                self._split_by_class(layers)
        return cache

    def _split_by_class(self, layers: list) -> None:
        """Record `parts` for each group whose layers are of more than one class (in order of first appearance)."""
        for group in self.groups:
            classes: dict[type, list[int]] = {}
            for index in group.indices:
                classes.setdefault(type(layers[index]) if index < len(layers) else type(None), []).append(index)
            if len(classes) > 1:
                self.parts[group] = tuple(replace(group, indices=tuple(indices)) for indices in classes.values())

    def _measure(self, group: LayerGroup, context: int, prefill: int, cache) -> int:
        index = group.indices[0]
        if self.strategy.is_evicting and group.layer_type == "full_attention":
            # A scored-eviction strategy keeps `kept_tokens` of the prompt per layer, then holds what
            # `held_tokens_after` says (decoded tokens all kept, or back at its budget every `compress_every`).
            config = self.arch.stand_in.config
            question = 0 if self.strategy.query_aware else self.strategy.question_tokens
            kept = {self.strategy.kept_tokens(prefill - question, i, config, self.dtype) for i in group.indices}
            if len(kept) > 1:
                raise PlanLimit(f"Plan measures one layer per group, and this strategy keeps a different number of "
                                f"positions in each layer ({min(kept)}..{max(kept)} of a {prefill - question}-token "
                                "prompt); Compare and Inspect show its bytes")
            held = kept.pop()
            after = {self.strategy.held_tokens_after(prefill, context - prefill, i, config, self.dtype)
                     for i in group.indices}
            context, prefill = after.pop(), held
            make_quantized = getattr(cache, "quantized_layer", None)
            if make_quantized is not None and index < len(cache.layers):
                cache.layers[index] = make_quantized()  # what a pruned layer becomes (`PrunedCache.quantize_layer`)
        layer = cache.layers[index] if index < len(cache.layers) else None
        chunks = split_schedule(layer, prefill, context - prefill)
        if index not in self._on_cpu:
            try:
                return self._feed(cache, group, chunks, META)
            except (RuntimeError, NotImplementedError):
                self._on_cpu.add(index)
        return self._periodic_cpu(group, context, chunks)

    def _feed(self, cache, group: LayerGroup, chunks: list[int], device: torch.device) -> int:
        (key_heads, key_width), (value_heads, value_width) = group.key_shape, group.value_shape
        # Packed sizes depend on shapes only; zeros end hqq's proximal optimizer after two steps instead of ~15.
        make = torch.empty if device == META else torch.zeros
        for tokens in chunks:
            keys = make((self.batch, key_heads, tokens, key_width), dtype=self.dtype, device=device)
            values = make((self.batch, value_heads, tokens, value_width), dtype=self.dtype, device=device)
            cache.update(keys, values, group.indices[0])
        layer = cache.layers[group.indices[0]]
        backend = backend_of_layer(layer)
        shared = backend.shared_tensors(layer) if backend is not None else None
        self.shared_bytes[group] = sum(tensor_bytes_by_device(shared).values()) if shared is not None else 0
        return _layer_bytes(cache, group.indices[0]) - self.shared_bytes[group]

    def _cpu_once(self, group: LayerGroup, context: int, chunks: list[int]) -> int:
        key = (group, self.strategy.capacity(context), tuple(chunks))
        if key not in self._cpu_memo:
            self._cpu_memo[key] = self._cpu_measure(group, context, chunks)
        return self._cpu_memo[key]

    def _cpu_measure(self, group: LayerGroup, context: int, chunks: list[int]) -> int:
        widest = max(group.key_shape[0] * group.key_shape[1], group.value_shape[0] * group.value_shape[1])
        if self.batch * widest * sum(chunks) > MAX_CPU_ELEMENTS:
            raise MeasureError(f"{self.strategy.describe()}: a {sum(chunks)}-token measurement of "
                               f"{group.label} at batch {self.batch} is too large to run on the CPU")
        threads = torch.get_num_threads()
        torch.set_num_threads(CPU_MEASURE_THREADS)
        try:
            return self._feed(self._build(context), group, chunks, torch.device("cpu"))
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            raise MeasureError(f"{type(err).__name__}: {err}") from err
        finally:
            torch.set_num_threads(threads)

    def _period(self, group: LayerGroup, layer) -> int:
        """Tokens after which a quantized tensor of this group's shape repeats its packing (see module docstring)."""
        backend = backend_of_layer(layer)
        elements = backend.packing_period_elements(layer) if backend is not None else PERIOD_ELEMENTS_PER_GROUP
        periods = [elements // math.gcd(elements, self.batch * heads * width)
                   for heads, width in (group.key_shape, group.value_shape)]
        return math.lcm(*periods)

    def _periodic_cpu(self, group: LayerGroup, context: int, chunks: list[int]) -> int:
        """Bytes for `chunks` measured on the CPU, the first (quantized) chunk extrapolated by whole periods."""
        cache = self._build(context)
        index = group.indices[0]
        period = self._period(group, cache.layers[index] if index < len(cache.layers) else None)
        first, rest = chunks[0], chunks[1:]
        if first <= 4 * period:
            return self._cpu_once(group, context, chunks)
        start = period + first % period
        sizes = [self._cpu_once(group, context, [start + k * period, *rest]) for k in range(3)]
        if sizes[2] - sizes[1] != sizes[1] - sizes[0]:
            raise MeasureError(f"{self.strategy.describe()}: bytes of {group.label} are not periodic in "
                               f"{period} tokens ({sizes}); cannot extrapolate exactly")
        return sizes[0] + (first - start) // period * (sizes[1] - sizes[0])


def linear_state_bytes(arch: Architecture, strategy, batch: int, dtype: torch.dtype) -> dict[LayerGroup, int]:
    """Bytes of one layer of each state-holding group (state-space, linear attention), constant in the context.

    Runs the shrunk model on the meta device with the strategy's cache for a 2-token
    prefill and one decode step, and reads each group's layer after both.

    Raises:
        MeasureError: the strategy's cache cannot serve the model (the forward fails, with
            transformers' reason), a layer type mixes states and keys/values, the states
            change size between the two steps, or the model only runs in bfloat16 on the
            meta device (MoE kernels there need it).
    """
    groups = [group for group in arch.groups if group.is_linear]
    if not groups:
        return {}
    mixed = sorted({group.layer_type for group in groups if group.layer_type in UNSUPPORTED_LAYER_TYPES})
    if mixed:
        raise MeasureError(f"layer type(s) {mixed} hold states and keys/values in one layer; not planned")
    try:
        sizes = _run_states(arch, strategy, batch, dtype, groups)
    except MeasureError as err:
        if dtype != torch.bfloat16 and _runs(arch, strategy, batch, groups):
            raise MeasureError(f"the model's recurrent states can only be measured in bfloat16 here (its MoE "
                               f"kernels need it on the meta device); plan with dtype bfloat16 ({err})") from err
        kinds = ", ".join(sorted({group.layer_type for group in groups}))
        raise MeasureError(f"the model's {kinds} layers keep recurrent/convolution states, and running them "
                           f"through this cache failed: {err}") from err
    if sizes is None:
        return {group: 0 for group in groups}
    if sizes[0] != sizes[1]:
        raise MeasureError("recurrent/convolution states changed size between prefill and decode; not planned")
    return sizes[1]


def _runs(arch: Architecture, strategy, batch: int, groups: list[LayerGroup]) -> bool:
    try:
        _run_states(arch, strategy, batch, torch.bfloat16, groups)
    except MeasureError:
        return False
    return True


def _run_states(arch: Architecture, strategy, batch: int, dtype: torch.dtype, groups: list[LayerGroup]):
    """[bytes per group after a 2-token prefill, after one decode step], or None for a strategy without a cache."""
    probed = [group for group in arch.groups if group.layer_type != "dummy"]
    shrunk = shrunk_config(arch.config, probed)
    model = meta_model(shrunk, dtype)
    try:
        cache = strategy.build_cache(StandIn(shrunk, model), 3)
    except (ValueError, TypeError, RuntimeError, ImportError) as err:
        raise MeasureError(f"{type(err).__name__}: {err}") from err
    if cache is None:
        return None
    sizes = []
    try:
        with torch.inference_mode():
            for ids in (torch.ones((batch, 2), dtype=torch.long), torch.ones((batch, 1), dtype=torch.long)):
                model(input_ids=ids.to(META), cache=cache, use_cache=True, logits_to_keep=1)
                sizes.append({group: _layer_bytes(cache, probed.index(group)) for group in groups})
    except Exception as err:  # noqa: BLE001 - any model's forward; the reason is reported
        raise MeasureError(f"{type(err).__name__}: {err}") from err
    return sizes
