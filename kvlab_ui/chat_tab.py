"""The chat tab: a multi-turn chat that keeps one KV cache per browser session, and a prefix-reuse panel.

`build_chat_tab(pool)` lays the tab out inside the caller's `gr.Tab` and wires
its events. Each browser session keeps its own `ChatTabState` (conversation,
cache, stop flag) in a `gr.State`; nothing lives in module globals except the
shared model pool. Backend work is `kvlab.chat` / `kvlab.prefix`; the pure
functions here turn their events and stats into chat messages, Markdown,
tables and plots (tested with fake events).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import gradio as gr
import pandas as pd
import yaml

from kvlab.chat import (
    ChatCapacityError,
    ChatInputError,
    ChatSession,
    ChatStatus,
    ChatToken,
    ChatTurnDone,
    ChatTurnFailed,
    TurnStats,
    turn_rows,
)
from kvlab.generation import MAX_NEW_TOKENS_CAP, GenerationSettings
from kvlab.models import ModelLoadError, ModelPool, ModelSpec
from kvlab.presets import PRESETS_DIR
from kvlab.strategies import STRATEGIES, StrategyError, make_strategy

CHAT_STRATEGIES = ("dynamic", "static", "quantized", "sink")
"""Strategies offered in the chat tab, when registered (sink appears once `STRATEGIES['sink']` exists)."""

PREFIX_STRATEGIES = ("dynamic", "static", "quantized")
"""Strategies the prefix panel can copy (a sink cache does not hold the whole prefix)."""

CHAT_CONCURRENCY = 2
"""Sessions that may generate at the same time (they share the model and the CPU cores)."""

DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_STATIC_LEN = 512
PLOT_SIZE_IN = (7.0, 2.6)


@dataclass
class ChatTabState:
    """One browser session's chat: its `ChatSession` (created at the first message) and its stop flag."""

    session: ChatSession | None = None
    stop: threading.Event = field(default_factory=threading.Event)


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
    """Fold one `kvlab.chat` event into the view (mutates and returns it)."""
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


def _fmt_s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def turn_markdown(stats: TurnStats | None) -> str:
    """The last turn's numbers in a few Markdown lines ('' before the first turn)."""
    if stats is None:
        return ""
    tok_s = "–" if stats.decode_tok_s is None else f"{stats.decode_tok_s:.1f} tok/s"
    lines = [
        f"**Turn {stats.turn}** · {stats.strategy} · cache **{stats.action}**",
        f"- tokens: **{stats.reused_tokens} reused** from the cache, **{stats.prefilled_tokens} newly prefilled** "
        f"(of {stats.input_tokens} in the conversation), {stats.generated_tokens} generated"
        + (" (stopped)" if stats.stop_reason == "stopped" else "")
        + (f", {stats.cropped_tokens} cropped" if stats.cropped_tokens else ""),
        f"- TTFT **{_fmt_s(stats.ttft_s)}** with reuse · decode {tok_s} · cache {stats.cache_tokens} tokens, "
        f"{stats.cache_bytes:,} bytes",
    ]
    if stats.no_reuse_ttft_s is not None:
        same = " (this turn reused nothing, so both did the same work: the difference is noise)" \
            if stats.reused_tokens == 0 else " (one measurement each)"
        lines.append(f"- without reuse (whole history re-prefilled): TTFT {_fmt_s(stats.no_reuse_ttft_s)} · "
                     f"saved **{_fmt_s(stats.saved_s)}**{same}")
    if stats.match is not None:
        verdict = "identical" if stats.match else "different" + (" (lossy cache)" if stats.lossy else "")
        lines.append(f"- reply without reuse: **{verdict}**")
    if stats.note:
        lines.append(f"- {stats.note}")
    return "\n".join(lines)


def turns_frame(turns: list[TurnStats]) -> pd.DataFrame:
    """One row per turn: tokens, TTFT with/without reuse (s), saved (s), decode tok/s, cache tokens/bytes."""
    return pd.DataFrame(turn_rows(turns), columns=[
        "turn", "action", "reused", "prefilled", "cropped", "generated", "ttft_s", "no_reuse_ttft_s", "saved_s",
        "decode_tok_s", "cache_tokens", "cache_bytes", "match"])


