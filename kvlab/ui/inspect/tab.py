"""The Inspect tab: step one strategy's decode loop and look inside its cache after every step.

This module lays out the components and wires their events; nothing else. The form, the checks and every
rendering are `kvlab.ui.inspect.view`'s; the stepping is `kvlab.inspect.inspector.InspectSession` on the engine's
decoder, run one step at a time on kvlab's compute thread (`kvlab.compute`). Each browser session keeps its
own run in a `gr.State`; its cache is released when the tab closes (`unload`, wired by app.py: gradio itself
would keep a closed session's state an hour) or after `INSPECT_STATE_TTL_S` idle. Step events share
Compare's model-bound concurrency group.
"""

from __future__ import annotations

import dataclasses
import time

import gradio as gr

from kvlab.compute import compute, compute_iter
from kvlab.inspect.diverge import DivergeSession
from kvlab.inspect.inspector import InspectError, InspectSession
from kvlab.inspect.loops import LOOP_VARIANTS
from kvlab.generation import encode_prompt
from kvlab.models.loading import ModelLoadError
from kvlab.sharing.cost import RunCost
from kvlab.strategies import STRATEGIES, StrategyError, make_strategy
from kvlab.strategies.base import parse_strategy_item

from ..hosting import turns, zerogpu
from ..shared.cards import build_card
from .diverge import COMPARE_CHOICES, diverge_figure, diverge_markdown
from ..shared.inspect_links import DEFAULT_COMPARE, parse_inspect_query
from .view import (
    DEFAULT_PROMPT,
    DEFAULT_STEPS,
    DEFAULT_STRATEGY,
    INSPECT_STATE_TTL_S,
    INTRO,
    STEP_COUNTS,
    InspectRejected,
    InspectRequest,
    InspectTabState,
    layer_table,
    loop_code,
    plan_inspect,
    release_state,
    sequence_tokens,
    start_knobs,
    status_text,
    step_markdown,
    strip_html,
    top_table,
)
from ..shared.knobs import card_form, knob_defaults, knob_text, max_knobs, strategy_choices
from ..shared.model_picker import chat_box
from ..shared.model_picker import model_dropdown
from ..hosting.costs import inspect_cost, whole
from ..shared.markup import md_code, md_text
from ..shared.theme import line_html

STREAM_EVERY_S = 0.5
"""Least time between two page updates while several steps run."""
PRIVATE = {"concurrency_limit": None, "api_visibility": "private"}
IN_ORDER = {"concurrency_limit": 1, "concurrency_id": "kvlab-inspect"}
"""The tab's model-bound events start one at a time, in click order (each then takes its turn for the model)."""
CORRECT_LOOP = "kvlab's loop (correct)"
"""The "decode loop" choice that runs the strategy's own loop; the others are `LOOP_VARIANTS`' mistakes."""


