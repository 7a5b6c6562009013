"""The Compare tab: one prompt under up to eight KV-cache strategies, streamed side by side.

This module lays out the components and wires their events; nothing else.
`CompareTab` owns its parts rather than inheriting them: `kvlab.ui.compare.form` (the form -> a run plan,
and the preset overrides the form carries in a `gr.State`), `kvlab.ui.compare.view` (runner events -> a view
model), a `kvlab.ui.compare.updates.CompareUpdater` (the view model -> component updates, built with the
components it updates), `kvlab.ui.shared.knobs` (the strategy cards' fields), `kvlab.ui.shared.live_plots` (native
plots; the matplotlib PNG only on request) and `kvlab.ui.compare.extras` (replay, share links, the `compare`
API, ZeroGPU sizing); running is `kvlab.compare.runner`'s job. Per-session state lives
in `gr.State`; the one shared object is the `ModelPool` of loaded weights
(through a `BackgroundLoader`). Model-bound events (Run, the `compare` API) take their turn in kvlab's
scheduler (`kvlab.ui.hosting.turns`): a waiting Run shows its position and wait in the status line.
"""

from __future__ import annotations

import logging
import threading

import gradio as gr

from kvlab.columns import MAX_COLUMNS
from kvlab.compare.columns import MODES
from kvlab.compare.runner import run_compare
from kvlab.generation import MAX_NEW_TOKENS_CAP, encode_prompt
from kvlab.measure import POLICIES
from kvlab.models.loading import DEVICES, DTYPES, ModelLoadError, ModelSpec
from kvlab.compare.preset import Preset, PresetError, list_presets, load_preset
from kvlab.measure.record_json import cap_text
from kvlab.speech.clips import get_clip
from kvlab.speech.runner import run_speech

from ..hosting import turns, zerogpu
from ..shared.cards import StrategyCard, build_card
from .extras import CompareApi, open_shared, replay, run_cost, run_gpu_s, wait_for_model
from .recurrent import recurrent_choices, recurrent_run
from .speech import clip_picker, for_source, speech_choices
from .records import page_preset
from .form import (INTRO, MODE_HELP, RunRejected, RunRequest, carried_overrides, model_line, plan_run, slot_specs,
                   start_preset)
from ..shared.live_plots import LivePlots
from .updates import CompareUpdater
from .view import SUMMARY_DATATYPES, SUMMARY_HELP, SUMMARY_WIDTHS, RunView
from ..shared.inspect_links import divergence_links
from ..shared.knobs import card_form, max_knobs, strategy_choices
from ..shared.loader import BackgroundLoader, device_present
from .warm import OpeningWarmUp
from ..shared.model_picker import chat_box, model_bar
from ..shared.theme import line_html
from .timing_text import POLICY_INFO

logger = logging.getLogger(__name__)

PRIVATE = {"concurrency_limit": None, "api_visibility": "private"}
"""Light events (presets, pickers, Stop, the timer) run at once and stay out of the API."""