def turns_figure(turns: list[TurnStats]):
    """Per-turn plot: TTFT with vs without reuse (s), and reused vs prefilled tokens. None before any turn."""
    if not turns:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE_IN, dpi=100, layout="constrained")
    times, tokens = fig.subplots(1, 2)
    xs = list(range(len(turns)))
    labels = [str(t.turn) for t in turns]
    width = 0.38
    times.bar([x - width / 2 for x in xs], [t.ttft_s for t in turns], width, label="with reuse")
    times.bar([x + width / 2 for x in xs], [t.no_reuse_ttft_s or 0.0 for t in turns], width, label="without reuse")
    times.set(title="TTFT per turn", xlabel="turn", ylabel="seconds", xticks=xs, xticklabels=labels)
    times.legend(fontsize=7)
    tokens.bar(xs, [t.reused_tokens for t in turns], label="reused")
    tokens.bar(xs, [t.prefilled_tokens for t in turns], bottom=[t.reused_tokens for t in turns], label="prefilled")
    tokens.set(title="Input tokens per turn", xlabel="turn", ylabel="tokens", xticks=xs, xticklabels=labels)
    tokens.legend(fontsize=7)
    return fig


def prefix_frame(report) -> pd.DataFrame:
    """One row per prompt of a `kvlab.prefix.PrefixReport`: reply, times with/without reuse (s), saved, match."""
    return pd.DataFrame([
        {"prompt": r.prompt, "reply": r.reply, "reused": r.reused_tokens, "prefilled": r.prefilled_tokens,
         "with_reuse_s": round(r.with_reuse_s, 4), "without_reuse_s": round(r.without_reuse_s, 4),
         "saved_s": round(r.saved_s, 4), "match": r.match}
        for r in report.results
    ], columns=["prompt", "reply", "reused", "prefilled", "with_reuse_s", "without_reuse_s", "saved_s", "match"])


def prefix_markdown(report) -> str:
    """Totals of a prefix run: prefix prefilled once, time with and without reuse, saved, matches."""
    matches = sum(r.match for r in report.results)
    lossy = " (lossy cache: differences are expected)" if report.lossy and matches < len(report.results) else ""
    return (
        f"**{report.strategy}** · prefix of **{report.prefix_tokens} tokens** prefilled once in "
        f"{report.prefix_prefill_s:.3f} s · {len(report.results)} prompts answered from copies of its cache\n\n"
        f"- total with reuse: **{report.total_with_s:.3f} s** (prefix prefill + copies + prompt prefills) · "
        f"without reuse: **{report.total_without_s:.3f} s** · saved **{report.total_saved_s:.3f} s**\n"
        f"- replies identical to a run without reuse: **{matches}/{len(report.results)}**{lossy}\n"
        f"- the shared cache still holds {report.prefix_cache_tokens} tokens, {report.prefix_cache_bytes:,} bytes"
    )