class InspectTab:
    """The Inspect tab's components and handlers; `pool` is the app's shared ModelPool."""

    def __init__(self, pool):
        self.pool = pool
        self.knob_count = max_knobs()
        self.live: dict[str, InspectTabState] = {}
        """Browser session hash -> its state, so `unload` can release a closed tab's run."""

    def build(self) -> "InspectTab":
        gr.Markdown(INTRO, elem_classes=["kv-intro"])
        self.state = gr.State(None, time_to_live=INSPECT_STATE_TTL_S, delete_callback=release_state)
        with gr.Row():
            with gr.Column(scale=3):
                self.prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=2, elem_id="kvi-prompt")
                with gr.Row(equal_height=True):
                    self.system = gr.Textbox("", label="System prompt (optional)", scale=3, elem_id="kvi-system")
                    self.chat = gr.Checkbox(True, label="chat message", scale=1, elem_id="kvi-chat")
                with gr.Row(equal_height=True):
                    self.max_new_tokens = gr.Number(DEFAULT_STEPS, precision=0, label="new tokens (steps)",
                                                    elem_id="kvi-max-new", min_width=120)
                    self.ignore_eos = gr.Checkbox(True, label="ignore EOS", elem_id="kvi-ignore-eos")
                    self.model_source = model_dropdown("bundled", elem_id="kvi-model", scale=2)
            with gr.Column(scale=2):
                form = card_form(DEFAULT_STRATEGY, start_knobs(DEFAULT_STRATEGY), None, self.knob_count)
                self.card = build_card(form, strategy_choices(None, none_choice=False), DEFAULT_STRATEGY,
                                       "Cache strategy", "kvi", outputs=False, elem_id="kvi-card")
                with gr.Row(equal_height=True):
                    self.compare_with = gr.Dropdown(list(COMPARE_CHOICES), value=DEFAULT_COMPARE,
                                                    label="compare with (stepped in lockstep)", elem_id="kvi-compare")
                    self.loop = gr.Dropdown([CORRECT_LOOP, *LOOP_VARIANTS], value=CORRECT_LOOP,
                                            label="decode loop (a mistake runs a dynamic cache)", elem_id="kvi-loop")
        with gr.Row(equal_height=True, elem_classes=["kv-runbar"]):
            self.step_button = gr.Button("Step", variant="primary", scale=0, min_width=100, elem_id="kvi-step")
            self.step10_button = gr.Button("Step ×10", scale=0, min_width=100, elem_id="kvi-step10")
            self.run_button = gr.Button("Run to end", scale=0, min_width=110, elem_id="kvi-run")
            self.stop_button = gr.Button("Stop", variant="stop", scale=0, min_width=80, elem_id="kvi-stop")
            self.reset_button = gr.Button("Reset", scale=0, min_width=90, elem_id="kvi-reset")
            self.status = gr.HTML(line_html(status_text(None)), elem_id="kvi-status")
        self.step_info = gr.Markdown(step_markdown(None, None), elem_id="kvi-step-info")
        self.strip = gr.HTML(strip_html(None), label="Token strip", elem_id="kvi-strip")
        self.layers = gr.Dataframe(headers=layer_table(None)[0], value=None, interactive=False, wrap=True,
                                   label="What each cache layer holds (bytes)", elem_id="kvi-layers")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2):
                self.top = gr.Dataframe(headers=top_table(None)[0], value=None, interactive=False,
                                        label="Next-token top-5 (probabilities)", elem_id="kvi-top")
            with gr.Column(scale=3):
                self.code = gr.Code(language="python", label="The loop being run (plain transformers)",
                                    interactive=False, lines=24, max_lines=60, elem_id="kvi-code")
        self.diverge_info = gr.Markdown(diverge_markdown(None), elem_id="kvi-diverge-info")
        self.diverge_plot = gr.Plot(show_label=False, elem_id="kvi-diverge-plot", format="png")
        self._wire()
        return self

    def _wire(self) -> None:
        self.form_inputs = {self.prompt, self.system, self.chat, self.max_new_tokens, self.ignore_eos,
                            self.model_source, self.card.strategy, *self.card.knobs, self.compare_with, self.loop}
        self.outputs = [self.status, self.step_info, self.strip, self.layers, self.top, self.code, self.diverge_info,
                        self.diverge_plot, self.state]
        model_bound = {**IN_ORDER, "api_visibility": "private", "show_progress": "hidden"}
        # Every Step and Step ×10 click counts, queued behind the one in hand (gradio drops a click on a button
        # whose last event is still running unless trigger_mode is "multiple").
        for button, handler, count, mode in ((self.step_button, self.on_step, STEP_COUNTS["step"], "multiple"),
                                             (self.step10_button, self.on_step10, STEP_COUNTS["step10"], "multiple"),
                                             (self.run_button, self.on_run, STEP_COUNTS["run"], "once")):
            button.click(self.turn(handler, count), {self.state, *self.form_inputs}, self.outputs,
                         trigger_mode=mode, **model_bound)
        # Reset first stops the run in hand (at once, unqueued) and says so; the new run waits for that step.
        self.reset_button.click(self.stop_for_reset, self.state, self.status, queue=False,
                                api_visibility="private").then(
            self.turn(self.on_reset, 1), {self.state, *self.form_inputs}, self.outputs, **model_bound)
        self.stop_button.click(self.stop, self.state, None, queue=False, api_visibility="private")
        self.model_source.change(lambda source: gr.update(**chat_box(source, None, True)), self.model_source,
                                 self.chat, show_progress="hidden", **PRIVATE)
        self.card.strategy.input(lambda name: self.card.updates(card_form(name, start_knobs(name), None,
                                                                          self.knob_count)),
                                 self.card.strategy, self.card.form_outputs, show_progress="hidden", **PRIVATE)
        self.loop.change(self.loop_card, self.loop, [self.card.strategy, *self.card.knobs, self.card.about],
                         show_progress="hidden", **PRIVATE)

    def loop_card(self, loop: str) -> list:
        """The strategy card greyed while a loop mistake is picked (the mistake runs on a dynamic cache, so the
        card is not used), with a line saying so; usable again with kvlab's loop."""
        mistake = loop in LOOP_VARIANTS
        about = (f"**not used:** {md_code(loop)} runs on a dynamic cache (the mistake is the loop, not the cache); "
                 f"pick {md_text(repr(CORRECT_LOOP))} to step this strategy" if mistake else gr.update())
        return [gr.update(interactive=not mistake)] * (1 + len(self.card.knobs)) + [about]

    def gpu_s_for(self, count: int):
        """The ZeroGPU duration of a button that runs up to `count` steps: called with the handler's arguments,
        it asks for min(count, max new tokens) tokens of one column (`zerogpu.estimate_s`)."""
        def duration(data: dict, request: gr.Request | None = None) -> int:
            try:
                tokens = int(data[self.max_new_tokens] or 1)
            except (TypeError, ValueError):
                tokens = 1
            return zerogpu.estimate_s(1, min(count, tokens))
        return duration

    def turn(self, handler, count: int):
        """`handler` on ZeroGPU's terms (`gpu_s_for`), taking its turn for the model (`turns.page_turn`): up to
        `count` steps of the strategy beside its reference, after the prompt."""
        def cost(data: dict, request: gr.Request | None = None) -> RunCost:
            return inspect_cost(min(count, whole(data[self.max_new_tokens])), data[self.prompt], data[self.system])
        return turns.page_turn(zerogpu.gpu(handler, self.gpu_s_for(count)), cost, self.status, line_html)

    def on_step(self, data: dict, request: gr.Request):
        yield from self.steps(data, STEP_COUNTS["step"], _session_key(request))

    def on_step10(self, data: dict, request: gr.Request):
        yield from self.steps(data, STEP_COUNTS["step10"], _session_key(request))

    def on_run(self, data: dict, request: gr.Request):
        yield from self.steps(data, STEP_COUNTS["run"], _session_key(request))

    def on_reset(self, data: dict, request: gr.Request) -> dict:
        return self.reset(data, _session_key(request))

    def unload(self, request: gr.Request) -> None:
        """The tab closed: release its run (and cache) now."""
        release_state(self.live.pop(_session_key(request), None))

    def request_from(self, data: dict) -> InspectRequest:
        return InspectRequest(prompt=data[self.prompt], strategy_name=data[self.card.strategy],
                              knobs=[data[box] for box in self.card.knobs], system=data[self.system],
                              chat=data[self.chat], max_new_tokens=data[self.max_new_tokens],
                              ignore_eos=data[self.ignore_eos], model_source=data[self.model_source])

    # ----- handlers: each returns or yields {component: update} -----

    def view(self, state: InspectTabState | None, note: str = "", kind: str = "info") -> dict:
        """The page for the state's latest step (or none), with `note` as the status line when given."""
        session = state.session if state is not None else None
        record = session.records[-1] if session is not None and session.records else None
        layer_headers, layer_rows = layer_table(record)
        top_headers, top_rows = top_table(record)
        return {
            self.status: line_html(note or status_text(session), kind if note else "ok" if record else "info"),
            self.step_info: step_markdown(record, session),
            self.strip: strip_html(record, sequence_tokens(session)),
            self.layers: gr.update(value=layer_rows, headers=layer_headers),
            self.top: gr.update(value=top_rows, headers=top_headers),
            self.code: loop_code(state.plan, record) if session is not None else "",
            self.diverge_info: diverge_markdown(getattr(state, "diverge", None), getattr(state, "diverge_error", "")),
            self.diverge_plot: diverge_figure(getattr(state, "diverge", None)),
            self.state: state,
        }

    def _ready(self, state: InspectTabState | None, data: dict, restart: bool,
               key: str) -> tuple[InspectTabState, str]:
        """The session for the form (a new one when asked, or when the form changed), registered under the
        browser session's `key`; returns (state, note).

        Raises:
            InspectRejected, InspectError, StrategyError, ModelLoadError, ValueError: the reason to show.
        """
        plan = plan_inspect(self.request_from(data))
        mistake = data.get(self.loop) in LOOP_VARIANTS
        if mistake:
            plan = dataclasses.replace(plan, strategy=LOOP_VARIANTS[data[self.loop]]())
        compare_with = data.get(self.compare_with) or "none"
        state = state or InspectTabState()
        self.live[key] = state
        if restart or state.session is None or state.key != (plan.key(), compare_with):
            note = "" if restart or state.session is None else "the settings changed: started a new run"
            if mistake:
                note = "; ".join(filter(None, [note, f"{data[self.loop]} runs on a dynamic cache (the card is not used)"]))
            loaded = self.pool.get(plan.spec)
            r = plan.request
            prompt_ids = encode_prompt(loaded.tokenizer, r.prompt, r.system or "", bool(r.chat))
            state.session = compute(InspectSession, loaded, plan.strategy, prompt_ids, plan.settings)
            state.key, state.plan = (plan.key(), compare_with), plan
            state.diverge, state.diverge_error = None, ""
            if compare_with in COMPARE_CHOICES and compare_with != "none":
                try:
                    state.diverge = compute(DivergeSession, loaded, plan.strategy, prompt_ids, plan.settings,
                                            make_strategy({"strategy": compare_with}))
                except (InspectError, StrategyError) as err:
                    state.diverge_error = str(err)
            return state, note
        return state, ""

    def steps(self, data: dict, count: int, key: str = "local"):
        """Step, Step ×10, Run to end: run up to `count` steps, updating the page as they go; a note about how the
        run started (the settings changed, a loop mistake on a dynamic cache) stays beside the steps taken, so
        the status is true at every step."""
        state = data[self.state]
        yield {self.status: line_html(f"working: {'1 step' if count == 1 else f'up to {count} steps'} (the first "
                                      "one loads the model and prefills the prompt)…", "info")}
        try:
            state, started = self._ready(state, data, False, key)
        except (InspectRejected, InspectError, StrategyError, ModelLoadError, ValueError) as err:
            yield self.view(state, f"✖ {err}", "error")
            return
        session = state.session
        note = (lambda: f"{started} · {status_text(session)}") if started else (lambda: "")
        if session.finished:
            yield self.view(state, status_text(session), "info")
            return
        state.stop.clear()
        shown = time.monotonic()
        try:
            for _ in compute_iter(_paired_steps(session, state.diverge, count)):
                if state.stop.is_set():
                    break
                if time.monotonic() - shown >= STREAM_EVERY_S:
                    yield self.view(state, note())
                    shown = time.monotonic()
        except Exception as err:  # noqa: BLE001 - a failed step is shown; the steps before it stay
            yield self.view(state, f"✖ the step failed: {type(err).__name__}: {err} (the steps before it stay; "
                                   "Step tries it again, Reset starts over)", "error")
            return
        yield self.view(state, note())

    def reset(self, data: dict, key: str = "local") -> dict:
        """Reset: a new run from the form, no step taken yet."""
        try:
            state, _ = self._ready(data[self.state], data, True, key)
        except (InspectRejected, InspectError, StrategyError, ModelLoadError, ValueError) as err:
            return self.view(data[self.state], f"✖ {err}", "error")
        return self.view(state, f"new run: {state.session.prompt_ids.shape[1]}-token prompt, "
                                f"{state.session.strategy.describe()}; press Step")

    def wire_link(self, demo: gr.Blocks, tabs: gr.Tabs, tab_id: str) -> None:
        """On page load, open a link from Compare's "first divergence" cell (`?inspect=1&...`) in this tab."""
        self.tabs, self.tab_id = tabs, tab_id
        outputs = [tabs, self.prompt, self.system, self.chat, self.max_new_tokens, self.ignore_eos, self.model_source,
                   self.card.strategy, *self.card.form_outputs, self.compare_with, self.loop, *self.outputs]
        demo.load(zerogpu.gpu(self.open_link, self.gpu_s_for(STEP_COUNTS["run"])), None, outputs,
                  **IN_ORDER, api_visibility="private",
                  show_progress="hidden")

    def open_link(self, request: gr.Request):
        """A page opened from a link into Inspect: select the tab, fill the form from the link and step to the
        link's step, lockstep beside its reference. A page without such a link is left as it is."""
        try:
            link = parse_inspect_query(dict(getattr(request, "query_params", None) or {}))
        except ValueError as err:
            yield {self.tabs: gr.Tabs(selected=self.tab_id), self.status: line_html(f"✖ {err}", "error")}
            return
        if link is None:
            yield {self.tabs: gr.update()}  # no change (a generator that yields nothing would clear every output)
            return
        try:
            spec = parse_strategy_item(link.strategy)
        except ValueError as err:
            yield {self.tabs: gr.Tabs(selected=self.tab_id), self.status: line_html(f"✖ {err}", "error")}
            return
        name = str(spec.pop("strategy"))
        knobs = {**knob_defaults(name), **spec} if name in STRATEGIES else {}
        texts = [knob_text(value) for value in knobs.values()][:self.knob_count]
        texts += [""] * (self.knob_count - len(texts))
        values = {self.prompt: link.prompt, self.system: link.system, self.chat: link.chat,
                  self.max_new_tokens: link.max_new_tokens, self.ignore_eos: True, self.model_source: link.model,
                  self.card.strategy: name, self.compare_with: link.reference, self.loop: CORRECT_LOOP}
        form = {**values, **dict(zip(self.card.knobs, texts))}
        shown = {self.tabs: gr.Tabs(selected=self.tab_id), **values,
                 **(self.card.updates(card_form(name, knobs, None, self.knob_count)) if knobs else {})}
        for update in self.steps({**form, self.state: None}, link.step + 1, _session_key(request)):
            yield {**shown, **update}

    def stop(self, state: InspectTabState | None) -> None:
        """Stop: end a Run to end (or Step ×10) after the step in hand."""
        if state is not None:
            state.stop.set()

    def stop_for_reset(self, state: InspectTabState | None) -> str:
        """Reset clicked (unqueued): stop the run in hand after its current step; the status says the reset
        is queued behind it."""
        self.stop(state)
        return line_html("resetting: the run in hand stops after its current step, then a new run starts…", "busy")


def _paired_steps(session: InspectSession, diverge: DivergeSession | None, count: int):
    """Up to `count` Inspect steps, each followed by the lockstep session's step (same strategy, same greedy
    tokens) when there is one; one `next` is one pair, so the compute thread runs them together."""
    for _ in range(count):
        record = session.step()
        if record is None:
            return
        if diverge is not None and not diverge.finished:
            diverge.step()
        yield record


def _session_key(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"


def build_inspect_tab(pool) -> InspectTab:
    """Build the Inspect tab inside the current `gr.Tab` context; `pool` is the app's shared ModelPool."""
    return InspectTab(pool).build()
