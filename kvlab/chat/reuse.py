"""Reusing a KV cache for a new input: what to feed, what to crop, and the replies generated on top.

Shared by the chat (`kvlab.chat.session`, one cache kept across turns) and prefix reuse
(`kvlab.chat.prefix`, copies of one prefilled cache). `plan_reuse` compares the ids
that went through a cache with the new input's ids and decides:

- `fresh`: nothing cached yet, feed everything.
- `reuse`: the input starts with the cached ids, only the new tail is fed.
- `crop`: the input diverges from the cached ids (undo, regenerate, or a chat
  template that re-tokenized a reply differently from how it was generated);
  the cache is cropped to the common prefix (`Cache.crop(-n)`) and the rest is fed.
- `rebuild`: the cache cannot be cropped (quantized layers, a sink window, sliding
  layers past their window), so
  the whole input is fed into a fresh one.
- `stream`: a streaming cache (sink) holds only its window, so its ids are not a
  prefix of the input; only the new tokens are fed.

`Reply` and `reply_stream` generate on top of a prepared cache through the
engine (`kvlab.engine.Decoder`), under a cache budget when given one
(`kvlab.budget.ResilientSteps`). This module decides and generates; it does not
render and keeps no session state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..budget import ResilientSteps
from ..engine import Decoder
from ..generation import GenerationSettings, IncrementalDetokenizer

CAPACITY_ROUNDING = 256
"""Suggested fixed-size capacities are rounded up to a multiple of this many tokens."""

ACTIONS = ("fresh", "reuse", "crop", "rebuild", "stream")


def suggested_capacity(needed: int) -> int:
    """Twice `needed`, rounded up to a multiple of CAPACITY_ROUNDING tokens."""
    return -(-2 * needed // CAPACITY_ROUNDING) * CAPACITY_ROUNDING


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading positions where the two id sequences agree."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n



@dataclass(frozen=True)
class ReusePlan:
    """What to do with a cache before feeding a new input.

    action: one of ACTIONS. reused_tokens: input tokens not fed again.
    crop_tokens: tokens to remove from the end of the cache first (0 = none).
    rebuild: drop the cache and start from an empty one. note: one sentence for the stats.
    """

    action: str
    reused_tokens: int
    crop_tokens: int = 0
    rebuild: bool = False
    note: str = ""


def plan_reuse(cached_ids: Sequence[int], input_ids: Sequence[int], croppable: bool,
               streaming: bool = False, reason: str = "") -> ReusePlan:
    """Decide how much of `input_ids` a cache that went through `cached_ids` can serve.

    At least one input token is always fed (its logits give the first new token),
    so an input that is a prefix of the cached ids reuses all but its last token.

    Args:
        cached_ids: ids that went through the cache, in order (for a streaming
            cache: every id streamed through it, not just the ones it holds).
        input_ids: the new turn's full input ids (at least one).
        croppable: the cache supports `crop(-n)`.
        streaming: the cache is a sink cache (see `is_streaming`).
        reason: why the ids may have diverged (e.g. "undo"), for the note.

    Raises:
        ValueError: empty `input_ids`.
    """
    if not input_ids:
        raise ValueError("input_ids is empty: there is nothing to feed")
    if not cached_ids:
        return ReusePlan("fresh", 0, note="first turn: the whole input is prefilled")
    common = common_prefix_length(cached_ids, input_ids)
    usable = min(common, len(input_ids) - 1)
    why = (f" ({reason})" if reason
           else " (the chat template re-tokenized the history differently from the generated ids)")
    where = (f"the cached ids run past the input ({len(cached_ids)} cached, {len(input_ids)} in the input)"
             if common == len(input_ids) else f"the input diverges from the cached ids after {common} matching tokens")
    if usable == len(cached_ids):
        if streaming:
            return ReusePlan("stream", usable, note=(
                f"only the new turn's tokens were fed; the earlier {usable} tokens were streamed through the "
                f"sink window, which keeps the sink tokens and the most recent ones"))
        return ReusePlan("reuse", usable,
                         note=f"the input starts with the {usable} cached tokens: only the new tail was prefilled")
    if streaming:
        return ReusePlan("rebuild", 0, rebuild=True, note=(
            f"{where}{why}; a sink cache cannot be cropped (evicted tokens are gone), "
            f"so the whole conversation was streamed through a fresh one"))
    if not croppable:
        return ReusePlan("rebuild", 0, rebuild=True, note=(
            f"{where}{why}; this cache cannot be cropped now (quantized layers, or sliding layers that "
            f"have filled their window and dropped older tokens), so it was rebuilt from the whole conversation"))
    return ReusePlan("crop", usable, crop_tokens=len(cached_ids) - usable, note=(
        f"{where}{why}; the cache was cropped by {len(cached_ids) - usable} tokens "
        f"to the common prefix of {usable}"))


def held_tokens(cache) -> int:
    """Tokens a cache has taken in, read on its first layer that is not a sliding window (a sliding layer
    stops at its window; the full-attention layers say how long the conversation is). 0 for None."""
    if cache is None:
        return 0
    layers = getattr(cache, "layers", None) or []
    index = next((i for i, layer in enumerate(layers) if not getattr(layer, "is_sliding", False)), 0)
    return int(cache.get_seq_length(index))


@dataclass
class Reply:
    """One generated reply: token ids, text and timings (seconds).

    ttft_s: from `started` (crop and copy included) to the first token chosen.
    per_token_s: every decode step after the first token (forward + choice).
    stop_reason: eos | length | stopped. fallbacks: the `kvlab.budget.Fallback`s of a budgeted reply.
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    ttft_s: float = 0.0
    per_token_s: list[float] = field(default_factory=list)
    stop_reason: str = "length"
    fallbacks: list = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second over the decode steps (the first token is prefill), None if there were none."""
        total = sum(self.per_token_s)
        return len(self.per_token_s) / total if self.per_token_s and total > 0 else None


def reply_stream(loaded, strategy, cache, input_ids: Sequence[int], feed_from: int, settings: GenerationSettings,
                 reply: Reply, seed: int | None = None, stop: threading.Event | None = None,
                 started: float | None = None, on_fed: Callable[[list[int]], None] | None = None,
                 budget=None, on_switch: Callable | None = None) -> Iterator[tuple[int, str]]:
    """Feed `input_ids[feed_from:]` into `cache` (which holds the rest), then generate, yielding
    (token id, text it added) per token and filling `reply` as it goes.

    One engine step per token (`kvlab.engine.Decoder`, through `strategy.forward`); the last chosen token
    is not fed back. `on_fed` gets the ids each forward fed, right after it. `stop` ends the reply after the
    token in hand, so a reply has at least one token. With a `kvlab.budget.Budget`, a step that would outgrow
    it first moves the reply to the next cache of the chain (re-prefilling every id so far); `on_switch`
    gets (the `Fallback`, the new strategy, its cache, the chain left) before that step's `on_fed`.

    Raises:
        ValueError: `feed_from` out of range.
    """
    started = time.perf_counter() if started is None else started
    decoder = Decoder(loaded, strategy, cache, input_ids, settings, feed_from=feed_from, seed=seed,
                      measure_bytes=budget is not None)
    steps = decoder if budget is None else ResilientSteps(loaded, decoder, budget,
                                                          len(input_ids) + settings.max_new_tokens)
    switches = getattr(steps, "fallbacks", [])
    detok = IncrementalDetokenizer(loaded.tokenizer)
    for step in steps:
        if step.index == 0:
            reply.ttft_s = time.perf_counter() - started
        else:
            reply.per_token_s.append(step.per_token_s)
        for switch in switches[len(reply.fallbacks):]:
            reply.fallbacks.append(switch)
            if on_switch is not None:
                on_switch(switch, decoder.strategy, decoder.cache, list(steps.chain))
        if on_fed is not None:
            on_fed(list(step.fed_ids))
        reply.token_ids.append(step.token_id)
        delta = detok.push(step.token_id)
        reply.text = detok.text
        reply.stop_reason = decoder.stop_reason or "length"
        yield step.token_id, delta
        if decoder.stop_reason is None and stop is not None and stop.is_set():
            reply.stop_reason = "stopped"
            return


def generate_reply(loaded, strategy, cache, input_ids: Sequence[int], feed_from: int, settings: GenerationSettings,
                   seed: int | None = None) -> Reply:
    """`reply_stream` run to the end in this thread; returns the filled `Reply`."""
    reply = Reply()
    for _ in reply_stream(loaded, strategy, cache, input_ids, feed_from, settings, reply, seed):
        pass
    return reply


def time_to_first_token(loaded, strategy, cache, input_ids: Sequence[int], settings: GenerationSettings,
                        seed: int | None = None) -> tuple[int, float]:
    """Prefill all of `input_ids` into the (empty) `cache` and choose one token: (token id, seconds)."""
    started = time.perf_counter()
    step = next(Decoder(loaded, strategy, cache, input_ids, settings, seed=seed))
    return step.token_id, time.perf_counter() - started
