"""What a chat turn streams and leaves: the typed events of `kvlab.chat.session.ChatSession.send` and the
per-turn `TurnStats`, with `turn_rows` for a table of turns. Plain data; nothing here runs a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChatToken:
    """One reply token: its id and the text it added (may be '' mid-character)."""

    token_id: int
    text: str


@dataclass(frozen=True)
class ChatStatus:
    """A phase of the turn, e.g. measuring without reuse."""

    text: str


@dataclass(frozen=True)
class ChatTurnDone:
    """The turn finished and was added to the conversation."""

    stats: TurnStats


@dataclass(frozen=True)
class ChatTurnFailed:
    """The turn failed; the conversation is as before it, the cache was dropped."""

    message: str


ChatEvent = ChatToken | ChatStatus | ChatTurnDone | ChatTurnFailed


@dataclass
class TurnStats:
    """What one turn did and cost. Times in seconds, sizes in bytes, counts in tokens.

    input_tokens: the whole rendered conversation fed this turn (history + new message + template glue).
    reused_tokens: input tokens served by the cache (not fed again).
    prefilled_tokens: input tokens fed this turn (input_tokens - reused_tokens).
    cropped_tokens: tokens removed from the cache end before feeding.
    cache_tokens: tokens held by the cache after the turn; cache_bytes: its tensor bytes.
    no_reuse_ttft_s: TTFT of the same input prefilled into an empty cache (None if not measured).
    saved_s: no_reuse_ttft_s - ttft_s. verify_reply/match: the reply generated without reuse and
    whether its token ids equal the reply's (None unless verified). fallbacks: the budget's switches to a
    smaller cache during the turn (`kvlab.budget.Fallback.to_json`).
    """

    turn: int
    strategy: str
    action: str
    note: str
    input_tokens: int
    reused_tokens: int
    prefilled_tokens: int
    cropped_tokens: int
    generated_tokens: int
    ttft_s: float
    decode_tok_s: float | None
    cache_tokens: int
    cache_bytes: int
    stop_reason: str
    reply: str
    reply_ids: list[int] = field(default_factory=list)
    user: str = ""
    no_reuse_ttft_s: float | None = None
    saved_s: float | None = None
    verify_reply: str | None = None
    match: bool | None = None
    lossy: bool = False
    fallbacks: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def turn_rows(turns: Sequence[TurnStats]) -> list[dict]:
    """One flat dict per turn for a table: tokens, times (s), bytes, action, match."""
    return [
        {
            "turn": t.turn,
            "action": t.action,
            "reused": t.reused_tokens,
            "prefilled": t.prefilled_tokens,
            "cropped": t.cropped_tokens,
            "generated": t.generated_tokens,
            "ttft_s": round(t.ttft_s, 4),
            "no_reuse_ttft_s": None if t.no_reuse_ttft_s is None else round(t.no_reuse_ttft_s, 4),
            "saved_s": None if t.saved_s is None else round(t.saved_s, 4),
            "decode_tok_s": None if t.decode_tok_s is None else round(t.decode_tok_s, 2),
            "cache_tokens": t.cache_tokens,
            "cache_bytes": t.cache_bytes,
            "match": t.match,
        }
        for t in turns
    ]
