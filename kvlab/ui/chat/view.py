"""The Chat tab's pure part: the form -> a strategy and settings, `kvlab.chat.session` events -> what the page shows.

- `ChatForm` holds the tab's inputs (model, strategy card with its cache budget
  and fallback chain, system prompt, budget, measure/verify); `strategy()` and
  `cache_budget()` build them from the card exactly as Compare does
  (`kvlab.ui.shared.knobs`), from the strategies whose `usable_in_chat` is true.
- `ready_session` creates or updates a browser session's `ChatSession` to match the form.
- `start_view` / `apply_event` fold a turn's events into a `TurnView`
  (messages, status line, final stats or failure); `turn_markdown`,
  `turns_frame`, `prefix_markdown`, `prefix_frame` render stats; `shown_messages` is what the chatbot gets
  (every message's text literal: the visitor's and the model's text is never markup on the page).
- `prefix_refusal` says why the prefix panel cannot use a strategy (its
  `usable_in_prefix` capability), before any model is loaded.

No gradio; tests feed it fake events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import yaml

from kvlab.chat.events import ChatStatus, ChatToken, ChatTurnDone, ChatTurnFailed, TurnStats, turn_rows
from kvlab.chat.session import ChatSession
from kvlab.generation import GenerationSettings
from kvlab.models.loading import ModelSpec
from kvlab.presets import PRESETS_DIR
from kvlab.strategies import Strategy
from kvlab.strategies.base import names_with

from .sessions import ChatTabState
from ..shared.knobs import column_budget, strategy_from_card
from ..shared.markup import chat_text, md_text

CHAT_CAPABILITY = "usable_in_chat"
PREFIX_CAPABILITY = "usable_in_prefix"
DEFAULT_STRATEGY = "dynamic"
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_STATIC_LEN = 512
PREFILLED_KNOBS = {"static": {"max_cache_len": DEFAULT_STATIC_LEN}}
"""Knob values the chat card shows instead of the dataclass defaults (a static chat cache gets a size)."""
TURN_COLUMNS = ["turn", "action", "reused", "prefilled", "cropped", "generated", "ttft_s", "no_reuse_ttft_s",
                "saved_s", "decode_tok_s", "cache_tokens", "cache_bytes", "match"]
PREFIX_COLUMNS = ["prompt", "reply", "reused", "prefilled", "with_reuse_s", "without_reuse_s", "saved_s", "match"]


def chat_strategy_choices() -> list[str]:
    """Registered strategies a chat can keep across turns (`usable_in_chat`), in registry order."""
    return names_with(CHAT_CAPABILITY)


def prefilled_knobs(name: str) -> dict:
    """The knob values the chat card starts with for strategy `name` (PREFILLED_KNOBS, else the defaults)."""
    return dict(PREFILLED_KNOBS.get(name, {}))


@dataclass
class ChatForm:
    """The chat tab's inputs as the page sends them (not yet validated)."""

    source: str = "bundled"
    strategy_name: str = DEFAULT_STRATEGY
    knobs: list[str] = field(default_factory=list)
    system: str = ""
    max_new_tokens: float | int = DEFAULT_MAX_NEW_TOKENS
    measure: bool = True
    verify: bool = False
    budget_text: str = ""
    fallback_text: str = ""

    def model_spec(self, base: ModelSpec) -> ModelSpec:
        """`base` (dtype, device) with this form's model source ('' means bundled)."""
        return ModelSpec.from_field(self.source, base.dtype, base.device)

    def strategy(self) -> Strategy:
        """The strategy the card describes.

        Raises:
            StrategyError: a strategy not usable in chat, or an invalid knob (the message lists allowed values).
        """
        return strategy_from_card(self.strategy_name, self.knobs, chat_strategy_choices())

    def settings(self) -> GenerationSettings:
        return GenerationSettings(max_new_tokens=int(self.max_new_tokens), fidelity=False)

    def cache_budget(self):
        """The card's cache budget and fallback chain as a `kvlab.budget.Budget` (None when both are empty).

        Raises:
            StrategyError: a budget that is not a positive number of MiB, or a bad chain.
        """
        return column_budget(self.budget_text, self.fallback_text)


