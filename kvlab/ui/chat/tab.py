"""The Chat tab: a multi-turn chat that keeps one KV cache per browser session, and a prefix-reuse panel.

`ChatTab(pool).build()` lays the tab out inside the caller's `gr.Tab` and wires
its events; nothing else. Each handler is a method that returns (or yields)
`{component: update}` dicts, so a test can call it with a `ChatForm`. The
strategy card is Compare's (`kvlab.ui.shared.cards`), listing the strategies whose
`usable_in_chat` is true. Each browser session keeps its own `ChatTabState`
(conversation, cache, stop flag) in a `gr.State`; shared are the model pool and
`ChatSessions`, which caps the caches kept at once, releases idle ones and
frees a closed tab's cache at once (`unload`, wired by app.py). Every control
works while a reply streams: it stops the reply first, then acts, and says so;
text typed meanwhile stays in the message box. What the page shows comes from
`kvlab.ui.chat.view`; the turns run in `kvlab.chat.session` / `kvlab.chat.prefix`.
"""

from __future__ import annotations

import logging
import time

import gradio as gr

from kvlab.chat.session import ChatCapacityError, ChatInputError, ChatStatus, ChatToken
from kvlab.generation import MAX_NEW_TOKENS_CAP
from kvlab.models.loading import ModelLoadError, ModelPool, ModelSpec
from kvlab.strategies import StrategyError, make_strategy

from ..shared.cards import build_card
from .sessions import ChatSessions, ChatTabState
from .view import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_STRATEGY,
    ChatForm,
    apply_event,
    chat_strategy_choices,
    default_prefix_texts,
    prefilled_knobs,
    prefix_frame,
    prefix_markdown,
    prefix_refusal,
    prompt_lines,
    ready_session,
    shown_messages,
    start_view,
    turn_markdown,
    turns_frame,
)
from ..hosting import zerogpu
from ..shared.live_plots import line_plot, roster_colors, roster_update
from ..shared.knobs import card_form, knob_index, max_knobs, strategy_choices
from ..shared.markup import md_text
from ..shared.model_picker import model_dropdown
from ..shared.plot_frames import (
    TURN_COLORS,
    TURN_TOKENS,
    TURN_TOKENS_SERIES,
    TURN_TTFT,
    TURN_TTFT_SERIES,
    turn_labels,
    turns_tokens_frame,
    turns_ttft_frame,
)

logger = logging.getLogger(__name__)

CHAT_CONCURRENCY = 2
"""Sessions that may generate at the same time (they share the model and the CPU cores)."""
CHAT_CONCURRENCY_ID = "kvlab-chat"
INTRO = ("Chat with the model while **one KV cache is kept across turns**: each turn prefills only the new "
         "message and the template's glue, and is compared with the same turn re-prefilled from scratch. "
         "A base model (no chat template, e.g. Gemma 3 270M) gets the turns joined as plain text, one "
         "`User: …` / `Assistant: …` line each, and continues it; every turn says so. On a hybrid model a "
         "cache whose sliding layers have filled their window cannot be cropped, so an undo or a re-tokenized "
         "reply rebuilds it.")
PREFIX_INTRO = ("The prefix (a system prompt or a document) is prefilled once; each prompt starts from a deep "
                "copy of that cache and prefills only its own tokens. Every prompt is also answered without "
                "reuse and compared. Uses the strategy picked above (one whose cache holds the whole prefix).")


