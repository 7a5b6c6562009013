"""The engine: the one place in kvlab that feeds tokens through a KV cache.

Every tab, the command line, fidelity scoring, the quality report, prefix reuse and the
benchmark's kvlab side call these operations; how one forward pass runs for a
given cache (a whole-sequence recompute for `no_cache`, window-sized chunks for
`sink`, a compiled step for `static` with `compile`) is the strategy's
`Strategy.forward`, so nothing here asks which cache class it holds.

- `forward`: one forward pass of the newest tokens, in inference mode.
- `Decoder`: prefill, then one decode step per `next()`: forward, token choice
  and (optionally) the cache's exact bytes and a `StepTrace` of what each forward
  was given (positions, mask size, logits: the Inspect tab's view); each `next()`
  is one unit of work that a caller may run on kvlab's compute thread
  (`kvlab.compute.compute_iter`). `Decoder.replace_cache` moves a run to another
  strategy's cache mid-way by re-prefilling the ids so far (`kvlab.budget`).
- `teacher_force`: the one teacher-forcing loop (a `Decoder` fed given tokens, keeping its logits): the
  quality report's and so the Perplexity view's, Needle's scoring and fidelity's.
- `score_continuation`: teacher-forced log-probabilities of a continuation.

Timing: a step's `per_token_s` covers its forward pass and token choice only.
Every forward has its own `torch.inference_mode()` block that never stays open
across a `yield`, so steps can be resumed from any thread.

Every loop here also stops once kvlab shuts down (`kvlab.compute.close`, on
SIGTERM), as if its stop were set, so no long call holds the exit up.

This module runs the model; it does not render, schedule threads or build
events for the page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .accounting import cache_bytes_by_layer_type, layer_types_and_windows
from .compute import closed
from .generation import GenerationSettings, TokenChooser, eos_token_ids

STOP_REASONS = ("eos", "length", "stopped")


class RunStopped(Exception):
    """Raised by a caller's loop (or `score_continuation`) when its stop event is set."""


def stopping(stop: threading.Event | None) -> bool:
    """Whether a loop given `stop` should end now: `stop` is set, or kvlab is shutting down (`kvlab.compute`)."""
    return closed() or (stop is not None and stop.is_set())