class CompareTab:
    """The Compare tab's components and handlers (build it with `build_compare_tab`).

    presets: name -> preset file (default: `kvlab.compare.preset.list_presets()`).
    """

    def __init__(self, pool, preload: bool = True, loader: BackgroundLoader | None = None,
                 presets: dict | None = None):
        self.presets = list_presets() if presets is None else dict(presets)
        self.loader = loader or BackgroundLoader(pool, warm=(OpeningWarmUp(self.presets),))
        self.knob_count = max_knobs()
        self.api = CompareApi(self.loader, self.presets)
        self.devices = [d for d in DEVICES if d in ("auto", "cpu") or device_present(d)]
        self.dtypes = list(DTYPES) if device_present("cuda") else ["float32"]
        self.live_stops: dict[str, threading.Event] = {}
        """Browser session hash -> the stop event of its latest run, so `unload` can end a closed page's run."""
        if preload:
            self.loader.start(ModelSpec())

    # ----- building -----

    def build(self) -> "CompareTab":
        start = start_preset(self.presets)
        self.session = gr.State({})
        self.preset_state = gr.State(carried_overrides(start.columns))
        """The applied preset's per-column `generation:` overrides (`compare_form.carried_overrides`)."""
        gr.Markdown(INTRO, elem_classes=["kv-intro"])
        self._build_model_bar()
        with gr.Row():
            with gr.Column(scale=3):
                self._build_prompt(start)
            with gr.Column(scale=2):
                self._build_generation(start)
        with gr.Row(equal_height=True, elem_classes=["kv-runbar"]):
            self.run_button = gr.Button("Run", variant="primary", scale=0, min_width=120, elem_id="kv-run")
            self.stop_button = gr.Button("Stop", variant="stop", scale=0, min_width=120, elem_id="kv-stop",
                                         interactive=False)
            self.run_status = gr.HTML(line_html("ready: pick a preset or strategies, then Run"), elem_id="kv-run-status")
        self._build_cards(start)
        self._build_results()
        self.updater = CompareUpdater(self.cards, self.plots, self.run_status, self.results, self.summary,
                                      self.summary_notes, self.exports, self.share, self.code, self.knob_count)
        self.timer = gr.Timer(1.0, active=True)
        self._wire_form()
        self._wire_run()
        return self

    def _build_model_bar(self) -> None:
        self.model_source, self.dtype, self.device, self.load_button, self.model_status = model_bar(
            self.dtypes, self.devices, speech_choices() + recurrent_choices())

    def _build_prompt(self, start: Preset) -> None:
        with gr.Row(equal_height=True):
            self.preset = gr.Dropdown(list(self.presets), value=start.name or None, label="Preset", scale=1,
                                      elem_id="kv-preset", info="fills the prompt, settings and columns")
            self.preset_about = gr.Markdown(start.description, elem_classes=["kv-small"])
        self.prompt = gr.Textbox(start.prompt.text, label="Prompt", lines=3, elem_id="kv-prompt")
        self.clip = clip_picker()
        with gr.Row(equal_height=True):
            self.system = gr.Textbox(start.prompt.system, label="System prompt (optional)", scale=4,
                                     elem_id="kv-system")
            self.chat = gr.Checkbox(start.prompt.chat, label="chat message", info="use the chat template", scale=1,
                                    elem_id="kv-chat")

    def _build_generation(self, start: Preset) -> None:
        generation, sampling = start.generation, start.generation.do_sample
        with gr.Row(equal_height=True):
            self.max_new_tokens = gr.Number(generation.max_new_tokens, precision=0, min_width=140,
                                            label=f"max new tokens (1–{MAX_NEW_TOKENS_CAP})", elem_id="kv-max-new")
            self.decoding = gr.Radio(["greedy", "sample"], label="decoding", elem_id="kv-decoding",
                                     value="sample" if sampling else "greedy")
            self.ignore_eos = gr.Checkbox(not generation.stop_at_eos, label="ignore EOS", elem_id="kv-ignore-eos",
                                          info="keep going past end-of-text")
        with gr.Row(equal_height=True):
            self.temperature = gr.Slider(0.05, 2.0, generation.temperature, step=0.05, label="temperature",
                                         interactive=sampling)
            self.top_p = gr.Slider(0.05, 1.0, generation.top_p, step=0.05, label="top_p", interactive=sampling)
        with gr.Row(equal_height=True):
            self.top_k = gr.Number(generation.top_k, precision=0, label="top_k (0 = off)", interactive=sampling,
                                   min_width=90)
            self.repetition_penalty = gr.Number(generation.repetition_penalty, label="repetition penalty",
                                                min_width=90, step=0.05)
            self.seed = gr.Number(generation.seed, precision=0, label="seed", min_width=90)
        self.mode = gr.Radio(list(MODES), value=start.mode, label="mode", info=MODE_HELP, elem_id="kv-mode")
        with gr.Row(equal_height=True):
            self.baseline = gr.Dropdown(["auto"] + [f"column {i + 1}" for i in range(MAX_COLUMNS)],
                                        value=self._baseline_value(start), label="fidelity baseline",
                                        elem_id="kv-baseline", info="auto: the first dynamic column")
            self.fidelity = gr.Checkbox(bool(generation.fidelity), label="score fidelity", elem_id="kv-fidelity",
                                        info="teacher-forced, after the columns finish")
            self.timing_policy = gr.Dropdown(list(POLICIES), value=generation.timing_policy, label="timing",
                                             elem_id="kv-timing", info=POLICY_INFO)

    def _build_cards(self, start: Preset) -> None:
        self.cards: list[StrategyCard] = []
        choices = strategy_choices(None, engines=True)
        for row_start in range(0, MAX_COLUMNS, 4):
            with gr.Row(equal_height=False, elem_classes=["kv-cards"]):
                for slot, (name, knobs) in enumerate(slot_specs(start.columns)[row_start:row_start + 4], row_start):
                    form = card_form(name, knobs, None, self.knob_count)
                    self.cards.append(build_card(form, choices, name, f"Column {slot + 1}", f"kv-col-{slot}",
                                                 outputs=True, classes=(f"kv-slot-{slot}",),
                                                 elem_id=f"kv-card-{slot}", budget=True))

    def _build_results(self) -> None:
        self.plots = LivePlots().build()
        with gr.Column(visible=False, elem_id="kv-results") as self.results:
            self.summary = gr.Dataframe(value=None, headers=None, interactive=False, wrap=True, elem_id="kv-summary",
                                        label="Summary", max_height=900, column_widths=SUMMARY_WIDTHS,
                                        datatype=SUMMARY_DATATYPES)
            self.summary_notes = gr.Markdown("", elem_classes=["kv-small"], elem_id="kv-summary-notes")
            gr.Markdown(f'<details class="kv-more"><summary>what the columns mean</summary>\n\n{SUMMARY_HELP}'
                        '\n\n</details>', elem_classes=["kv-small"])
            with gr.Row(equal_height=True):
                self.exports = gr.File(label="Export: JSON record (replayable), summary CSV", file_count="multiple",
                                       interactive=False, elem_id="kv-exports", scale=4)
                self.share = gr.HTML("", elem_id="kv-share")
        with gr.Accordion("Replay a recorded run (the JSON record of the export or `kvlab compare --json`)",
                          open=False, elem_id="kv-replay-box"):
            self.replay_file = gr.File(label=f"run record: .json, {cap_text()}", file_types=[".json"],
                                       type="filepath", elem_id="kv-replay")
        with gr.Accordion("View code: reproduce each column with plain transformers", open=False,
                          elem_id="kv-code-box"):
            self.code = gr.Code(language="python", label="generate(..., cache=...)", elem_id="kv-code",
                                interactive=False, lines=12, max_lines=60)

    @staticmethod
    def _baseline_value(preset: Preset) -> str:
        return "auto" if preset.baseline is None else f"column {preset.baseline + 1}"

    def card_updates(self, slot: int, name: str, knobs: dict, loaded) -> dict:
        """{component: gr.update} setting card `slot` to strategy `name` with `knobs`."""
        return self.updater.card(slot, name, knobs, loaded)

    def _loaded_for(self, source, dtype, device):
        try:
            return self.loader.pool.loaded(ModelSpec.from_field(source, dtype, device))
        except ValueError:
            return None

    # ----- wiring -----

    def _wire_form(self) -> None:
        """The light events: model status timer, Load, strategy pickers, decoding, presets."""
        strategies = [card.strategy for card in self.cards]
        model_inputs = [self.model_source, self.dtype, self.device]
        self.timer.tick(self.tick, model_inputs, [self.model_status, self.timer, self.chat, *strategies],
                        show_progress="hidden", **PRIVATE)
        self.model_source.input(lambda source: gr.update(**chat_box(source, None, reset=True)), self.model_source,
                                self.chat, show_progress="hidden", **PRIVATE)
        self.model_source.change(for_source, self.model_source, [self.prompt, self.system, self.chat, self.clip],
                                 show_progress="hidden", **PRIVATE)
        self.load_button.click(self.load, model_inputs, [self.model_status, self.timer], **PRIVATE)
        for slot, card in enumerate(self.cards):
            card.strategy.input(
                lambda name, source, dtype, device, slot=slot: self.card_updates(
                    slot, name, {}, self._loaded_for(source, dtype, device)),
                [card.strategy, *model_inputs], card.form_outputs, show_progress="hidden", **PRIVATE)
        self.decoding.change(lambda d: [gr.update(interactive=d == "sample")] * 3, self.decoding,
                             [self.temperature, self.top_p, self.top_k], show_progress="hidden", **PRIVATE)
        self.form_outputs = [
            self.prompt, self.system, self.chat, self.max_new_tokens, self.decoding, self.temperature, self.top_p,
            self.top_k, self.repetition_penalty, self.seed, self.ignore_eos, self.fidelity, self.timing_policy,
            self.mode, self.baseline, self.model_source, self.dtype, self.device, self.preset_about, self.run_status,
            self.preset_state, *strategies,
            *[c for card in self.cards for c in card.form_outputs],
        ]
        self.preset.input(self.apply_preset, [self.preset, *model_inputs], self.form_outputs,
                          show_progress="hidden", **PRIVATE)

    def _wire_run(self) -> None:
        """Run (prepare, then the queued run, then re-enable), Stop, and the `compare` API."""
        self.run_inputs = {
            self.session, self.preset_state, self.prompt, self.clip, self.system, self.chat, self.max_new_tokens, self.decoding,
            self.temperature, self.top_p, self.top_k, self.repetition_penalty, self.seed, self.ignore_eos, self.fidelity,
            self.timing_policy, self.mode, self.baseline, self.preset, self.model_source, self.dtype, self.device,
            *[card.strategy for card in self.cards], *[box for card in self.cards for box in card.knobs],
            *[box for card in self.cards for box in (card.budget, card.fallback)],
        }
        self.run_outputs = [self.run_status, self.model_status, *self.plots.outputs, self.results, self.summary,
                            self.exports, self.share, self.summary_notes, self.code,
                            *[c for card in self.cards for c in (card.status, card.text, card.strategy)]]
        self.run_button.click(
            self.prepare, self.session, [self.run_button, self.stop_button, self.run_status], show_progress="hidden",
            **PRIVATE,
        ).then(
            turns.page_turn(zerogpu.gpu(self.run, self.run_gpu_s), self.run_cost, self.run_status, line_html,
                            lambda data: data[self.session].get("stop")),
            self.run_inputs, self.run_outputs, show_progress="full", show_progress_on=[self.run_status],
            api_visibility="private", **turns.MODEL_BOUND,
        ).then(
            lambda: (gr.update(interactive=True), gr.update(interactive=False)), None,
            [self.run_button, self.stop_button], show_progress="hidden", **PRIVATE,
        )
        self.stop_button.click(self.stop, self.session, self.run_status, show_progress="hidden", **PRIVATE)
        gr.api(turns.api_turn(zerogpu.gpu(self.api.compare, self.api.gpu_s), self.api.cost), api_name="compare",
               **turns.MODEL_BOUND)
        self.plots.png_button.click(lambda session: self.plots.export(session.get("view")), self.session,
                                    [self.plots.png, self.plots.notes], **PRIVATE)
        self.updater.form = {
            "prompt": self.prompt, "system": self.system, "chat": self.chat, "max_new_tokens": self.max_new_tokens,
            "decoding": self.decoding, "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "repetition_penalty": self.repetition_penalty, "seed": self.seed, "ignore_eos": self.ignore_eos,
            "fidelity": self.fidelity, "timing_policy": self.timing_policy, "mode": self.mode,
            "baseline": self.baseline, "preset": self.preset, "model_source": self.model_source, "dtype": self.dtype,
            "device": self.device}
        replay_outputs = list(dict.fromkeys([*self.run_outputs, *self.updater.form.values(),
                                             *[c for card in self.cards for c in card.form_outputs]]))
        self.replay_file.upload(self.replay, [self.replay_file, self.session], replay_outputs, **PRIVATE)
        self.replay_outputs = replay_outputs

    def wire_page_load(self, demo: gr.Blocks) -> None:
        """Show the result a share link (`?run=<id>`) names when the page opens (`open_shared`)."""
        demo.load(self.open_shared, self.session, self.replay_outputs, **PRIVATE)

    # ----- replay, share link, ZeroGPU sizing (`kvlab.ui.compare.extras`) -----

    def replay(self, path: str | None, session: dict, exports: list[str] | None = None) -> dict:
        """A run record uploaded: shown as measured (`compare_extras.replay`)."""
        return replay(self.updater, path, session, exports)

    def open_shared(self, session: dict, request: gr.Request) -> dict:
        """Page load: the result a share link names, if any (`compare_extras.open_shared`)."""
        return open_shared(self.updater, session, request)

    def run_gpu_s(self, data: dict) -> int:
        """ZeroGPU seconds a Run asks for (`compare_extras.run_gpu_s`), from the Run event's inputs."""
        return run_gpu_s([data[card.strategy] for card in self.cards], data[self.max_new_tokens])

    def run_cost(self, data: dict):
        """What a Run costs before it is queued (`compare_extras.run_cost`), from the Run event's inputs."""
        return run_cost([data[card.strategy] for card in self.cards], data[self.max_new_tokens], data[self.prompt],
                        data[self.system])

    # ----- light events -----

    def tick(self, source, dtype, device):
        """Timer: refresh the model status line; stop ticking once the load has ended (ready or failed)."""
        try:
            spec = ModelSpec.from_field(source, dtype, device)
        except ValueError as err:
            return line_html(f"✖ {err}", "error"), gr.Timer(active=False), *[gr.skip()] * (MAX_COLUMNS + 1)
        status = self.loader.status(spec)
        if status.state == "loading":
            return model_line(status, spec), gr.Timer(active=True), *[gr.skip()] * (MAX_COLUMNS + 1)
        choices = strategy_choices(status.loaded, engines=True)
        return (model_line(status, spec), gr.Timer(active=False), gr.update(**chat_box(spec.source, status.loaded, False)),
                *[gr.update(choices=choices) for _ in range(MAX_COLUMNS)])

    def load(self, source, dtype, device):
        """Load button: start loading in the background; the timer reports progress."""
        try:
            spec = ModelSpec.from_field(source, dtype, device)
        except ValueError as err:
            return line_html(f"✖ {err}", "error"), gr.Timer(active=False)
        status = self.loader.start(spec)
        return model_line(status, spec), gr.Timer(active=True)

    def apply_preset(self, name, source, dtype, device) -> dict:
        """Preset dropdown: fill the prompt, settings, model fields and columns from `presets/<name>.yaml`."""
        try:
            preset = load_preset(self.presets.get(name, name))
        except PresetError as err:
            return {self.run_status: line_html(f"✖ {err}", "error"), self.preset_state: {}}
        generation, sampling = preset.generation, preset.generation.do_sample
        updates = {
            self.prompt: preset.prompt.text, self.system: preset.prompt.system,
            self.chat: gr.update(**{**chat_box(preset.model.source, None, False), "value": preset.prompt.chat}),
            self.max_new_tokens: generation.max_new_tokens, self.decoding: "sample" if sampling else "greedy",
            self.temperature: gr.update(value=generation.temperature, interactive=sampling),
            self.top_p: gr.update(value=generation.top_p, interactive=sampling),
            self.top_k: gr.update(value=generation.top_k, interactive=sampling),
            self.repetition_penalty: generation.repetition_penalty, self.seed: generation.seed,
            self.ignore_eos: not generation.stop_at_eos, self.fidelity: generation.fidelity,
            self.timing_policy: generation.timing_policy,
            self.mode: preset.mode, self.baseline: self._baseline_value(preset),
            self.model_source: preset.model.source,
            self.dtype: preset.model.dtype if preset.model.dtype in self.dtypes else self.dtypes[0],
            self.device: preset.model.device if preset.model.device in self.devices else "auto",
            self.preset_about: preset.description,
            self.run_status: line_html(f"preset {preset.name}: {len(preset.columns)} columns; press Run"),
            self.preset_state: carried_overrides(preset.columns),
        }
        loaded = self._loaded_for(preset.model.source, preset.model.dtype, preset.model.device)
        for slot, (strategy, knobs) in enumerate(slot_specs(preset.columns)):
            updates[self.cards[slot].strategy] = strategy
            updates.update(self.card_updates(slot, strategy, knobs, loaded))
        return updates

    def prepare(self, session: dict, request: gr.Request = None):
        """Run clicked (not queued): a fresh stop event for this session, Run disabled, Stop enabled."""
        session["stop"] = threading.Event()
        key = getattr(request, "session_hash", None)
        if key:
            self.live_stops[key] = session["stop"]
        return (gr.update(interactive=False), gr.update(interactive=True),
                line_html("waiting for a free slot…", "busy"))

    def unload(self, request: gr.Request) -> None:
        """The page closed: its run (columns, re-timing, fidelity) ends within a token and frees the
        model-bound queue."""
        event = self.live_stops.pop(getattr(request, "session_hash", None) or "", None)
        if event is not None:
            event.set()

    def stop(self, session: dict):
        """Stop: end every column of this session's run within a token."""
        event = session.get("stop")
        if event is None or event.is_set():
            return gr.skip()
        event.set()
        return line_html("stopping…", "busy")

    # ----- the run -----

    def request_from(self, data: dict) -> RunRequest:
        """A RunRequest from the Run event's {component: value} inputs."""
        return RunRequest(
            **{name: data[component] for name, component in self.updater.form.items()},
            slots=[(data[card.strategy], [data[box] for box in card.knobs]) for card in self.cards],
            budgets=[(data[card.budget], data[card.fallback]) for card in self.cards],
            preset_overrides=data[self.preset_state] or {}, clip=data[self.clip] or "",
        )

    def run(self, data: dict):
        """Run (queued, model-bound): stream the run into the page. A failure is shown, never raised."""
        session = data[self.session]
        stop = session.get("stop") or threading.Event()
        try:
            yield from self.stream(self.request_from(data), stop, session)
        except Exception as err:  # noqa: BLE001 - the page shows what went wrong instead of a bare "Error"
            logger.exception("compare run failed")
            yield {self.run_status: line_html(f"✖ the run failed: {type(err).__name__}: {err}", "error")}

    def stream(self, request: RunRequest, stop: threading.Event, session: dict | None = None):
        """Validate, load, run and yield {component: update} dicts as the run goes (throttled).

        Bad input yields one status-line message and ends; a column that fails shows it in its card. The
        run's view is kept in `session["view"]` (for the PNG export).
        """
        # 1. Refuse what cannot start: stopped already, bad form, model that does not load.
        if stop.is_set():
            yield {self.run_status: line_html("stopped before the run started", "info")}
            return
        try:
            plan = plan_run(request)
            loaded = self.loader.ready(plan.spec) or (  # the load's warm-up step too
                yield from wait_for_model(self.loader, plan.spec, self.run_status, self.model_status))
            clip = get_clip(request.clip) if loaded.is_speech else None  # a speech model transcribes a clip
            prompt_ids = None if clip else encode_prompt(loaded.tokenizer, request.prompt, request.system or "",
                                                         bool(request.chat))
        except (RunRejected, ModelLoadError, ValueError) as err:
            yield {self.run_status: line_html(f"✖ {err}", "error")}
            return
        # 2. Stream the runner's events through the view, throttled, then the final summary.
        columns = plan.run_columns()
        titles, slots = [column.describe() for column in columns], plan.slots
        if loaded.is_recurrent:  # the model's own state cache, then a KV reference in a free slot
            events, titles, slots = recurrent_run(loaded, prompt_ids, columns, plan.slots, plan.settings, stop)
        else:
            events = run_speech(loaded, clip, columns, plan.settings, stop) if clip else run_compare(
                loaded, prompt_ids, columns, plan.settings, request.mode, stop, plan.baseline_index(),
                page_preset(plan))
        view = RunView(titles, slots)
        if session is not None:
            session["view"] = view
        yield self.updater.start(plan, view, loaded)
        try:
            yield from self.updater.throttled(view, events, stop)
        finally:
            stop.set()
            events.close()
        if view.done is not None:
            view.divergence_links, view.divergence_reasons = divergence_links(request, plan, view.done.results)
        yield self.updater.final(plan, view)
        yield self.plots.settle(view)


def build_compare_tab(pool, preload: bool = True, loader: BackgroundLoader | None = None) -> CompareTab:
    """Build the Compare tab inside the current `gr.Tab` context; `pool` is the app's shared ModelPool.

    preload: start loading the bundled model in the background now (joining `loader`'s load when given:
    app.py starts it before importing gradio).
    """
    return CompareTab(pool, preload=preload, loader=loader).build()
