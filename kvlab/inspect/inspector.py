"""Inspect: step through one strategy's generation loop and look inside its cache after every step.

`InspectSession` drives the engine's own loop (`kvlab.engine.Decoder`, with `trace=True`) one step at a time,
so stepping it to the end gives the tokens a Compare column gives for the same settings. After every step it
makes a `StepRecord`:

- what the step fed and what the model derived from it (the decoder's `ForwardTrace`s: `input_ids` shape,
  `cache_position`, `position_ids`, the attention mask's shape) and the token chosen;
- `layer_rows`: per cache layer its type and class, tokens held and capacity, key/value shapes, dtype, device
  and bytes, split into keys/values, packed data, scales and the full-precision residual
  (`kvlab.accounting.layer_parts`); identical neighbouring layers are collapsed into one row past
  MAX_LAYERS_SHOWN layers;
- `layer_strip`: which sequence positions each layer still holds (sinks, held, quantized, residual, evicted,
  unused preallocated slots), read from the layer's own fields;
- the next-token top-5, and for a lossy strategy the same from a dynamic cache fed the same ids (through
  `kvlab.engine.forward`) with KL(dynamic || strategy) in nats.

This module runs and describes; it does not render (`kvlab.ui.inspect.view`) and does not pick a thread
(callers run `step` on kvlab's compute thread, `kvlab.compute`).
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, replace

import torch

from ..accounting import LAYER_PARTS, layer_bytes_by_device, layer_parts
from ..caches.quant import backend_of_layer
from ..engine import Decoder, ForwardTrace, forward
from ..generation import GenerationSettings
from ..strategies import Strategy
from ..strategies.dynamic import Dynamic

MAX_INSPECT_STEPS = 512
"""Most tokens one Inspect session generates (each step is kept with its per-layer table)."""
MAX_LAYERS_SHOWN = 12
"""Layers listed one per row; a model with more has identical neighbouring layers collapsed into ranges."""
TOP_K = 5
STRIP_STATES = ("sink", "held", "quantized", "residual", "evicted", "unused")
"""A position's state in a layer's token strip: an attention sink kept forever, held at full precision, held
quantized, in a quantized layer's full-precision residual, evicted, or a preallocated slot not yet written."""
FED_TEXT_TOKENS = 12
"""How many of the fed tokens a record spells out (the last ones)."""


class InspectError(ValueError):
    """An Inspect session cannot start with these settings; the message says why."""


@dataclass(frozen=True)
class LayerRow:
    """One cache layer (or a range of identical ones) after a step.

    layers: (first, last) layer index. held_tokens: tokens whose keys/values it holds. capacity: most tokens
    it can hold (None: grows). key_shape / value_shape: the full-precision tensors, (batch, kv_heads, seq,
    head_dim); quantized_shape: the shape the quantized keys stand for (None when not quantized). bytes: all
    it holds; parts: LAYER_PARTS -> bytes; devices: device -> bytes. strip: (state, start, stop) runs over
    sequence positions, states from STRIP_STATES. head_strips: for a layer pruned by a scored-eviction strategy,
    the same runs per KV head, and head_scores the method's score of each scored prompt position per head
    (`kvlab.eviction.kept.EvictionRecord`); empty otherwise.
    """

    layers: tuple[int, int]
    layer_type: str
    class_name: str
    held_tokens: int
    capacity: int | None
    key_shape: tuple[int, ...] | None
    value_shape: tuple[int, ...] | None
    quantized_shape: tuple[int, ...] | None
    dtype: str
    bytes: int
    parts: dict[str, int]
    devices: dict[str, int]
    strip: tuple[tuple[str, int, int], ...]
    head_strips: tuple[tuple[tuple[str, int, int], ...], ...] = ()
    head_scores: tuple[tuple[float, ...], ...] = ()

    @property
    def count(self) -> int:
        return self.layers[1] - self.layers[0] + 1


@dataclass(frozen=True)
class Candidate:
    """One next-token candidate: id, its text, probability (0..1)."""

    token_id: int
    text: str
    prob: float