def strategy_from_fields(name: str, max_cache_len, backend: str, nbits, residual_length, window_length,
                         num_sink_tokens):
    """The chat strategy picked in the form; only the knobs the strategy has are passed.

    Raises:
        StrategyError: unknown strategy or invalid knob (the message lists the allowed values).
    """
    knobs = {"max_cache_len": max_cache_len, "backend": backend, "nbits": nbits,
             "residual_length": residual_length, "window_length": window_length,
             "num_sink_tokens": num_sink_tokens}
    cls = STRATEGIES.get(name)
    if cls is None:
        raise StrategyError(f"unknown strategy {name!r}; allowed: {', '.join(chat_strategy_choices())}")
    fields = {f.name for f in dataclasses.fields(cls)}
    spec = {"strategy": name}
    for key, value in knobs.items():
        if key in fields and value is not None and value != "":
            spec[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return make_strategy(spec)


def chat_strategy_choices() -> list[str]:
    """CHAT_STRATEGIES that are registered, in that order."""
    return [name for name in CHAT_STRATEGIES if name in STRATEGIES]


def knob_visibility(name: str) -> tuple[bool, bool, bool]:
    """Which knob groups to show for a strategy: (static, quantized, sink)."""
    return name == "static", name == "quantized", name == "sink"


def _default_prefix_texts() -> tuple[str, str]:
    try:
        document = (PRESETS_DIR / "prefix_document.txt").read_text(encoding="utf-8").strip()
        prompts = yaml.safe_load((PRESETS_DIR / "prefix_prompts.yaml").read_text(encoding="utf-8")) or []
        return document, "\n".join(str(p) for p in prompts)
    except (OSError, yaml.YAMLError):
        return "", ""


def build_chat_tab(pool: ModelPool, default_spec: ModelSpec | None = None) -> None:
    """Lay out and wire the chat tab inside the current `gr.Tab` / `gr.Blocks` context.

    Args:
        pool: the app's shared model pool (models are loaded on the first message).
        default_spec: the model to chat with (default: the bundled model); the tab's
            Settings accordion lets the user type another source.
    """
    spec0 = default_spec or ModelSpec()
    gr.Markdown(
        "Chat with the model while **one KV cache is kept across turns**: each turn prefills only the new "
        "message and the template's glue, and is compared with the same turn re-prefilled from scratch."
    )
    state = gr.State(None)
    static0, quant0, sink0 = knob_visibility("dynamic")
    with gr.Row():
        strategy = gr.Dropdown(chat_strategy_choices(), value="dynamic", label="Cache strategy", scale=2)
        max_cache_len = gr.Number(DEFAULT_STATIC_LEN, precision=0, minimum=1, label="max_cache_len (tokens)",
                                  visible=static0)
        backend = gr.Dropdown(["quanto", "hqq", "fp8"], value="quanto", label="backend", visible=quant0)
        nbits = gr.Number(4, precision=0, label="nbits", visible=quant0)
        residual_length = gr.Number(128, precision=0, minimum=0, label="residual_length (tokens)", visible=quant0)
        window_length = gr.Number(256, precision=0, minimum=1, label="window_length (tokens)", visible=sink0)
        num_sink_tokens = gr.Number(4, precision=0, minimum=0, label="num_sink_tokens", visible=sink0)
    system = gr.Textbox(label="System prompt", lines=2, placeholder="(empty: the chat template's default)")
    chatbot = gr.Chatbot(label="Conversation", height=360, elem_id="kvlab-chatbot")
    with gr.Row():
        message = gr.Textbox(label="Message", placeholder="Type a message and press Enter", scale=5,
                             elem_id="kvlab-chat-message")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="kvlab-chat-send")
    with gr.Row():
        regenerate = gr.Button("Regenerate last reply", size="sm", elem_id="kvlab-chat-regenerate")
        undo = gr.Button("Undo last turn", size="sm", elem_id="kvlab-chat-undo")
        clear = gr.Button("Clear", size="sm", elem_id="kvlab-chat-clear")
        stop = gr.Button("Stop", size="sm", variant="stop", elem_id="kvlab-chat-stop")
    with gr.Row():
        max_new_tokens = gr.Slider(1, min(MAX_NEW_TOKENS_CAP, 512), value=DEFAULT_MAX_NEW_TOKENS, step=1,
                                   label="max_new_tokens per reply", elem_id="kvlab-chat-max-new")
        measure = gr.Checkbox(True, label="measure each turn without reuse (TTFT)")
        verify = gr.Checkbox(False, label="also generate the reply without reuse and compare")
    notice = gr.Markdown(elem_id="kvlab-chat-notice")
    with gr.Row(visible=False) as capacity_row:
        grow = gr.Button("Rebuild the static cache larger", size="sm")
        to_dynamic = gr.Button("Switch to dynamic", size="sm")
    turn_info = gr.Markdown(elem_id="kvlab-chat-turn")
    turn_table = gr.Dataframe(label="Per turn", interactive=False, wrap=True)
    turn_plot = gr.Plot(label="Per-turn TTFT and tokens")
    with gr.Accordion("Settings", open=False):
        model_source = gr.Textbox(spec0.source, label="Model ('bundled', a hub id or a local folder)")

    document0, prompts0 = _default_prefix_texts()
    with gr.Accordion("Prefix reuse: prefill a shared prefix once, answer several prompts", open=False):
        gr.Markdown("The prefix (a system prompt or a document) is prefilled once; each prompt starts from a deep "
                    "copy of that cache and prefills only its own tokens. Every prompt is also answered without "
                    "reuse and compared. Uses the strategy picked above (dynamic, static or quantized).")
        prefix_text = gr.Textbox(document0, label="Shared prefix (sent as the system message)", lines=6)
        prefix_prompts = gr.Textbox(prompts0, label="Prompts, one per line", lines=4)
        prefix_run = gr.Button("Run prefix reuse", variant="primary", elem_id="kvlab-prefix-run")
        prefix_info = gr.Markdown(elem_id="kvlab-prefix-info")
        prefix_table = gr.Dataframe(label="Per prompt", interactive=False, wrap=True)

    knob_inputs = [strategy, max_cache_len, backend, nbits, residual_length, window_length, num_sink_tokens]
    turn_outputs = [chatbot, message, notice, capacity_row, turn_info, turn_table, turn_plot, state]

    def load(source: str):
        return pool.get(ModelSpec(source=(source or "bundled").strip(), dtype=spec0.dtype, device=spec0.device))

    def ready(tab: ChatTabState | None, source, knobs, system_text, new_tokens) -> ChatTabState:
        """The session's state with its ChatSession matching the form (created or updated)."""
        tab = tab or ChatTabState()
        loaded = load(source)
        chosen = strategy_from_fields(*knobs)
        settings = GenerationSettings(max_new_tokens=int(new_tokens), fidelity=False)
        if tab.session is None or tab.session.loaded is not loaded:
            old = tab.session
            tab.session = ChatSession(loaded, chosen, settings, system_text or "")
            if old is not None:
                tab.session.history = list(old.history)
        elif tab.session.strategy != chosen:
            tab.session.set_strategy(chosen)
        tab.session.settings = settings
        tab.session.set_system(system_text or "")
        return tab

    def idle(tab, text_box, note: str, capacity: bool = False):
        session = tab.session if tab else None
        history = [dict(m) for m in session.history] if session else []
        turns = session.turns if session else []
        return (history, text_box, note, gr.update(visible=capacity),
                turn_markdown(turns[-1] if turns else None), turns_frame(turns), turns_figure(turns), tab)

    def run_turn(tab: ChatTabState, events, shown_history: list[dict], user_text, keep_box):
        view = start_view(shown_history, user_text)
        yield (view.messages, "", "", gr.update(visible=False), f"_{view.status}_", gr.skip(), gr.skip(), tab)
        for event in events:
            apply_event(view, event)
            if isinstance(event, (ChatToken, ChatStatus)):
                yield (view.messages, "", "", gr.skip(), f"_{view.status}_", gr.skip(), gr.skip(), tab)
        if view.failed is not None:
            yield idle(tab, keep_box, f"⚠️ the turn failed: {view.failed}")
            return
        yield idle(tab, "", "")

    def begin(tab, source, rest, start):
        """(state, events) for a turn, or (state, None, error message, capacity?) when it cannot start."""
        *knobs, system_text, new_tokens, measure_on, verify_on = rest
        try:
            tab = ready(tab, source, knobs, system_text, new_tokens)
            tab.stop.clear()
            return tab, start(tab.session, measure_on, verify_on, tab.stop), "", False
        except ChatCapacityError as err:
            return tab, None, f"⚠️ {err}", True
        except (ChatInputError, StrategyError, ModelLoadError, ValueError) as err:
            return tab, None, f"⚠️ {err}", False

    def on_send(text, tab, source, *rest):
        if not (text or "").strip():
            yield idle(tab, "", "⚠️ the message is empty: type something to send")
            return
        tab, events, error, capacity = begin(
            tab, source, rest, lambda s, measure_on, verify_on, flag: s.send(text, measure_on, verify_on, flag))
        if events is None:
            yield idle(tab, text, error, capacity)
            return
        yield from run_turn(tab, events, tab.session.history, text, text)

    def on_regenerate(tab, source, *rest):
        tab, events, error, capacity = begin(
            tab, source, rest, lambda s, measure_on, verify_on, flag: s.regenerate(measure_on, verify_on, flag))
        if events is None:
            yield idle(tab, gr.skip(), error, capacity)
            return
        yield from run_turn(tab, events, tab.session.history[:-1], None, gr.skip())

    def on_undo(tab):
        if tab is None or tab.session is None or not tab.session.undo():
            return idle(tab, gr.skip(), "nothing to undo")
        return idle(tab, gr.skip(), "removed the last turn; the next turn crops the cache to what is left")

    def on_clear(tab):
        if tab is not None and tab.session is not None:
            tab.session.clear()
        return idle(tab, "", "")

    def on_stop(tab):
        if tab is not None:
            tab.stop.set()

    def on_grow(tab):
        if tab is None or tab.session is None:
            return idle(tab, gr.skip(), "nothing to rebuild yet") + (gr.skip(),)
        try:
            capacity = tab.session.grow_cache()
        except (StrategyError, ChatInputError) as err:
            return idle(tab, gr.skip(), f"⚠️ {err}") + (gr.skip(),)
        return idle(tab, gr.skip(), f"the static cache will be rebuilt with max_cache_len={capacity} at the next "
                                   "turn: press Send again") + (capacity,)

    def on_to_dynamic(tab):
        if tab is not None and tab.session is not None:
            tab.session.set_strategy(make_strategy({"strategy": "dynamic"}))
        return idle(tab, gr.skip(), "switched to dynamic: the next turn prefills the conversation into a new "
                                   "cache; press Send again") + ("dynamic",)

    def on_strategy(name):
        show_static, show_quant, show_sink = knob_visibility(name)
        return (gr.update(visible=show_static), gr.update(visible=show_quant), gr.update(visible=show_quant),
                gr.update(visible=show_quant), gr.update(visible=show_sink), gr.update(visible=show_sink))

    def on_prefix(source, prefix, prompts_text, new_tokens, *knobs):
        from kvlab.prefix import run_prefix_reuse

        prompts = [line.strip() for line in (prompts_text or "").splitlines() if line.strip()]
        try:
            if knobs[0] not in PREFIX_STRATEGIES:
                raise StrategyError(f"prefix reuse copies a whole cache: pick one of {', '.join(PREFIX_STRATEGIES)} "
                                    f"(a {knobs[0]} cache does not hold the whole prefix)")
            chosen = strategy_from_fields(*knobs)
            settings = GenerationSettings(max_new_tokens=int(new_tokens), fidelity=False)
            report = run_prefix_reuse(load(source), chosen, prefix or "", prompts, settings)
        except (StrategyError, ModelLoadError, ValueError) as err:
            return f"⚠️ {err}", None
        return prefix_markdown(report), prefix_frame(report)

    common = [model_source, *knob_inputs, system, max_new_tokens, measure, verify]
    for trigger in (send.click, message.submit):
        trigger(on_send, [message, state, *common], turn_outputs, concurrency_limit=CHAT_CONCURRENCY,
                concurrency_id="kvlab-chat")
    regenerate.click(on_regenerate, [state, *common], turn_outputs, concurrency_limit=CHAT_CONCURRENCY,
                     concurrency_id="kvlab-chat")
    undo.click(on_undo, [state], turn_outputs)
    clear.click(on_clear, [state], turn_outputs)
    stop.click(on_stop, [state], None, queue=False)
    grow.click(on_grow, [state], turn_outputs + [max_cache_len])
    to_dynamic.click(on_to_dynamic, [state], turn_outputs + [strategy])
    strategy.change(on_strategy, [strategy], [max_cache_len, backend, nbits, residual_length, window_length,
                                              num_sink_tokens])
    prefix_run.click(on_prefix, [model_source, prefix_text, prefix_prompts, max_new_tokens, *knob_inputs],
                     [prefix_info, prefix_table], concurrency_limit=CHAT_CONCURRENCY, concurrency_id="kvlab-chat")