def forward(loaded, strategy, cache, sequence: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Feed the last `new_tokens` of `sequence` (1, seq) through `cache` the way `strategy` does.

    Returns the last position's logits, shape (1, vocab). Runs in inference mode.
    """
    with torch.inference_mode():
        return strategy.forward(loaded, cache, sequence, new_tokens)


@dataclass(frozen=True)
class ForwardTrace:
    """One model forward inside a step, as the model's first decoder layer received it.

    past_tokens: `cache.get_seq_length()` before the forward (0 without a cache): for most caches the tokens
    seen, for a sink cache the tokens it holds. new_tokens: tokens fed. position_ids: (first, last) rotary
    position given to them; a loop written by hand passes `torch.arange(past, past + new)[None]`, the same.
    kv_length, kv_offset: keys the new queries attend to and the mask offset (`Cache.get_mask_sizes`); the
    causal mask is (batch, 1, new_tokens, kv_length). mask_shape: the mask tensor the layers received, None
    when the attention kernel ran causally without one (SDPA without padding).
    """

    past_tokens: int
    new_tokens: int
    position_ids: tuple[int, int]
    kv_length: int
    kv_offset: int
    mask_shape: tuple[int, ...] | None

    @property
    def cache_position(self) -> tuple[int, int]:
        """(first, last) index of the fed tokens in the cache's own count (transformers 5 keeps it inside the
        cache; the docs' hand-written loops pass `torch.arange(past, past + new)`)."""
        return self.past_tokens, self.past_tokens + self.new_tokens - 1


@dataclass(frozen=True)
class StepTrace:
    """What a traced step fed and got back: its forwards (several when a sink cache prefills in window-sized
    chunks) and the last position's logits, (vocab,) float32 on the CPU."""

    forwards: tuple[ForwardTrace, ...]
    logits: "torch.Tensor" = field(repr=False)


@dataclass(frozen=True)
class Step:
    """One decode step (index 0 is the prefill and the first token).

    token_id: the token chosen. per_token_s: forward pass + choice, seconds.
    fed_ids: the ids this step's forward fed into the cache (every id so far on the step after
    `Decoder.replace_cache`). seen_tokens: ids fed through the cache so far (the input + the tokens chosen
    before this one). cache_bytes: exact bytes the cache holds after it (None when not measured);
    cache_bytes_by_layer_type: the same per layer type (`full_attention`, `sliding_attention`, ...).
    trace: positions, mask size and logits of the step (None unless the decoder traces).
    """

    index: int
    token_id: int
    per_token_s: float
    fed_ids: tuple[int, ...]
    seen_tokens: int
    cache_bytes: int | None = None
    cache_bytes_by_layer_type: dict[str, int] | None = None
    trace: StepTrace | None = None
    logits: "torch.Tensor | None" = field(default=None, repr=False)
    """The last position's logits, (vocab,) on the model's device, when the decoder keeps them."""


def first_decoder_layer(model):
    """The model's first decoder layer module (where `trace_forwards` listens), or None when it has no
    `layers` list."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    return layers[0] if layers is not None and len(layers) else None


@contextlib.contextmanager
def trace_forwards(model, into: list):
    """While open, append a `ForwardTrace` to `into` for every forward of `model`, read by a forward pre-hook
    on its first decoder layer (its `position_ids`, `attention_mask` and cache, before the layer updates the
    cache). The hook is removed on exit."""
    layer = first_decoder_layer(model)
    if layer is None:
        yield
        return

    def record(module, args, kwargs):
        hidden = args[0] if args else kwargs.get("hidden_states")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        new = int(hidden.shape[1])
        past = int(cache.get_seq_length()) if cache is not None else 0
        kv_length, kv_offset = cache.get_mask_sizes(new, 0) if cache is not None else (new, 0)
        positions = kwargs.get("position_ids")
        first, last = (int(positions[0, 0]), int(positions[0, -1])) if positions is not None else (past, past + new - 1)
        mask = kwargs.get("attention_mask")
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else None
        into.append(ForwardTrace(past, new, (first, last), int(kv_length), int(kv_offset), shape))

    handle = layer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


_NO_TRACE = contextlib.nullcontext()


class Decoder:
    """Generate from `input_ids` through `cache`, one step per `next()`.

    The first step feeds `input_ids[feed_from:]` (the cache holds the rest) and
    chooses the first token; each later step feeds the previous token. The last
    chosen token is never fed back, so afterwards the cache holds the input and
    every generated token but the last. Iteration ends after `max_new_tokens`
    tokens, at an end-of-sequence token (when `settings.stop_at_eos`), or before
    any step once `stop` is set; `stop_reason` then says which.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        strategy: the `kvlab.strategies.Strategy` whose `forward` feeds the cache.
        cache: the transformers `Cache` to extend (None for `no_cache`).
        input_ids: (seq,) ids or a (1, seq) tensor.
        settings: validated generation settings (max_new_tokens, sampling, stop_at_eos).
        feed_from: index of the first input id the cache does not hold yet, 0 <= feed_from < seq.
        seed: sampling seed (default `settings.seed`).
        stop: set it to end generation before the next step.
        measure_bytes: count the cache's bytes after every step (`Step.cache_bytes`, and per layer type).
        trace: record each step's forwards and logits (`Step.trace`); the hook that reads them runs inside
            the timed part, so leave it off where per-token times are compared.
        forced_ids: teacher-force these ids: step t still chooses a token (the same timed work) but keeps
            `forced_ids[t]`, so a re-run yields the same tokens and cache contents as the run it repeats
            (the re-timing pass of `kvlab.measure`). Iteration also ends after len(forced_ids) steps.
        keep_logits: keep each step's logits (`Step.logits`, (vocab,)), read after the clock stops.

    Raises:
        ValueError: `feed_from` out of range or empty input.
    """

    def __init__(self, loaded, strategy, cache, input_ids, settings: GenerationSettings, *, feed_from: int = 0,
                 seed: int | None = None, stop: threading.Event | None = None, measure_bytes: bool = False,
                 trace: bool = False, forced_ids=None, keep_logits: bool = False):
        ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor([list(input_ids)])
        ids = ids.reshape(1, -1).to(loaded.device)
        if not 0 <= feed_from < ids.shape[1]:
            raise ValueError(f"feed_from must be in 0..{ids.shape[1] - 1}, got {feed_from}")
        run_settings = settings if seed is None else dataclasses.replace(settings, seed=seed)
        self.loaded, self.strategy, self.cache, self.settings = loaded, strategy, cache, settings
        self.sequence = ids
        self.feed_from = feed_from
        self.stop = stop
        self.measure_bytes = measure_bytes
        self.layer_types = layer_types_and_windows(loaded.config)[0] if measure_bytes else []
        self.trace, self.keep_logits = trace, keep_logits
        self.forced_ids = list(forced_ids) if forced_ids is not None else None
        self._refeed = False
        self.chooser = TokenChooser(run_settings, loaded.device)
        self.eos = eos_token_ids(loaded) if settings.stop_at_eos else set()
        self.token_ids: list[int] = []
        self.per_token_s: list[float] = []
        self.stop_reason: str | None = None

    @property
    def ttft_s(self) -> float | None:
        """The first step's forward + choice, seconds (None before it)."""
        return self.per_token_s[0] if self.per_token_s else None

    def __iter__(self) -> "Decoder":
        return self

    @property
    def seen_tokens(self) -> int:
        """Ids fed through the cache so far (the input before the first step)."""
        return self.sequence.shape[1] if self.token_ids else self.feed_from

    @property
    def next_seen_tokens(self) -> int:
        """Ids fed through the cache once the next step has run."""
        return self.sequence.shape[1] + (1 if self.token_ids else 0)

    def replace_cache(self, strategy, cache) -> None:
        """Go on under `strategy` with `cache` (empty): the next step feeds every id so far (the input and the
        tokens chosen, the last one included) into it, then decoding continues one token per step. The token
        ids chosen so far, the sampler's state and the step count stay."""
        self.strategy, self.cache = strategy, cache
        self._refeed = True

    def __next__(self) -> Step:
        if self.stop_reason is None and stopping(self.stop):
            self.stop_reason = "stopped"
        if self.stop_reason is not None:
            raise StopIteration
        # 1. What this step feeds: the uncached input tail first, then the previous token (everything after
        #    `replace_cache`). The sequence is only kept once the forward succeeded, so a failed step can be
        #    tried again.
        index = len(self.token_ids)
        sequence = self.sequence
        if index:
            token = torch.tensor([[self.token_ids[-1]]], device=sequence.device)
            sequence = torch.cat([sequence, token], dim=1)
        fed = sequence.shape[1] if self._refeed else sequence.shape[1] - self.feed_from if index == 0 else 1
        # 2. The timed part: one forward through the strategy's cache and the token choice.
        forwards: list[ForwardTrace] = []
        started = time.perf_counter()
        with torch.inference_mode(), trace_forwards(self.loaded.model, forwards) if self.trace else _NO_TRACE:
            logits = self.strategy.forward(self.loaded, self.cache, sequence, fed)
            token = self.chooser(sequence, logits)
        elapsed = time.perf_counter() - started
        # 3. Book-keeping outside the clock, then decide whether this was the last step.
        if self.forced_ids is not None:
            token = self.forced_ids[index]
        self.sequence, self._refeed = sequence, False
        self.token_ids.append(token)
        self.per_token_s.append(elapsed)
        by_type = cache_bytes_by_layer_type(self.cache, self.layer_types) if self.measure_bytes else None
        if token in self.eos:
            self.stop_reason = "eos"
        elif len(self.token_ids) >= self.settings.max_new_tokens or (
                self.forced_ids is not None and len(self.token_ids) >= len(self.forced_ids)):
            self.stop_reason = "length"
        fed_ids = tuple(sequence[0, -fed:].tolist())
        size = sum(by_type.values()) if by_type is not None else None
        trace = StepTrace(tuple(forwards), logits[0].detach().float().cpu()) if self.trace else None
        kept = logits[0] if self.keep_logits else None
        return Step(index, token, elapsed, fed_ids, sequence.shape[1], size, by_type, trace, kept)

    def run(self) -> "Decoder":
        """Run every remaining step in this thread; returns self."""
        for _ in self:
            pass
        return self


def teacher_force(loaded, strategy, cache, sequence, targets: Sequence[int], *, feed_from: int = 0,
                  stop: threading.Event | None = None, measure_bytes: bool = False) -> Decoder:
    """kvlab's one teacher-forcing loop: a `Decoder` whose first step feeds `sequence[feed_from:]` through
    `cache` (the strategy's own prefill: an eviction strategy compresses there, a sink cache streams in
    window-sized chunks), then feeds `targets[:-1]` one token per step. Step t's `logits` (vocab,) are the
    distribution that predicts `targets[t]`; there are len(targets) steps (fewer once `stop` is set, and then
    `stop_reason` is "stopped"). `per_token_s` times each forward.

    Args:
        sequence: (1, seq) or (seq,) ids the cache has (or will have) seen before the first target.
        targets: at least one token id.

    Raises:
        ValueError: no targets, or `feed_from` out of range.
    """
    if not len(targets):
        raise ValueError("teacher_force needs at least one target token")
    settings = GenerationSettings(max_new_tokens=len(targets), stop_at_eos=False, fidelity=False)
    return Decoder(loaded, strategy, cache, sequence, settings, feed_from=feed_from, stop=stop,
                   measure_bytes=measure_bytes, forced_ids=list(targets), keep_logits=True)


def score_continuation(loaded, strategy, prompt_ids: torch.Tensor, continuation: Sequence[int],
                       stop: threading.Event | None = None,
                       switches: Sequence[tuple[int, object]] = ()) -> torch.Tensor:
    """Log-probabilities (len(continuation), vocab), float32: row t is the distribution under `strategy`'s cache
    that predicts continuation[t] after the prompt and continuation[:t].

    An exact strategy (`not strategy.lossy`) without switches attends like a full causal forward, so it is
    scored with one forward over prompt + continuation; otherwise the continuation is fed token by token through
    the strategy's own cache, so every eviction or quantization acts as it did while generating.

    Args:
        prompt_ids: (1, prompt_tokens) ids.
        continuation: the token ids to score (at least one).
        switches: (token index t, strategy) pairs, ascending: from row t on, rows come from a fresh cache of that
            strategy into which prompt + continuation[:t] was prefilled, as `Decoder.replace_cache` does in a run
            (a budgeted column's fallbacks).

    Raises:
        RunStopped: `stop` was set while scoring.
    """
    prompt = prompt_ids.to(loaded.device)
    tokens = torch.tensor([list(continuation)], device=loaded.device)
    count = tokens.shape[1]
    if not strategy.lossy and not switches:
        sequence = torch.cat([prompt, tokens[:, :-1]], dim=1)
        with torch.inference_mode():
            logits = loaded.model(input_ids=sequence, use_cache=False, logits_to_keep=count).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)
    sequence = torch.cat([prompt, tokens], dim=1)
    segments = [(0, strategy), *switches]
    rows = []
    for k, (start, segment) in enumerate(segments):
        end = min(count, segments[k + 1][0] if k + 1 < len(segments) else count)
        if start >= end:
            continue
        cache = segment.build_cache(loaded, prompt.shape[1] + count)
        forced = teacher_force(loaded, segment, cache, sequence[:, :prompt.shape[1] + start],
                               list(continuation[start:end]), stop=stop)
        rows += [step.logits for step in forced]
        if forced.stop_reason == "stopped":
            raise RunStopped
    return torch.log_softmax(torch.stack(rows).float(), dim=-1)