@dataclass(frozen=True)
class StepRecord:
    """Everything Inspect shows for one step (index 0 is the prefill and the first token).

    fed_tokens / fed_text: how many ids the step fed and the last FED_TEXT_TOKENS of them as text.
    forwards: each model forward of the step (several when a sink cache prefills in chunks).
    seen_tokens: ids fed through the cache so far. per_token_s: seconds. cache_bytes: bytes after it.
    top: the TOP_K next-token candidates under this cache; reference_top and kl_nats: the same from a dynamic
    cache on the same ids and KL(dynamic || this cache), for a lossy strategy (None otherwise).
    layers: `LayerRow`s (collapsed past MAX_LAYERS_SHOWN layers); layer_count: the model's cache layers.
    """

    index: int
    token_id: int
    token_text: str
    fed_tokens: int
    fed_text: str
    forwards: tuple[ForwardTrace, ...]
    seen_tokens: int
    per_token_s: float
    cache_bytes: int
    top: tuple[Candidate, ...]
    reference_top: tuple[Candidate, ...] | None
    kl_nats: float | None
    layers: tuple[LayerRow, ...]
    layer_count: int
    strategy: str = ""

    @property
    def input_shape(self) -> tuple[int, int]:
        """Shape of the `input_ids` the model was given in this step, (batch, tokens), over all its forwards (for
        `no_cache` the whole sequence, while `fed_tokens` counts the one new id)."""
        return 1, sum(f.new_tokens for f in self.forwards)

    @property
    def last(self) -> ForwardTrace:
        return self.forwards[-1]

    @property
    def mask_shape(self) -> tuple[int, int, int, int]:
        """The causal mask of the last forward, (batch, 1, new tokens, kv_length)."""
        return 1, 1, self.last.new_tokens, self.last.kv_length

    def to_json(self) -> dict:
        """The record as the CLI writes it: every field, plus `input_ids_shape`, `cache_position`,
        `position_ids` and `attention_mask_shape` of the step's last forward."""
        record = asdict(self)
        record["forwards"] = [{**asdict(f), "cache_position": f.cache_position} for f in self.forwards]
        record.update(input_ids_shape=self.input_shape, cache_position=self.last.cache_position,
                      position_ids=self.last.position_ids, attention_mask_shape=self.mask_shape)
        return record


# ----- reading a layer -----

def is_quantized(layer) -> bool:
    """Whether `layer` is a quantization backend's layer holding quantized states now (`kvlab.caches.quant`)."""
    backend = backend_of_layer(layer)
    return backend is not None and backend.holds_quantized(layer)


def _tensor(layer, name: str):
    value = getattr(layer, name, None)
    return value if isinstance(value, torch.Tensor) and value.dim() == 4 else None


def held_tokens(layer) -> int:
    """Tokens whose keys/values `layer` holds: a quantized layer's count of every token it took (quantized +
    residual), a preallocated layer's written slots (`max_cache_len` marks one), else its keys' length."""
    if is_quantized(layer):
        return backend_of_layer(layer).held_tokens(layer)
    keys = _tensor(layer, "keys")
    if keys is None:
        return 0
    if hasattr(layer, "max_cache_len"):
        return min(int(layer.get_seq_length()), keys.shape[-2])
    return keys.shape[-2]


def capacity(layer) -> int | None:
    """Most tokens `layer` holds (`get_max_length`), None when it grows without limit."""
    limit = int(layer.get_max_length())
    return limit if limit >= 0 else None


def quantized_shape(layer) -> tuple[int, ...] | None:
    """The (batch, kv_heads, seq, head_dim) the quantized keys stand for, as the layer's backend reads its state
    (hqq keeps it in its meta dict, quanto and fp8 in the tensor), None for a layer that quantizes nothing."""
    backend = backend_of_layer(layer)
    return backend.quantized_shape(layer) if backend is not None else None


def layer_strip(layer, seen_tokens: int) -> tuple[tuple[str, int, int], ...]:
    """(state, start, stop) runs over sequence positions 0..seen_tokens-1 (and a preallocated layer's unused
    slots after them): which tokens `layer` still holds after `seen_tokens` ids went through it.

    A layer that holds fewer tokens than it saw has evicted all but its `num_sink_tokens` first (a sink cache)
    and its most recent ones (sink and sliding-window layers alike); a quantized layer holds its newest
    tokens in the full-precision residual and the rest quantized.
    """
    held = held_tokens(layer)
    runs: list[tuple[str, int, int]] = []
    if is_quantized(layer):
        recent = backend_of_layer(layer).residual_tokens(layer)
        runs = [("quantized", 0, held - recent), ("residual", held - recent, held)]
    else:
        sinks = min(int(getattr(layer, "num_sink_tokens", 0) or 0), held)
        if held >= seen_tokens:
            runs = [("sink", 0, sinks), ("held", sinks, seen_tokens)]
            keys = _tensor(layer, "keys")
            if keys is not None and hasattr(layer, "max_cache_len") and keys.shape[-2] > seen_tokens:
                runs.append(("unused", seen_tokens, keys.shape[-2]))
        else:
            start = seen_tokens - (held - sinks)
            runs = [("sink", 0, sinks), ("evicted", sinks, start), ("held", start, seen_tokens)]
    return tuple(run for run in runs if run[2] > run[1])