def ready_session(state: ChatTabState | None, loaded, form: ChatForm) -> ChatTabState:
    """The session's state with its ChatSession matching the form (created, moved to another model, or updated).

    Raises:
        StrategyError: the picked strategy is invalid or cannot run on `loaded`.
        ValueError: invalid max_new_tokens.
    """
    state = state or ChatTabState()
    chosen, settings, system, budget = form.strategy(), form.settings(), form.system or "", form.cache_budget()
    if state.session is None or state.session.loaded is not loaded:
        old = state.session
        state.session = ChatSession(loaded, chosen, settings, system)
        if old is not None:
            state.session.history = list(old.history)
    elif state.session.picked != chosen:
        state.session.set_strategy(chosen)
    state.session.settings = settings
    state.session.set_budget(budget)
    state.session.set_system(system)
    return state


def prefix_refusal(strategy: Strategy) -> str | None:
    """Why the prefix panel cannot use `strategy` (its `usable_in_prefix` is false), or None when it can."""
    if strategy.usable_in_prefix:
        return None
    why = ("it keeps no cache, so there is no prefix to copy" if not strategy.use_cache else
           "it streams through a window and evicts tokens, so a copy would not hold the whole prefix")
    return (f"prefix reuse copies a whole prefilled cache and {strategy.describe()} cannot: {why}; "
            f"pick one of {', '.join(names_with(PREFIX_CAPABILITY))}")


def prompt_lines(text: str | None) -> list[str]:
    """The prefix panel's prompts: one per non-empty line."""
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


@dataclass
class TurnView:
    """What the page shows while a turn streams: chat messages, a status line, the final stats or error."""

    messages: list[dict]
    status: str = ""
    stats: TurnStats | None = None
    failed: str | None = None


def start_view(history: list[dict], user_text: str | None) -> TurnView:
    """The conversation plus the new user message (None for regenerate) and an empty reply bubble."""
    messages = [dict(m) for m in history]
    if user_text is not None:
        messages.append({"role": "user", "content": user_text})
    messages.append({"role": "assistant", "content": ""})
    return TurnView(messages, status="generating…")


def apply_event(view: TurnView, event) -> TurnView:
    """Fold one `kvlab.chat.session` event into the view (mutates and returns it)."""
    if isinstance(event, ChatToken):
        view.messages[-1]["content"] += event.text
    elif isinstance(event, ChatStatus):
        view.status = event.text
    elif isinstance(event, ChatTurnDone):
        view.stats = event.stats
        view.messages[-1]["content"] = event.stats.reply
        view.status = ""
    elif isinstance(event, ChatTurnFailed):
        view.failed = event.message
        view.status = ""
    return view


def shown_messages(messages: list[dict]) -> list[dict]:
    """The chatbot's value for `messages` (role/content dicts): copies whose text content is escaped
    (`kvlab.ui.shared.markup.chat_text`) for the tab's `gr.Chatbot(render_markdown=False)`, so a message shows
    as typed or generated, tags, code and angle brackets included; the conversation itself keeps the text."""
    return [{**message, "content": chat_text(message["content"])} if isinstance(message.get("content"), str)
            else dict(message) for message in messages]


def _fmt_s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def turn_markdown(stats: TurnStats | None) -> str:
    """The last turn's numbers in a few Markdown lines ('' before the first turn)."""
    if stats is None:
        return ""
    tok_s = "–" if stats.decode_tok_s is None else f"{stats.decode_tok_s:.1f} tok/s"
    lines = [
        f"**Turn {stats.turn}** · {md_text(stats.strategy)} · cache **{md_text(stats.action)}**",
        f"- tokens: **{stats.reused_tokens} reused** from the cache, **{stats.prefilled_tokens} newly prefilled** "
        f"(of {stats.input_tokens} in the conversation), {stats.generated_tokens} generated"
        + (" (stopped)" if stats.stop_reason == "stopped" else "")
        + (f", {stats.cropped_tokens} cropped" if stats.cropped_tokens else ""),
        f"- TTFT **{_fmt_s(stats.ttft_s)}** with reuse · decode {tok_s} · cache {stats.cache_tokens} tokens, "
        f"{stats.cache_bytes:,} bytes",
    ]
    if stats.no_reuse_ttft_s is not None:
        lines.append(f"- without reuse (whole history re-prefilled): TTFT {_fmt_s(stats.no_reuse_ttft_s)} · "
                     f"{saving_text(stats)}")
    if stats.match is not None:
        verdict = "identical" if stats.match else "different" + (" (lossy cache)" if stats.lossy else "")
        lines.append(f"- reply without reuse: **{verdict}**")
    if stats.note:
        lines.append(f"- {md_text(stats.note)}")
    return "\n".join(lines)


