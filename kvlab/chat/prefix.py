"""Prefix-cache reuse: prefill a shared prefix once, answer K prompts from copies of it.

A shared prefix (a system prompt or a document) is prefilled once into a cache
of the chosen strategy. Each prompt then starts from a deep copy of that cache
(`copy_cache`), so the original stays untouched and can serve the next prompt,
and only the prompt's own tokens are prefilled. Every prompt is also run without
reuse (prefix + prompt prefilled into an empty cache) and the two replies are
compared token by token; prefill times with and without reuse are reported per
prompt and in total.

The copies come from kvlab's one cache copier, `kvlab.caches.copying.copy_cache`.

This module runs and measures; it does not render.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..accounting import cache_bytes
from ..caches.copying import clone_tensor, copy_cache  # noqa: F401 - clone_tensor re-exported
from ..compute import compute
from ..engine import forward
from ..generation import GenerationSettings, encode_prompt
from .reuse import Reply, common_prefix_length, generate_reply, held_tokens, reply_stream
from ..strategies import Strategy, StrategyError

MAX_PROMPTS = 32
"""Most prompts one prefix run answers."""


@dataclass
class PrefixCache:
    """A prefilled shared prefix.

    cache: the transformers Cache holding `ids` (never extended: prompts use copies).
    ids: the prefix token ids, (prefix_tokens,). prefill_s: seconds to prefill it (0 if filled elsewhere).
    max_total_tokens: the run size its cache was built for (a fresh cache, when a copy cannot serve, gets the
    same size; None = the input's length).
    """

    cache: object
    ids: list[int]
    prefill_s: float = 0.0
    max_total_tokens: int | None = None


def prefill_prefix(loaded, strategy: Strategy, prefix_ids: Sequence[int], max_total_tokens: int) -> PrefixCache:
    """Prefill `prefix_ids` into a new cache of `strategy` sized for `max_total_tokens`.

    Runs under `torch.inference_mode()`; times the forward in seconds.

    Raises:
        StrategyError: the strategy keeps no cache, streams (sink), or cannot run here.
        ValueError: empty `prefix_ids`.
    """
    check_prefix_strategy(loaded, strategy)
    if not prefix_ids:
        raise ValueError("the prefix is empty: give a system prompt or a document")
    cache = strategy.build_cache(loaded, max_total_tokens)
    ids = torch.tensor([list(prefix_ids)], device=loaded.device)
    started = time.perf_counter()
    forward(loaded, strategy, cache, ids, ids.shape[1])
    return PrefixCache(cache, list(prefix_ids), time.perf_counter() - started, max_total_tokens)


def check_prefix_strategy(loaded, strategy: Strategy) -> None:
    """Raise StrategyError unless `strategy` keeps a whole, copyable cache that can run here."""
    if not strategy.use_cache:
        raise StrategyError(f"{strategy.name} keeps no cache, so there is no prefix to reuse")
    if not strategy.usable_in_prefix:
        raise StrategyError(f"{strategy.describe()} streams through a window and evicts tokens: "
                            "a prefix copy would not hold the whole prefix; use dynamic, static or quantized")
    reason = strategy.unavailable_reason(loaded)
    if reason:
        raise StrategyError(f"{strategy.describe()} cannot run here: {reason}")


def prefix_and_prompt_ids(tokenizer, prefix: str, prompt: str, chat: bool = True) -> tuple[list[int], list[int]]:
    """(prefix ids, full input ids) for one prompt after a shared prefix.

    chat=True: the prefix is the system message (rendered alone, without the
    generation prompt) and the prompt the user message after it; the full input
    normally starts with the prefix ids (`run_prefix_reuse` checks). chat=False:
    both are tokenized as plain text and concatenated, so the prefix is exact.

    Raises:
        ValueError: empty prefix or prompt, or a chat prefix without a chat template.
    """
    if not prefix.strip():
        raise ValueError("the prefix is empty: give a system prompt or a document")
    if not prompt.strip():
        raise ValueError("a prompt is empty: every prompt needs some text")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template: use plain text (chat=False)")
        system = [{"role": "system", "content": prefix}]
        encoded = tokenizer.apply_chat_template(system, add_generation_prompt=False, return_tensors="pt")
        prefix_ids = (encoded if isinstance(encoded, torch.Tensor) else encoded["input_ids"])[0].tolist()
        full = encode_prompt(tokenizer, system + [{"role": "user", "content": prompt}])[0].tolist()
        return prefix_ids, full
    prefix_ids = tokenizer(prefix)["input_ids"]
    return prefix_ids, prefix_ids + tokenizer(prompt, add_special_tokens=False)["input_ids"]


@dataclass
class PromptResult:
    """One prompt answered with and without reuse. Times in seconds, counts in tokens.

    with_reuse_s: copy of the prefix cache + prefill of the prompt's own tokens + first token.
    copy_s: the deep copy alone. without_reuse_s: prefix + prompt prefilled into an empty cache + first token.
    saved_s: without_reuse_s - with_reuse_s. match: the two replies' token ids are equal.
    """

    prompt: str
    input_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    reply: str
    reply_ids: list[int]
    with_reuse_s: float
    copy_s: float
    without_reuse_s: float
    saved_s: float
    no_reuse_reply: str
    match: bool
    note: str = ""


@dataclass
class PrefixReport:
    """A whole prefix run. Times in seconds, sizes in bytes.

    total_with_s: the prefix prefill once plus every prompt's with_reuse_s.
    total_without_s: every prompt's without_reuse_s. total_saved_s: their difference.
    prefix_cache_bytes/prefix_cache_tokens: the shared cache after the run (unchanged by the prompts).
    """

    strategy: str
    lossy: bool
    prefix_tokens: int
    prefix_prefill_s: float
    prefix_cache_tokens: int
    prefix_cache_bytes: int
    results: list[PromptResult] = field(default_factory=list)

    @property
    def total_with_s(self) -> float:
        return self.prefix_prefill_s + sum(r.with_reuse_s for r in self.results)

    @property
    def total_without_s(self) -> float:
        return sum(r.without_reuse_s for r in self.results)

    @property
    def total_saved_s(self) -> float:
        return self.total_without_s - self.total_with_s

    def to_json(self) -> dict:
        record = dataclasses.asdict(self)
        record.update(total_with_s=self.total_with_s, total_without_s=self.total_without_s,
                      total_saved_s=self.total_saved_s)
        return record


def answer_from_prefix(loaded, strategy: Strategy, shared: PrefixCache, input_ids: Sequence[int],
                       settings: GenerationSettings) -> tuple[Reply, float, int, str]:
    """Answer one input from a copy of `shared`: (reply, copy seconds, reused tokens, note).

    When `input_ids` does not start with all of `shared.ids` (a template that
    joins the prefix and the prompt differently), the copy is cropped to the
    common prefix, or, for caches that cannot be cropped, a fresh cache is used.
    The reply's `ttft_s` counts from before the copy. `shared.cache` is not modified.
    """
    started = time.perf_counter()
    cache = copy_cache(shared.cache)
    copy_s = time.perf_counter() - started
    reused = min(common_prefix_length(shared.ids, input_ids), len(input_ids) - 1)
    note = ""
    if reused < len(shared.ids):
        if strategy.can_crop(loaded, cache, len(shared.ids)):
            cache.crop(-(len(shared.ids) - reused))
            note = f"the prompt's ids share only {reused} of the prefix's {len(shared.ids)} ids: the copy was cropped"
        else:
            cache, reused = strategy.build_cache(loaded, shared.max_total_tokens or len(input_ids)), 0
            note = "the prompt's ids do not start with the prefix ids and this cache cannot be cropped: no reuse"
    reply = Reply()
    for _ in reply_stream(loaded, strategy, cache, input_ids, reused, settings, reply, started=started):
        pass
    return reply, copy_s, reused, note


def run_prefix_reuse(loaded, strategy: Strategy, prefix: str, prompts: Sequence[str],
                     settings: GenerationSettings | None = None, chat: bool = True) -> PrefixReport:
    """Prefill `prefix` once, then answer every prompt from a copy of it and again without reuse.

    One untimed forward over the prefix runs first, so one-time kernel set-up for
    prefill-sized shapes is not billed to the shared prefill. Per prompt, the run
    with reuse goes first and the run without reuse right after it.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        strategy: dynamic, static or quantized (anything that keeps a whole cache; not sink, not no_cache).
        prefix: the shared system prompt or document.
        prompts: 1..MAX_PROMPTS user prompts.
        settings: generation settings (greedy by default, so `match` is meaningful).
        chat: render with the chat template (prefix = system message), else plain text.

    Raises:
        ValueError: no prompts, too many, an empty prefix or prompt, invalid settings.
        StrategyError: a strategy that cannot serve (see `check_prefix_strategy`), or a static
            `max_cache_len` smaller than the longest prompt plus max_new_tokens.
    """
    settings = settings or GenerationSettings()
    settings.check()
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts: give at least one prompt to answer after the prefix")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts, got {len(prompts)}")
    check_prefix_strategy(loaded, strategy)
    encoded = [prefix_and_prompt_ids(loaded.tokenizer, prefix, prompt, chat) for prompt in prompts]
    prefix_ids = encoded[0][0]
    longest = max(len(full) for _, full in encoded)
    strategy.check_fits(longest, settings.max_new_tokens)
    max_total = longest + settings.max_new_tokens
    return compute(_measure_prefix_reuse, loaded, strategy, prompts, encoded, prefix_ids, max_total, settings)


def _measure_prefix_reuse(loaded, strategy: Strategy, prompts: list[str], encoded: list, prefix_ids: list[int],
                          max_total: int, settings: GenerationSettings) -> PrefixReport:
    warm = torch.tensor([prefix_ids], device=loaded.device)
    forward(loaded, strategy, strategy.build_cache(loaded, max_total), warm, warm.shape[1])
    shared = prefill_prefix(loaded, strategy, prefix_ids, max_total)
    report = PrefixReport(strategy.describe(), strategy.lossy, len(prefix_ids), shared.prefill_s, 0, 0)
    for prompt, (_, full) in zip(prompts, encoded):
        reply, copy_s, reused, note = answer_from_prefix(loaded, strategy, shared, full, settings)
        fresh = generate_reply(loaded, strategy, strategy.build_cache(loaded, max_total), full, 0, settings)
        report.results.append(PromptResult(
            prompt=prompt, input_tokens=len(full), reused_tokens=reused, prefilled_tokens=len(full) - reused,
            reply=reply.text, reply_ids=list(reply.token_ids), with_reuse_s=reply.ttft_s, copy_s=copy_s,
            without_reuse_s=fresh.ttft_s, saved_s=fresh.ttft_s - reply.ttft_s, no_reuse_reply=fresh.text,
            match=fresh.token_ids == reply.token_ids, note=note,
        ))
    report.prefix_cache_tokens = held_tokens(shared.cache)
    report.prefix_cache_bytes = cache_bytes(shared.cache)
    return report