def layer_row(layer, index: int, layer_type: str, seen_tokens: int) -> LayerRow:
    """One `LayerRow` for `layer` (its index and the config's layer type) after `seen_tokens` ids."""
    keys, values = _tensor(layer, "keys"), _tensor(layer, "values")
    by_device = layer_bytes_by_device(layer)
    parts = {name: sum(by_dev.values()) for name, by_dev in layer_parts(layer).items()}
    dtype = keys.dtype if keys is not None else getattr(getattr(layer, "keys", None), "dtype", None)
    return LayerRow(
        layers=(index, index), layer_type=layer_type, class_name=type(layer).__name__,
        held_tokens=held_tokens(layer), capacity=capacity(layer),
        key_shape=tuple(keys.shape) if keys is not None else None,
        value_shape=tuple(values.shape) if values is not None else None,
        quantized_shape=quantized_shape(layer), dtype=str(dtype).removeprefix("torch.") if dtype else "-",
        bytes=sum(by_device.values()), parts={name: parts.get(name, 0) for name in LAYER_PARTS},
        devices=dict(by_device), strip=layer_strip(layer, seen_tokens))


def layer_types(config, count: int) -> list[str]:
    """The config's `layer_types` (e.g. `sliding_attention`), else `full_attention` for every layer."""
    cfg = config.get_text_config(decoder=True)
    types = list(getattr(cfg, "layer_types", None) or [])
    return [types[i] if i < len(types) else "full_attention" for i in range(count)]


def _with_eviction(row: LayerRow, layer, record, seen_tokens: int) -> LayerRow:
    """`row` with the held/evicted positions per KV head (the layer's `held_positions()`, which follows every
    prune) and their scores at the last compression (None where not scored), when `record` (a pruned cache's
    `EvictionRecord`) pruned this layer; the layer's own strip then shows head 0's."""
    from ..eviction.kept import held_runs

    index = row.layers[0]
    own = getattr(layer, "held_positions", None)
    if record is None or index not in record.layers or not callable(own):
        return row
    heads = held_runs(own(), seen_tokens)
    scores = tuple(tuple(None if math.isnan(x) else round(float(x), 6) for x in head)
                   for head in record.layers[index].scores.tolist())
    return replace(row, strip=heads[0], head_strips=heads, head_scores=scores)


def layer_rows(cache, config, seen_tokens: int, max_shown: int = MAX_LAYERS_SHOWN) -> tuple[LayerRow, ...]:
    """A `LayerRow` per layer of `cache` (none for no cache); with more than `max_shown` layers, neighbouring
    layers that read the same are collapsed into one row spanning them."""
    layers = list(getattr(cache, "layers", None) or [])
    types = layer_types(config, len(layers))
    record = getattr(cache, "eviction", None)
    rows = [_with_eviction(layer_row(layer, i, types[i], seen_tokens), layer, record, seen_tokens)
            for i, layer in enumerate(layers)]
    if len(rows) <= max_shown:
        return tuple(rows)
    collapsed: list[LayerRow] = []
    for row in rows:
        if collapsed and replace(collapsed[-1], layers=row.layers) == row:
            collapsed[-1] = replace(collapsed[-1], layers=(collapsed[-1].layers[0], row.layers[1]))
        else:
            collapsed.append(row)
    return tuple(collapsed)


# ----- the session -----

def top_candidates(tokenizer, logits: torch.Tensor, k: int = TOP_K) -> tuple[Candidate, ...]:
    """The `k` most likely next tokens of (vocab,) logits, with probabilities."""
    probs = torch.softmax(logits.float(), dim=-1)
    values, ids = probs.topk(k)
    return tuple(Candidate(int(i), tokenizer.decode([int(i)]), float(v)) for v, i in zip(values, ids))


