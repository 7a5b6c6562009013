"""Multi-turn chat that keeps one KV cache across turns, and measures what reuse saves.

A `ChatSession` holds the conversation, one transformers `Cache` and the exact
token ids that went through that cache. Each turn renders the whole
conversation with the tokenizer's chat template, compares its ids with the
cached ids and feeds only what the cache does not hold yet:

- `reuse`: the input starts with the cached ids, only the new tail is fed.
- `crop`: the input diverges from the cached ids (undo, regenerate, or the
  template re-tokenized a reply differently from how it was generated); the
  cache is cropped to the common prefix (`Cache.crop(-n)`) and the rest is fed.
- `rebuild`: the cache cannot be cropped (quantized layers), or it was dropped
  (strategy changed, static cache grown); the whole input is fed into a fresh cache.
- `stream`: a sink cache (StreamingLLM) holds only its window, so its ids are
  not a prefix of the conversation; the ids streamed through it are tracked
  instead, only the new turn's tokens are fed, and the history before them lives
  on only as the window.
- `fresh`: the first turn.

The last generated token is not in the cache when generation stops (it was
chosen but never fed back); it is tracked and fed with the next turn.

After each turn the same input can be re-run "without reuse" (the whole history
prefilled into an empty cache of the same strategy, honestly timed), and with
`verify` the whole reply is generated again that way and compared.

With a cache budget (`kvlab.budget.Budget`), a reply that would outgrow it moves
the conversation's cache to the next strategy of the fallback chain (every id so
far re-prefilled into it); later turns go on with that cache, and the turn's
stats list the switch.

How much to reuse is decided by `kvlab.chat.reuse.plan_reuse` from the strategy's
capabilities (`can_crop`, `is_streaming`, `capacity`); the tokens go through
the engine (`kvlab.engine`), so a strategy's own forward (e.g. a compiled static
decode step) applies in chat exactly as in Compare. This module runs and
measures; it does not render. It never imports gradio.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

from ..accounting import cache_bytes
from ..compute import compute_iter
from ..generation import GenerationSettings, encode_prompt
from .reuse import ReusePlan, Reply, generate_reply, held_tokens, plan_reuse, reply_stream, suggested_capacity
from .reuse import time_to_first_token
from .events import ChatEvent, ChatStatus, ChatToken, ChatTurnDone, ChatTurnFailed, TurnStats
from ..strategies import Strategy, StrategyError

PLAIN_TEXT_NOTE = ("base model (no chat template): the conversation is joined as plain text, one 'User: ...' / "
                   "'Assistant: ...' line per turn, and the model continues it (it may write the next 'User:' "
                   "line itself)")
"""What a chat turn on a base model says it did."""
DEFAULT_CHAT_CACHE_TOKENS = 1024
"""Capacity (tokens) given to a preallocating cache (static) whose `max_cache_len` is not set."""


class ChatInputError(ValueError):
    """A message cannot be sent (empty, too long, nothing to regenerate); nothing was run."""


class ChatCapacityError(ChatInputError):
    """The conversation plus the reply would outgrow a fixed-size (static) cache.

    Attributes:
        needed: tokens the next turn needs (conversation + max_new_tokens).
        capacity: tokens the cache holds at most.
        suggested: a capacity with room for a few more turns, a multiple of CAPACITY_ROUNDING.
    """

    def __init__(self, needed: int, capacity: int):
        self.needed = needed
        self.capacity = capacity
        self.suggested = suggested_capacity(needed)
        super().__init__(
            f"the conversation needs {needed} tokens (history + max_new_tokens) but the static cache holds "
            f"max_cache_len={capacity}: rebuild it larger (max_cache_len={self.suggested}), switch to the dynamic "
            f"strategy, or clear the conversation"
        )


class ChatSession:
    """One conversation with one cache kept across turns. Not thread-safe: one session per user.

    `cache` is the transformers Cache; `cached_ids` are exactly the ids that went
    through it, in order (for a sink cache: every id streamed through it), kept
    in step after every forward, so a reply interrupted at any token leaves them
    consistent. `refused` is the last `ChatCapacityError` (None after a turn that fit).

    Args:
        loaded: a `kvlab.models.LoadedModel` (a base model's turns are joined as plain text, `PLAIN_TEXT_NOTE`).
        strategy: a cache strategy that keeps a cache (see `set_strategy`).
        settings: generation settings for every turn (may be replaced between turns).
        system: system prompt ('' = the template's default, if it has one).
        budget: a `kvlab.budget.Budget` for the conversation's cache (None: none). `picked` keeps the strategy
            as chosen; `strategy` is the one in use, which a budget may have moved down its chain.

    Raises:
        StrategyError: the strategy keeps no cache or cannot run here.
    """

    def __init__(self, loaded, strategy: Strategy, settings: GenerationSettings | None = None, system: str = "",
                 budget=None):
        self.loaded = loaded
        self.settings = settings or GenerationSettings()
        self.system = system
        self.history: list[dict] = []
        self.turns: list[TurnStats] = []
        self.cache = None
        self.cached_ids: list[int] = []
        self.generations = 0
        self.refused: ChatCapacityError | None = None
        self._reason = ""
        self.strategy = self.picked = self._checked(strategy)
        self.budget = self.given_budget = budget

    def set_budget(self, budget) -> None:
        """Use `budget` (a `kvlab.budget.Budget`, or None) from the next turn on; the same one again keeps what
        is left of its chain."""
        if budget != self.given_budget:
            self.budget = self.given_budget = budget

    def _checked(self, strategy: Strategy) -> Strategy:
        if not strategy.usable_in_chat:
            raise StrategyError(f"{strategy.name} keeps no cache, so there is nothing to reuse across turns")
        reason = strategy.unavailable_reason(self.loaded)
        if reason:
            raise StrategyError(f"{strategy.describe()} cannot run here: {reason}")
        return strategy

    def set_strategy(self, strategy: Strategy) -> None:
        """Use `strategy` from the next turn on; the cache is dropped and the next turn rebuilds it.

        Raises:
            StrategyError: the strategy keeps no cache (no_cache), or cannot run on this model here.
        """
        self.strategy = self.picked = self._checked(strategy)
        self.drop_cache(f"the strategy changed to {strategy.describe()}")

    def drop_cache(self, reason: str) -> None:
        """Forget the cache; the next turn prefills the whole conversation into a new one and says `reason`."""
        self.cache, self.cached_ids = None, []
        self._reason = reason

    def grow_cache(self, capacity: int | None = None) -> int:
        """Switch a static strategy to `max_cache_len=capacity`.

        The default is the suggestion of the last refused turn, else room for the
        conversation so far plus a few turns (`suggested_capacity`).

        The cache is rebuilt at the next turn. Returns the new capacity.

        Raises:
            StrategyError: the strategy has no `max_cache_len`.
        """
        if not hasattr(self.strategy, "max_cache_len"):
            raise StrategyError(f"{self.strategy.name} has no max_cache_len to grow; "
                                "only static caches have a fixed size")
        if capacity is None and self.refused is not None:
            capacity = self.refused.suggested
        elif capacity is None:
            capacity = suggested_capacity(self.needed_tokens() if self.history else self.capacity() or 1)
        self.strategy = self._checked(dataclasses.replace(self.strategy, max_cache_len=capacity))
        self.drop_cache(f"the static cache was rebuilt with max_cache_len={capacity}")
        self.refused = None
        return capacity

    def messages(self, history: list[dict] | None = None) -> list[dict]:
        """The system message (if any) followed by `history` (default: the conversation)."""
        system = [{"role": "system", "content": self.system}] if self.system.strip() else []
        return system + list(self.history if history is None else history)

    def input_ids(self, history: list[dict] | None = None) -> list[int]:
        """Ids of the conversation rendered by the chat template with the generation prompt; for a base model
        (no chat template) the turns joined as plain text (`kvlab.generation.plain_conversation`).

        Raises:
            ChatInputError: the conversation is empty or too long.
        """
        try:
            return encode_prompt(self.loaded.tokenizer, self.messages(history))[0].tolist()
        except ValueError as err:
            raise ChatInputError(str(err)) from err

    def new_cache(self):
        """A fresh, empty cache of the session's strategy (DEFAULT_CHAT_CACHE_TOKENS if it needs a size)."""
        return self.strategy.build_cache(self.loaded, DEFAULT_CHAT_CACHE_TOKENS)

    def capacity(self) -> int | None:
        """Most tokens the strategy's cache holds, or None when it grows or streams."""
        return self.strategy.capacity(DEFAULT_CHAT_CACHE_TOKENS)

    def needed_tokens(self, history: list[dict] | None = None) -> int:
        """Tokens a turn on `history` needs: its rendered input plus max_new_tokens."""
        return len(self.input_ids(history)) + self.settings.max_new_tokens

    def send(self, text: str, baseline: bool = True, verify: bool = False,
             stop: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Add a user message and stream the turn as events; the last is ChatTurnDone or ChatTurnFailed.

        Every check runs before this returns, so an error leaves the session untouched.
        The conversation changes only when the turn is done.

        Args:
            text: the user message.
            baseline: also time the same input without reuse (an empty cache prefilled with the whole conversation).
            verify: also generate the whole reply without reuse and compare token ids (implies baseline).
            stop: set it to end the reply within a token.

        Raises:
            ChatInputError: empty message, conversation too long.
            ChatCapacityError: a static cache too small for the conversation plus max_new_tokens.
            ValueError: invalid generation settings.
        """
        if not isinstance(text, str) or not text.strip():
            raise ChatInputError("the message is empty: type something to send")
        history = self.history + [{"role": "user", "content": text}]
        return compute_iter(self._turn(history, self._prepare(history), baseline, verify, stop))

    def regenerate(self, baseline: bool = True, verify: bool = False,
                   stop: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Replace the last reply with a new one for the same user message; events and errors as `send`."""
        if not self.history or self.history[-1]["role"] != "assistant":
            raise ChatInputError("there is no reply to regenerate yet: send a message first")
        history = self.history[:-1]
        ids = self._prepare(history)
        self._reason = self._reason or "regenerate replaces the last reply"
        return compute_iter(self._turn(history, ids, baseline, verify, stop))

    def undo(self) -> bool:
        """Remove the last user message and its reply. Returns False when there is nothing to undo.

        The cache is left as is: the next turn crops it to the shorter conversation (or rebuilds it).
        """
        if not self.history:
            return False
        cut = max((i for i, m in enumerate(self.history) if m["role"] == "user"), default=0)
        self.history = self.history[:cut]
        self.turns = self.turns[:_user_count(self.history)]
        self._reason = "undo removed the last turn"
        return True

    def clear(self) -> None:
        """Forget the conversation, its stats and the cache (the system prompt and strategy stay)."""
        self.history, self.turns = [], []
        self.cache, self.cached_ids = None, []
        self._reason = ""

    def set_system(self, text: str) -> None:
        """Change the system prompt; the next turn reuses the cache only as far as the ids still agree."""
        if text != self.system:
            self.system = text
            self._reason = "the system prompt changed"

    def _prepare(self, history: list[dict]) -> list[int]:
        self.settings.check()
        ids = self.input_ids(history)
        capacity = self.capacity()
        needed = len(ids) + self.settings.max_new_tokens
        self.refused = ChatCapacityError(needed, capacity) if capacity is not None and needed > capacity else None
        if self.refused is not None:
            raise self.refused
        return ids

    def _turn(self, history: list[dict], ids: list[int], baseline: bool, verify: bool,
              stop: threading.Event | None) -> Iterator[ChatEvent]:
        seed = self.settings.seed + self.generations
        self.generations += 1
        reply = Reply()
        done = False
        try:
            try:
                started = time.perf_counter()
                plan = self._apply_plan(ids, history)
                for token_id, delta in reply_stream(self.loaded, self.strategy, self.cache, ids, plan.reused_tokens,
                                                    self.settings, reply, seed, stop, started, self.cached_ids.extend,
                                                    self.budget, self._switched):
                    yield ChatToken(token_id, delta)
                tracked = not (self.strategy.is_streaming or self.strategy.is_evicting)
                if tracked and held_tokens(self.cache) != len(self.cached_ids):
                    raise RuntimeError(f"the cache holds {held_tokens(self.cache)} tokens but "
                                       f"{len(self.cached_ids)} ids were tracked")
            except Exception as err:  # noqa: BLE001 - a failure ends this turn only, reported as an event
                self.drop_cache("the previous turn failed, so its cache was dropped")
                done = True
                yield ChatTurnFailed(f"{type(err).__name__}: {err}")
                return
            note = plan.note if self.loaded.has_chat_template else f"{PLAIN_TEXT_NOTE}; {plan.note}"
            stats = TurnStats(
                turn=_user_count(history), strategy=self.strategy.describe(), action=plan.action, note=note,
                input_tokens=len(ids), reused_tokens=plan.reused_tokens,
                prefilled_tokens=len(ids) - plan.reused_tokens, cropped_tokens=plan.crop_tokens,
                generated_tokens=len(reply.token_ids), ttft_s=reply.ttft_s, decode_tok_s=reply.decode_tok_s,
                cache_tokens=held_tokens(self.cache), cache_bytes=cache_bytes(self.cache),
                stop_reason=reply.stop_reason, reply=reply.text, reply_ids=list(reply.token_ids),
                user=history[-1]["content"], lossy=self.strategy.lossy,
                fallbacks=[switch.to_json() for switch in reply.fallbacks],
            )
            stats.note = "; ".join(filter(None, [stats.note, *(switch.sentence() for switch in reply.fallbacks)]))
            if (baseline or verify) and reply.stop_reason == "stopped":
                stats.note += "; the reply was stopped, so it was not measured again without reuse"
            elif baseline or verify:
                yield ChatStatus("measuring the same turn without reuse (the whole history prefilled from scratch)")
                try:
                    self._measure_without_reuse(stats, ids, seed, verify)
                except Exception as err:  # noqa: BLE001 - the reply stands; only the comparison failed
                    stats.note += f"; the no-reuse measurement failed: {type(err).__name__}: {err}"
            self.history = history + [{"role": "assistant", "content": reply.text}]
            self.turns = self.turns[: stats.turn - 1] + [stats]
            self._reason = ""
            done = True
            yield ChatTurnDone(stats)
        finally:
            if not done:
                self._reason = "the previous reply was interrupted before it finished"

    def _switched(self, fallback, strategy: Strategy, cache, chain_left: list) -> None:
        """A budget moved the reply to `strategy`'s `cache`: keep it (and the chain left) for later turns; the
        ids re-prefilled into it are tracked by the step's `on_fed`."""
        self.strategy, self.cache = strategy, cache
        self.cached_ids.clear()  # in place: the reply's `on_fed` extends this list
        if self.budget is not None and self.budget.fallback is not None:
            self.budget = dataclasses.replace(self.budget, fallback=tuple(chain_left))

    def _apply_plan(self, ids: list[int], history: list[dict]) -> ReusePlan:
        reason = self._reason
        if self.cache is None:
            self.cache, self.cached_ids = self.new_cache(), []
            if _user_count(history) > 1:
                why = reason or "there was no cache yet"
                return ReusePlan("rebuild", 0, rebuild=True,
                                 note=f"{why}: the whole conversation was prefilled into a new cache")
        croppable = self.strategy.can_crop(self.loaded, self.cache, len(self.cached_ids))
        plan = plan_reuse(self.cached_ids, ids, croppable, self.strategy.is_streaming, reason)
        if plan.rebuild:
            self.cache, self.cached_ids = self.new_cache(), []
        elif plan.crop_tokens:
            self.cache.crop(-plan.crop_tokens)
            del self.cached_ids[plan.reused_tokens:]
        return plan

    def _measure_without_reuse(self, stats: TurnStats, ids: list[int], seed: int, verify: bool) -> None:
        if verify:
            fresh = generate_reply(self.loaded, self.strategy, self.new_cache(), ids, 0, self.settings, seed)
            stats.no_reuse_ttft_s = fresh.ttft_s
            stats.verify_reply = fresh.text
            stats.match = fresh.token_ids == stats.reply_ids
        else:
            _, stats.no_reuse_ttft_s = time_to_first_token(self.loaded, self.strategy, self.new_cache(), ids,
                                                           self.settings, seed)
        stats.saved_s = stats.no_reuse_ttft_s - stats.ttft_s


def _user_count(history: list[dict]) -> int:
    return sum(1 for message in history if message["role"] == "user")