def saving_text(stats: TurnStats) -> str:
    """What reusing the cache saved this turn. A reused turn does strictly less work than the same turn
    re-prefilled, so a negative difference of two single measurements is the machine's noise (other work ran
    during the reused turn), shown as within noise, never as a loss."""
    if stats.reused_tokens == 0:
        return (f"saved {_fmt_s(stats.saved_s)} (this turn reused nothing, so both did the same work: the difference "
                "is noise)")
    if stats.saved_s is not None and stats.saved_s < 0:
        return (f"saved: **within noise** (the reused turn's TTFT came out {_fmt_s(-stats.saved_s)} slower: it did "
                "less work, so other work on the machine made the difference; one measurement each)")
    return f"saved **{_fmt_s(stats.saved_s)}** (one measurement each)"


def turns_frame(turns: list[TurnStats]) -> pd.DataFrame:
    """One row per turn: tokens, TTFT with/without reuse (s), saved (s; a reused turn whose saving came out
    negative reads "within noise", see `saving_text`), decode tok/s, cache tokens/bytes."""
    rows = turn_rows(turns)
    for row, stats in zip(rows, turns):
        if stats.reused_tokens and row["saved_s"] is not None and row["saved_s"] < 0:
            row["saved_s"] = f"within noise ({row['saved_s']:+.3f})"
    return pd.DataFrame(rows, columns=TURN_COLUMNS)


def prefix_frame(report) -> pd.DataFrame:
    """One row per prompt of a `kvlab.chat.prefix.PrefixReport`: reply, times with/without reuse (s), saved, match."""
    return pd.DataFrame([
        {"prompt": r.prompt, "reply": r.reply, "reused": r.reused_tokens, "prefilled": r.prefilled_tokens,
         "with_reuse_s": round(r.with_reuse_s, 4), "without_reuse_s": round(r.without_reuse_s, 4),
         "saved_s": round(r.saved_s, 4), "match": r.match}
        for r in report.results
    ], columns=PREFIX_COLUMNS)


def prefix_markdown(report) -> str:
    """Totals of a prefix run: prefix prefilled once, time with and without reuse, saved, matches."""
    matches = sum(r.match for r in report.results)
    lossy = " (lossy cache: differences are expected)" if report.lossy and matches < len(report.results) else ""
    return (
        f"**{md_text(report.strategy)}** · prefix of **{report.prefix_tokens} tokens** prefilled once in "
        f"{report.prefix_prefill_s:.3f} s · {len(report.results)} prompts answered from copies of its cache\n\n"
        f"- total with reuse: **{report.total_with_s:.3f} s** (prefix prefill + copies + prompt prefills) · "
        f"without reuse: **{report.total_without_s:.3f} s** · saved **{report.total_saved_s:.3f} s**\n"
        f"- replies identical to a run without reuse: **{matches}/{len(report.results)}**{lossy}\n"
        f"- the shared cache still holds {report.prefix_cache_tokens} tokens, {report.prefix_cache_bytes:,} bytes"
    )


def default_prefix_texts() -> tuple[str, str]:
    """(shared document, prompts one per line) the prefix panel starts with, from presets/."""
    try:
        document = (PRESETS_DIR / "prefix_document.txt").read_text(encoding="utf-8").strip()
        prompts = yaml.safe_load((PRESETS_DIR / "prefix_prompts.yaml").read_text(encoding="utf-8")) or []
        return document, "\n".join(str(p) for p in prompts)
    except (OSError, yaml.YAMLError):
        return "", ""