def kl_nats(reference_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(reference || other) of two (vocab,) logit vectors, in nats."""
    ref = torch.log_softmax(reference_logits.float(), dim=-1)
    other = torch.log_softmax(logits.float(), dim=-1)
    return max(0.0, float((ref.exp() * (ref - other)).sum()))


class SteppedSession:
    """What a session that steps a `Decoder` (`self.decoder`) one token per `step()` shares."""

    decoder: Decoder

    def step(self):
        raise NotImplementedError

    def steps(self, count: int):
        """Generator of up to `count` step records (stops early at the end of the run); each `next` is one step,
        so `kvlab.compute.compute_iter` runs them on the compute thread one at a time."""
        for _ in range(count):
            record = self.step()
            if record is None:
                return
            yield record

    @property
    def token_ids(self) -> list[int]:
        """The tokens chosen so far."""
        return list(self.decoder.token_ids)


class InspectSession(SteppedSession):
    """One strategy's generation, stepped on demand through the engine's decode loop.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        strategy: the cache strategy, with its knobs.
        prompt_ids: (1, prompt_tokens) ids.
        settings: generation settings; max_new_tokens at most MAX_INSPECT_STEPS.
        max_shown: layers listed one per row before collapsing.

    Raises:
        InspectError: the strategy cannot run here, is compiled (`static` with `compile`: Inspect's hooks
            would make it recompile), or its cache cannot fit the run; too many steps; bad settings.
    """

    def __init__(self, loaded, strategy: Strategy, prompt_ids: torch.Tensor, settings: GenerationSettings,
                 max_shown: int = MAX_LAYERS_SHOWN):
        self.loaded, self.strategy, self.prompt_ids, self.settings = loaded, strategy, prompt_ids, settings
        self.max_shown = max_shown
        problems = self.settings.problems()
        if problems:
            raise InspectError("; ".join(problems))
        if self.settings.max_new_tokens > MAX_INSPECT_STEPS:
            raise InspectError(f"Inspect keeps every step: at most {MAX_INSPECT_STEPS} new tokens per session, "
                               f"got {self.settings.max_new_tokens}")
        if self.strategy.is_compileable:
            raise InspectError("Inspect steps the model eagerly with hooks on its first layer, which would make a "
                               "compiled forward recompile: turn compile off here (Compare times compiled runs)")
        reason = self.strategy.unavailable_reason(self.loaded)
        if reason:
            raise InspectError(f"{self.strategy.describe()} cannot run here: {reason}")
        try:
            self.strategy.check_fits(self.prompt_ids.shape[1], self.settings.max_new_tokens)
        except ValueError as err:
            raise InspectError(str(err)) from None
        self.reset()

    @property
    def max_total_tokens(self) -> int:
        return self.prompt_ids.shape[1] + self.settings.max_new_tokens

    def reset(self) -> None:
        """Start over: a fresh cache (and reference cache), no steps taken. Runs no model work."""
        self.cache = self.strategy.build_cache(self.loaded, self.max_total_tokens)
        self.decoder = Decoder(self.loaded, self.strategy, self.cache, self.prompt_ids, self.settings,
                               measure_bytes=True, trace=True)
        compare = self.strategy.lossy and self.strategy.use_cache
        self.reference = Dynamic()
        self.reference_cache = self.reference.build_cache(self.loaded, self.max_total_tokens) if compare else None
        self.records: list[StepRecord] = []

    @property
    def finished(self) -> bool:
        """No step is left (end of sequence or max_new_tokens reached)."""
        return self.decoder.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        return self.decoder.stop_reason

    def step(self) -> StepRecord | None:
        """Run one engine step (model work: call it on kvlab's compute thread) and return its record; None when
        the run has ended."""
        step = next(self.decoder, None)
        if step is None:
            return None
        tokenizer = self.loaded.tokenizer
        logits = step.trace.logits
        reference_top = kl = None
        if self.reference_cache is not None:
            fed = len(step.fed_ids)
            reference = forward(self.loaded, self.reference, self.reference_cache, self.decoder.sequence, fed)[0]
            reference_top, kl = top_candidates(tokenizer, reference), kl_nats(reference, logits)
        record = StepRecord(
            index=step.index, token_id=step.token_id, token_text=tokenizer.decode([step.token_id]),
            fed_tokens=len(step.fed_ids), fed_text=tokenizer.decode(list(step.fed_ids[-FED_TEXT_TOKENS:])),
            forwards=step.trace.forwards, seen_tokens=step.seen_tokens, per_token_s=step.per_token_s,
            cache_bytes=step.cache_bytes or 0, top=top_candidates(tokenizer, logits), reference_top=reference_top,
            kl_nats=kl, layers=layer_rows(self.cache, self.loaded.config, step.seen_tokens, self.max_shown),
            layer_count=len(getattr(self.cache, "layers", None) or []), strategy=self.strategy.describe())
        self.records.append(record)
        return record