class ChatTab:
    """The Chat tab's components and handlers.

    Args:
        pool: the app's shared model pool (models are loaded on the first message).
        default_spec: the model to chat with (default: the bundled model); the Settings accordion
            lets the user type another source.
    """

    def __init__(self, pool: ModelPool, default_spec: ModelSpec | None = None):
        self.pool = pool
        self.spec0 = default_spec or ModelSpec()
        self.strategies = chat_strategy_choices()
        self.knob_count = max_knobs(self.strategies)
        self.sessions = ChatSessions()

    # ----- building -----

    def build(self) -> "ChatTab":
        gr.Markdown(INTRO)
        self.state = gr.State(None, delete_callback=self.sessions.release_state)
        self._build_card()
        self._build_conversation()
        self._build_prefix()
        self._wire()
        return self

    def _build_card(self) -> None:
        form = card_form(DEFAULT_STRATEGY, prefilled_knobs(DEFAULT_STRATEGY), None, self.knob_count)
        self.card = build_card(form, strategy_choices(None, "usable_in_chat", none_choice=False), DEFAULT_STRATEGY,
                               "Cache strategy", "kvlab-chat", outputs=False, elem_id="kvlab-chat-card", budget=True)

    def _build_conversation(self) -> None:
        self.model_source = model_dropdown(self.spec0.source, elem_id="kvlab-chat-model")
        self.system = gr.Textbox(label="System prompt", lines=2, placeholder="(empty: the chat template's default)")
        # render_markdown=False, no LaTeX: a message is its literal text (`shown_messages` escapes it)
        self.chatbot = gr.Chatbot(label="Conversation", height=360, elem_id="kvlab-chatbot",
                                  buttons=["copy", "copy_all"], render_markdown=False, latex_delimiters=[])
        with gr.Row():
            self.message = gr.Textbox(label="Message", placeholder="Type a message and press Enter", scale=5,
                                      elem_id="kvlab-chat-message")
            self.send_button = gr.Button("Send", variant="primary", scale=1, elem_id="kvlab-chat-send")
        with gr.Row():
            self.regenerate_button = gr.Button("Regenerate last reply", size="sm", elem_id="kvlab-chat-regenerate")
            self.undo_button = gr.Button("Undo last turn", size="sm", elem_id="kvlab-chat-undo")
            self.clear_button = gr.Button("Clear", size="sm", elem_id="kvlab-chat-clear")
            self.stop_button = gr.Button("Stop", size="sm", variant="stop", elem_id="kvlab-chat-stop")
        with gr.Row():
            self.max_new_tokens = gr.Slider(1, min(MAX_NEW_TOKENS_CAP, 512), value=DEFAULT_MAX_NEW_TOKENS, step=1,
                                            label="max_new_tokens per reply", elem_id="kvlab-chat-max-new")
            self.measure = gr.Checkbox(True, label="measure each turn without reuse (TTFT)")
            self.verify = gr.Checkbox(False, label="also generate the reply without reuse and compare")
        self.notice = gr.Markdown(elem_id="kvlab-chat-notice")
        with gr.Row(visible=False) as self.capacity_row:
            self.grow_button = gr.Button("Rebuild the static cache larger", size="sm")
            self.to_dynamic_button = gr.Button("Switch to dynamic", size="sm")
        self.turn_info = gr.Markdown(elem_id="kvlab-chat-turn")
        self.turn_table = gr.Dataframe(label="Per turn", interactive=False, wrap=True)
        with gr.Row(elem_id="kvlab-chat-plots"):
            self.ttft_plot = line_plot(TURN_TTFT, "kvlab-chat-ttft", color_map=turn_colors(TURN_TTFT_SERIES))
            self.tokens_plot = line_plot(TURN_TOKENS, "kvlab-chat-tokens", color_map=turn_colors(TURN_TOKENS_SERIES))

    def _build_prefix(self) -> None:
        document, prompts = default_prefix_texts()
        with gr.Accordion("Prefix reuse: prefill a shared prefix once, answer several prompts", open=False):
            gr.Markdown(PREFIX_INTRO)
            self.prefix_text = gr.Textbox(document, label="Shared prefix (sent as the system message)", lines=6)
            self.prefix_prompts = gr.Textbox(prompts, label="Prompts, one per line", lines=4)
            self.prefix_button = gr.Button("Run prefix reuse", variant="primary", elem_id="kvlab-prefix-run")
            self.prefix_info = gr.Markdown(elem_id="kvlab-prefix-info")
            self.prefix_table = gr.Dataframe(label="Per prompt", interactive=False, wrap=True)

    # ----- wiring -----

    def _wire(self) -> None:
        self.form_inputs = {self.model_source, self.card.strategy, *self.card.knobs, self.card.budget,
                            self.card.fallback, self.system, self.max_new_tokens, self.measure, self.verify}
        self.turn_outputs = [self.chatbot, self.message, self.notice, self.capacity_row, self.turn_info,
                             self.turn_table, self.ttft_plot, self.tokens_plot, self.state]
        model_bound = {"concurrency_limit": CHAT_CONCURRENCY, "concurrency_id": CHAT_CONCURRENCY_ID,
                       "api_visibility": "private"}  # the page's own events: not API endpoints nor MCP tools
        private = {"api_visibility": "private"}
        for trigger in (self.send_button.click, self.message.submit):
            trigger(zerogpu.gpu(self._on_send, self.gpu_s), {self.message, self.state, *self.form_inputs}, self.turn_outputs, **model_bound)
        self.regenerate_button.click(zerogpu.gpu(self._on_regenerate, self.gpu_s), {self.state, *self.form_inputs}, self.turn_outputs,
                                     **model_bound)
        self.undo_button.click(self.undo, [self.state], self.turn_outputs, **private)
        self.clear_button.click(self.clear, [self.state], self.turn_outputs, **private)
        self.chatbot.clear(self.clear, [self.state], self.turn_outputs, **private)  # the trash icon: same as Clear
        self.stop_button.click(self.stop, [self.state], None, queue=False, **private)
        self.grow_button.click(self.grow, [self.state], self.turn_outputs + self.card.knobs, **private)
        self.to_dynamic_button.click(self.to_dynamic, [self.state],
                                     self.turn_outputs + [self.card.strategy, *self.card.form_outputs], **private)
        self.card.strategy.input(self.pick_strategy, [self.card.strategy, self.model_source], self.card.form_outputs,
                                 show_progress="hidden", **private)
        self.prefix_button.click(zerogpu.gpu(self._on_prefix, self.prefix_gpu_s),
                                 {self.prefix_text, self.prefix_prompts, *self.form_inputs},
                                 [self.prefix_info, self.prefix_table], **model_bound)

    def form_from(self, data: dict) -> ChatForm:
        """A ChatForm from an event's {component: value} inputs."""
        return ChatForm(source=data[self.model_source], strategy_name=data[self.card.strategy],
                        knobs=[data[box] for box in self.card.knobs], system=data[self.system],
                        max_new_tokens=data[self.max_new_tokens], measure=data[self.measure],
                        verify=data[self.verify], budget_text=data[self.card.budget],
                        fallback_text=data[self.card.fallback])

    def gpu_s(self, data: dict, request: gr.Request | None = None) -> int:
        """ZeroGPU seconds a chat turn asks for: max_new_tokens, twice over when the turn is also generated
        without reuse (`zerogpu.estimate_s`)."""
        return zerogpu.estimate_s(1 + bool(data[self.verify]), int(data[self.max_new_tokens] or 1))

    def prefix_gpu_s(self, data: dict) -> int:
        """ZeroGPU seconds a prefix-reuse run asks for: each prompt answered with and without reuse."""
        prompts = [line for line in (data[self.prefix_prompts] or "").splitlines() if line.strip()]
        return zerogpu.estimate_s(2 * max(1, len(prompts)), int(data[self.max_new_tokens] or 1))

    def _on_send(self, data: dict, request: gr.Request):
        yield from self.send(data[self.message], data[self.state], self.form_from(data), _session_key(request))

    def _on_regenerate(self, data: dict, request: gr.Request):
        yield from self.regenerate(data[self.state], self.form_from(data), _session_key(request))

    def unload(self, request: gr.Request) -> None:
        """The tab closed: free its conversation and cache now (gradio would keep them an hour)."""
        if self.sessions.release(_session_key(request)):
            logger.info("chat session closed: its cache was released (%d chat caches live)",
                        self.sessions.live_caches())

    def _on_prefix(self, data: dict) -> dict:
        return self.run_prefix(self.form_from(data), data[self.prefix_text], data[self.prefix_prompts])

    # ----- handlers: each returns or yields {component: update} -----

    def turn_plots(self, turns) -> dict:
        """Both per-turn plots: every series drawn from the first turn on (`roster_update`), one whole-turn
        category per turn on x (`turn_labels`); cleared before the first turn."""
        if not turns:
            return {self.ttft_plot: gr.update(value=None), self.tokens_plot: gr.update(value=None)}
        order = turn_labels(turns)
        return {self.ttft_plot: roster_update(turns_ttft_frame(turns), TURN_TTFT, TURN_COLORS, TURN_TTFT_SERIES,
                                              sort=order),
                self.tokens_plot: roster_update(turns_tokens_frame(turns), TURN_TOKENS, TURN_COLORS,
                                                TURN_TOKENS_SERIES, sort=order)}

    def idle(self, state: ChatTabState | None, note: str, message=None, capacity: bool = False) -> dict:
        """The page between turns: the conversation, a notice, the last turn's stats; `message` refills the box."""
        session = state.session if state else None
        history = [dict(m) for m in session.history] if session else []
        turns = session.turns if session else []
        updates = {self.chatbot: shown_messages(history), self.notice: note,
                   self.capacity_row: gr.update(visible=capacity),
                   self.turn_info: turn_markdown(turns[-1] if turns else None), self.turn_table: turns_frame(turns),
                   **self.turn_plots(turns),
                   self.state: state}
        if message is not None:
            updates[self.message] = message
        return updates

    def send(self, text: str, state: ChatTabState | None, form: ChatForm, key: str = "local"):
        """Send a message and stream the reply; a running reply is stopped first; a refused turn keeps the text
        in the box and says why."""
        if not (text or "").strip():
            yield self.idle(state, "⚠️ the message is empty: type something to send", message="")
            return
        state, events, note, capacity = self._begin(
            state, form, key, lambda session, stop: session.send(text, form.measure, form.verify, stop))
        if events is None:
            yield self.idle(state, note, message=text, capacity=capacity)
            return
        yield from self._run_turn(state, events, state.session.history, text, keep=text, note=note)

    def regenerate(self, state: ChatTabState | None, form: ChatForm, key: str = "local"):
        """Replace the last reply with a new one for the same message (a running reply is stopped first and is
        the one regenerated)."""
        state, events, note, capacity = self._begin(
            state, form, key, lambda session, stop: session.regenerate(form.measure, form.verify, stop))
        if events is None:
            yield self.idle(state, note, capacity=capacity)
            return
        yield from self._run_turn(state, events, state.session.history[:-1], None, keep=None, note=note)

    def _begin(self, state, form: ChatForm, key: str, start):
        """(state, events, note, False) for a turn that starts, or (state, None, error, capacity refused?).

        1. A reply still running in this session is stopped and its turn ends first (the note says so).
        2. The session is admitted among the live chat caches (an idle one may be released to make room).
        3. The session is matched to the form and the turn's event stream is created (every check runs here).
        """
        state = state or ChatTabState()
        try:
            note = "stopped the reply that was running first; " if state.stop_reply() else ""
            self.sessions.admit(key, state)
            state = ready_session(state, self.pool.get(form.model_spec(self.spec0)), form)
            state.stop.clear()
            return state, start(state.session, state.stop), note, False
        except ChatCapacityError as err:
            return state, None, f"⚠️ {md_text(err)}", True
        except (ChatInputError, StrategyError, ModelLoadError, ValueError) as err:
            return state, None, f"⚠️ {md_text(err)}", False

    def _run_turn(self, state: ChatTabState, events, shown_history: list[dict], user_text: str | None, keep,
                  note: str = ""):
        """Stream a turn into the page. The message box is cleared once (its text was sent), never while the
        reply streams, so text typed meanwhile stays."""
        view = start_view(shown_history, user_text)
        state.idle.clear()
        try:
            yield {self.chatbot: shown_messages(view.messages), self.message: "", self.notice: note.rstrip("; "),
                   self.capacity_row: gr.update(visible=False), self.turn_info: f"_{md_text(view.status)}_",
                   self.state: state}
            for event in events:
                apply_event(view, event)
                if isinstance(event, (ChatToken, ChatStatus)):
                    yield {self.chatbot: shown_messages(view.messages), self.turn_info: f"_{md_text(view.status)}_"}
            # A control that stopped this reply (Clear, Undo) acts here, before the last update, so this update
            # and the control's own show the same page whichever reaches the browser last.
            action, state.after_stop = state.after_stop, None
            if action is not None:
                yield action()
            elif view.failed is not None:
                yield self.idle(state, f"⚠️ {note}the turn failed: {md_text(view.failed)}", message=keep)
            else:
                yield self.idle(state, note.rstrip("; "))
        finally:
            state.last_active = time.monotonic()
            state.idle.set()

    def undo(self, state: ChatTabState | None) -> dict:
        """Remove the last turn (a running reply is stopped first and is the turn removed)."""
        return self._after_stopping(state, self._undo)

    def clear(self, state: ChatTabState | None) -> dict:
        """Forget the conversation and its cache (a running reply is stopped first)."""
        return self._after_stopping(state, self._clear)

    def _undo(self, state: ChatTabState | None, stopped: bool) -> dict:
        first = "stopped the reply that was running, then " if stopped else ""
        if state is None or state.session is None or not state.session.undo():
            return self.idle(state, f"{first}nothing to undo")
        return self.idle(state, f"{first}removed the last turn; the next turn crops the cache to what is left")

    def _clear(self, state: ChatTabState | None, stopped: bool) -> dict:
        if state is not None and state.session is not None:
            state.session.clear()
        return self.idle(state, "stopped the reply that was running, then cleared the conversation and its cache"
                         if stopped else "")

    def _after_stopping(self, state: ChatTabState | None, act) -> dict:
        """Run `act(state, stopped)` once no reply runs. A running reply is stopped and does the act itself as
        it ends (`ChatTabState.after_stop`), so its last update and this one agree; this returns that result."""
        if state is None or not state.running:
            return act(state, False)
        done: dict = {}
        state.after_stop = lambda: done.setdefault("updates", act(state, True))
        try:
            state.stop_reply()
        except ChatInputError as err:
            state.after_stop = None
            return self.idle(state, f"⚠️ {md_text(err)}")
        return done["updates"] if "updates" in done else act(state, True)

    def stop(self, state: ChatTabState | None) -> None:
        if state is not None:
            state.stop.set()

    def grow(self, state: ChatTabState | None) -> dict:
        """Rebuild a static cache that was too small with the suggested size; the knob field shows it."""
        if state is None or state.session is None:
            return self.idle(state, "nothing to rebuild yet")
        try:
            capacity = state.session.grow_cache()
        except (StrategyError, ChatInputError) as err:
            return self.idle(state, f"⚠️ {md_text(err)}")
        updates = self.idle(state, f"the static cache will be rebuilt with max_cache_len={capacity} at the next "
                                   "turn: press Send again")
        updates[self.card.knobs[knob_index(state.session.strategy.name, "max_cache_len")]] = str(capacity)
        return updates

    def to_dynamic(self, state: ChatTabState | None) -> dict:
        """Switch the session (and the card) to a dynamic cache."""
        if state is not None and state.session is not None:
            state.session.set_strategy(make_strategy({"strategy": "dynamic"}))
        updates = self.idle(state, "switched to dynamic: the next turn prefills the conversation into a new "
                                   "cache; press Send again")
        updates[self.card.strategy] = "dynamic"
        updates.update(self.pick_strategy("dynamic", None))
        return updates

    def pick_strategy(self, name: str, source: str | None) -> dict:
        """The card's fields for strategy `name` (marked unavailable when the chat's model is loaded and refuses it)."""
        try:
            loaded = self.pool.loaded(ChatForm(source=source or self.spec0.source).model_spec(self.spec0))
        except ValueError:
            loaded = None
        return self.card.updates(card_form(name, prefilled_knobs(name), loaded, self.knob_count))

    def run_prefix(self, form: ChatForm, prefix: str, prompts_text: str) -> dict:
        """Prefill `prefix` once and answer each prompt line from copies of its cache, with and without reuse."""
        from kvlab.chat.prefix import run_prefix_reuse

        try:
            chosen = form.strategy()
            refusal = prefix_refusal(chosen)
            if refusal:
                raise StrategyError(refusal)
            loaded = self.pool.get(form.model_spec(self.spec0))
            report = run_prefix_reuse(loaded, chosen, prefix or "", prompt_lines(prompts_text), form.settings(),
                                      chat=loaded.has_chat_template)
        except (StrategyError, ModelLoadError, ValueError) as err:
            return {self.prefix_info: f"⚠️ {md_text(err)}", self.prefix_table: None}
        except Exception as err:  # noqa: BLE001 - the panel says what failed; the tab keeps working
            logger.exception("prefix reuse failed")
            return {self.prefix_info: f"⚠️ prefix reuse failed: {type(err).__name__}: {md_text(err)}",
                    self.prefix_table: None}
        return {self.prefix_info: prefix_markdown(report), self.prefix_table: prefix_frame(report)}


def _session_key(request: gr.Request | None) -> str:
    """The browser session's id (gradio's session hash); 'local' for calls made outside a request."""
    return getattr(request, "session_hash", None) or "local"


def turn_colors(series: list[str]) -> dict[str, str]:
    """The colour map of a per-turn plot, as `roster_update` sends it (the map stays the same for the whole
    session, so the plot's spec is built once, from its first frame)."""
    return roster_colors(TURN_COLORS, series)


def build_chat_tab(pool: ModelPool, default_spec: ModelSpec | None = None) -> ChatTab:
    """Build the Chat tab inside the current `gr.Tab` / `gr.Blocks` context; returns it."""
    return ChatTab(pool, default_spec).build()
