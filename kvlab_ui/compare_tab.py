"""The Compare tab: one prompt under up to eight KV-cache strategies, streamed side by side.

This module builds the components and wires their events. What the page shows
comes from `kvlab.view` (the pure adapter from runner events to a view model and
plots); running is `kvlab.runner`'s job. Per-session state lives in `gr.State`;
the one shared object is the `ModelPool` of loaded weights (through a
`BackgroundLoader`). Model-bound events (Run, the `compare` API) share one
concurrency group limited to `CONCURRENCY` jobs; the queue shows a waiting
browser tab its position.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from kvlab.generation import MAX_NEW_TOKENS_CAP, GenerationSettings, encode_prompt
from kvlab.models import DEVICES, DTYPES, ModelLoadError, ModelSpec
from kvlab.presets import PresetError, list_presets, load_preset, parse_preset
from kvlab.report import rows_to_csv, run_record
from kvlab.runner import MAX_COLUMNS, MODES, collect, run_compare
from kvlab.strategies import STRATEGIES, StrategyError, make_strategy
from kvlab.view import (
    COLORS,
    NO_STRATEGY,
    RunView,
    code_snippet,
    figure_png,
    knob_defaults,
    knob_text,
    max_knobs,
    plan_columns,
    render_figure,
)

from .loader import BackgroundLoader

logger = logging.getLogger(__name__)

CONCURRENCY = int(os.environ.get("KVLAB_CONCURRENCY", "1"))
"""Model-bound jobs (runs, API calls) running at once; the rest wait in the queue."""
MODEL_CONCURRENCY_ID = "kvlab-model"
TEXT_EVERY_S = 0.25
"""Least time between two streamed updates of the column texts and statuses."""
PLOT_EVERY_S = 1.0
"""Least time between two redraws of the live plots."""
PLOT_COST_FACTOR = 5.0
"""A redraw waits at least this many times the last redraw's cost (drawing plus sending), so the plots
never take more than about a fifth of the CPU time the model could use on a slow machine."""
LOAD_POLL_S = 0.5
EXPORTS_DIR = Path(tempfile.gettempdir()) / "kvlab-exports"
EXPORTS_KEEP_S = 3600
"""Exported files of a run stay this long on the server (seconds)."""
DEFAULT_PRESET = "quickstart"
MODE_HELP = ("fair: columns take turns, one forward pass at a time, so per-token times are comparable · "
             "parallel: free threads, for throughput (times include contention) · sequential: one column after another")
SUMMARY_HELP = (
    "★ marks the best value per metric among finished columns. **TTFT**: prefill + first token. "
    "**decode tok/s**: generated tokens per second of compute (in fair mode each column is timed alone). "
    "**peak cache**: bytes of the cache tensors (not process memory); *vs baseline* divides by the baseline's. "
    "**agreement**: share of the baseline's tokens matched at the same position; **first divergence**: first "
    "token index that differs. **top-1 agreement** and **mean KL** feed the baseline's text through each "
    "column's cache (teacher-forced) and compare next-token distributions, a fairer judge of a lossy cache."
)
SUMMARY_WIDTHS = ["14%", "8%", "6%", "6%", "7%", "6%", "7%", "7%", "7%", "7%", "6%", "19%"]
"""Summary table column widths, in the order of `kvlab.view.DISPLAY_COLUMNS`."""


class RunRejected(ValueError):
    """The page's input cannot start a run; the message says what to fix."""


@dataclass
class RunRequest:
    """Everything the page sends when Run is clicked (the form's values, not yet validated)."""

    prompt: str
    system: str = ""
    chat: bool = True
    max_new_tokens: float | int | None = 64
    decoding: str = "greedy"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: float | int | None = 0
    repetition_penalty: float | None = 1.0
    seed: float | int | None = 0
    ignore_eos: bool = False
    fidelity: bool = True
    mode: str = "fair"
    baseline: str = "auto"
    preset: str | None = None
    model_source: str = "bundled"
    dtype: str = "float32"
    device: str = "auto"
    slots: list[tuple[str, list[str]]] = field(default_factory=list)

    def settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_new_tokens=_as_int(self.max_new_tokens),
            do_sample=self.decoding == "sample",
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            top_k=_as_int(self.top_k),
            repetition_penalty=float(self.repetition_penalty) if self.repetition_penalty is not None else 0.0,
            seed=_as_int(self.seed) or 0,
            stop_at_eos=not self.ignore_eos,
            fidelity=bool(self.fidelity),
        )

    def model_spec(self) -> ModelSpec:
        return ModelSpec((self.model_source or "").strip() or "bundled", self.dtype, self.device)


@dataclass
class RunPlan:
    """A validated request: settings, the valid columns by slot, and the slots with bad knobs."""

    request: RunRequest
    settings: GenerationSettings
    spec: ModelSpec
    columns: list[tuple[int, object]]
    slot_errors: dict[int, str]

    @property
    def slots(self) -> list[int]:
        return [slot for slot, _ in self.columns]

    def baseline_index(self) -> int | None:
        """Run column index of the chosen baseline slot (None = auto: first dynamic)."""
        if not self.request.baseline or self.request.baseline == "auto":
            return None
        slot = int(self.request.baseline.split()[-1]) - 1
        return self.slots.index(slot) if slot in self.slots else None


def _as_int(value):
    """Form numbers arrive as floats (or None when emptied); keep integral values as int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def plan_run(request: RunRequest) -> RunPlan:
    """Check everything that needs no model. Raises RunRejected with a message for the status line."""
    settings = request.settings()
    problems = settings.problems()
    if request.mode not in MODES:
        problems.append(f"mode must be one of {list(MODES)}, got {request.mode!r}")
    if problems:
        raise RunRejected("; ".join(problems))
    if not (request.prompt or "").strip():
        raise RunRejected("the prompt is empty: type something to generate from")
    try:
        spec = request.model_spec()
    except ValueError as err:
        raise RunRejected(str(err)) from None
    columns, errors = plan_columns(request.slots)
    if not columns and not errors:
        raise RunRejected("no strategy picked: choose a strategy in at least one column")
    if not columns:
        raise RunRejected("no column can run: " + "; ".join(f"column {s + 1}: {m}" for s, m in errors.items()))
    return RunPlan(request, settings, spec, columns, errors)


def record_for(plan: RunPlan, loaded, done) -> dict:
    """The JSON run record (as `python -m kvlab compare --json` writes it) for a run from the page."""
    request = plan.request
    preset = parse_preset({
        "name": request.preset or "custom",
        "model": {"source": plan.spec.source, "dtype": plan.spec.dtype, "device": plan.spec.device},
        "prompt": {"text": request.prompt, "system": request.system or "", "chat": bool(request.chat)},
        "generation": dataclasses.asdict(plan.settings),
        "mode": request.mode,
        "baseline": plan.baseline_index(),
        "columns": [{"strategy": s.name, **s.knobs()} for _, s in plan.columns],
    }, "page")
    return run_record(loaded, preset, plan.settings, done)


def write_exports(record: dict, rows: list[dict], fig) -> list[str]:
    """JSON record, summary CSV and plot PNG in a fresh folder under EXPORTS_DIR; returns their paths.

    Folders older than EXPORTS_KEEP_S are removed first (gradio serves its own copies of the files).
    """
    EXPORTS_DIR.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - EXPORTS_KEEP_S
    for old in EXPORTS_DIR.iterdir():
        if old.is_dir() and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=EXPORTS_DIR))
    (folder / "kvlab-run.json").write_text(json.dumps(record, indent=1))
    (folder / "kvlab-summary.csv").write_text(rows_to_csv(rows))
    (folder / "kvlab-plots.png").write_bytes(figure_png(fig))
    return [str(folder / name) for name in ("kvlab-run.json", "kvlab-summary.csv", "kvlab-plots.png")]


def strategy_help(name: str) -> str:
    """The strategy's one-line summary plus its knob notes (class docstring) when it has some."""
    cls = STRATEGIES[name]
    doc = inspect.getdoc(cls) or ""
    generated = doc.startswith(cls.__name__ + "(")
    return cls.summary + ("" if generated or not doc else "\n\n" + " ".join(doc.split()))


def availability(loaded) -> dict[str, str | None]:
    """Strategy name -> why it cannot run on `loaded` here (None = it can), with default knobs."""
    reasons = {}
    for name in STRATEGIES:
        try:
            strategy = make_strategy({"strategy": name})
        except StrategyError:
            reasons[name] = None  # its defaults need a knob set; the column reports the problem when it runs
            continue
        reasons[name] = strategy.unavailable_reason(loaded)
    return reasons


def strategy_choices(loaded) -> list[tuple[str, str]]:
    """(label, value) pairs for a column's strategy dropdown; unavailable ones are marked."""
    reasons = availability(loaded) if loaded is not None else {}
    choices = [(NO_STRATEGY, NO_STRATEGY)]
    for name in STRATEGIES:
        label = f"{name}  ⊘ unavailable here" if reasons.get(name) else name
        choices.append((label, name))
    return choices


def status_html(title: str, status: str, readout: str = "", message: str = "") -> str:
    """A column's status block: title, a coloured status badge, the live readout and any message."""
    parts = [f'<div class="kv-status kv-s-{html.escape(status)}">',
             f'<div class="kv-title">{html.escape(title)}</div>',
             f'<span class="kv-badge">{html.escape(status)}</span>']
    if readout:
        parts.append(f'<span class="kv-readout">{html.escape(readout)}</span>')
    if message:
        parts.append(f'<div class="kv-msg">{html.escape(message)}</div>')
    parts.append("</div>")
    return "".join(parts)


def line_html(text: str, kind: str = "info") -> str:
    """The run or model status line. kind: info, busy, ok, error."""
    return f'<div class="kv-line kv-line-{kind}">{html.escape(text)}</div>'


def model_line(status, spec: ModelSpec) -> str:
    """The model status line for a `BackgroundLoader` status."""
    if status.state == "ready":
        info = status.loaded.info()
        return line_html(
            f"✔ {info['name']} ready: {info['num_hidden_layers']} layers, {info['num_key_value_heads']} KV heads × "
            f"{info['head_dim']} dims, {info['dtype']} on {info['device']} (loaded in {info['load_s']:.1f} s)", "ok")
    if status.state == "loading":
        return line_html(f"{status.message} ({100 * status.fraction:.0f}%) — the page stays usable meanwhile",
                         "busy")
    if status.state == "error":
        return line_html(f"✖ {status.message}", "error")
    return line_html(f"{spec.source} is not loaded yet: click Load (or Run, which loads it first)", "info")


class CompareTab:
    """The Compare tab's components and handlers (build it with `build_compare_tab`)."""

    def __init__(self, pool, preload: bool = True):
        self.loader = BackgroundLoader(pool)
        self.knob_count = max_knobs()
        self.presets = list_presets()
        self.devices = [d for d in DEVICES if d in ("auto", "cpu") or _device_present(d)]
        self.dtypes = list(DTYPES) if _device_present("cuda") else ["float32"]
        if preload:
            self.loader.start(ModelSpec())

    # ----- building -----

    def build(self) -> "CompareTab":
        start = load_preset(DEFAULT_PRESET) if DEFAULT_PRESET in self.presets else None
        self.session = gr.State({})
        gr.Markdown(
            "Run one prompt under several KV-cache strategies at once. Each column streams its own text; the plots "
            "follow cache memory and per-token time live; after the run the summary compares speed, memory and "
            "fidelity to a baseline column.", elem_classes=["kv-intro"])
        with gr.Row(equal_height=False, elem_classes=["kv-modelbar"]):
            self.model_source = gr.Textbox("bundled", label="Model", scale=4, elem_id="kv-model",
                                           info="'bundled' (SmolLM2-135M-Instruct, offline), a hub id or a local folder")
            self.dtype = gr.Dropdown(self.dtypes, value="float32", label="dtype", scale=1, elem_id="kv-dtype",
                                     interactive=len(self.dtypes) > 1,
                                     info="half precision needs CUDA" if len(self.dtypes) == 1 else "weights and cache")
            self.device = gr.Dropdown(self.devices, value="auto", label="device", scale=1, elem_id="kv-device",
                                      info="auto: CUDA if present, else CPU")
            self.load_button = gr.Button("Load", scale=0, min_width=90, elem_id="kv-load")
        self.model_status = gr.HTML(line_html("checking the model…", "busy"), elem_id="kv-model-status")
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Row(equal_height=True):
                    self.preset = gr.Dropdown(list(self.presets), value=start.name if start else None,
                                              label="Preset", scale=1, elem_id="kv-preset",
                                              info="fills the prompt, settings and columns")
                    self.preset_about = gr.Markdown(start.description if start else "", elem_classes=["kv-small"])
                self.prompt = gr.Textbox(start.prompt.text if start else "", label="Prompt", lines=3,
                                         elem_id="kv-prompt")
                with gr.Row(equal_height=True):
                    self.system = gr.Textbox(start.prompt.system if start else "", label="System prompt (optional)",
                                             scale=4, elem_id="kv-system")
                    self.chat = gr.Checkbox(start.prompt.chat if start else True, label="chat message",
                                            info="use the chat template", scale=1, elem_id="kv-chat")
            with gr.Column(scale=2):
                generation = start.generation if start else None
                with gr.Row(equal_height=True):
                    self.max_new_tokens = gr.Number(generation.max_new_tokens if generation else 64, precision=0,
                                                    label=f"max new tokens (1–{MAX_NEW_TOKENS_CAP})",
                                                    elem_id="kv-max-new", min_width=140)
                    self.decoding = gr.Radio(["greedy", "sample"], label="decoding", elem_id="kv-decoding",
                                             value="sample" if generation and generation.do_sample else "greedy")
                    self.ignore_eos = gr.Checkbox(bool(generation and not generation.stop_at_eos), label="ignore EOS",
                                                  elem_id="kv-ignore-eos", info="keep going past end-of-text")
                sampling = bool(generation and generation.do_sample)
                with gr.Row(equal_height=True):
                    self.temperature = gr.Slider(0.05, 2.0, generation.temperature if generation else 1.0,
                                                 step=0.05, label="temperature", interactive=sampling)
                    self.top_p = gr.Slider(0.05, 1.0, generation.top_p if generation else 1.0, step=0.05,
                                           label="top_p", interactive=sampling)
                with gr.Row(equal_height=True):
                    self.top_k = gr.Number(generation.top_k if generation else 0, precision=0, label="top_k (0 = off)",
                                           interactive=sampling, min_width=90)
                    self.repetition_penalty = gr.Number(generation.repetition_penalty if generation else 1.0,
                                                        label="repetition penalty", min_width=90, step=0.05)
                    self.seed = gr.Number(generation.seed if generation else 0, precision=0, label="seed",
                                          min_width=90)
                self.mode = gr.Radio(list(MODES), value=start.mode if start else "fair", label="mode",
                                     info=MODE_HELP, elem_id="kv-mode")
                with gr.Row(equal_height=True):
                    self.baseline = gr.Dropdown(self._baseline_choices(), value=self._baseline_value(start),
                                                label="fidelity baseline", elem_id="kv-baseline",
                                                info="auto: the first dynamic column")
                    self.fidelity = gr.Checkbox(bool(generation.fidelity) if generation else True,
                                                label="score fidelity", elem_id="kv-fidelity",
                                                info="teacher-forced, after the columns finish")
        with gr.Row(equal_height=True, elem_classes=["kv-runbar"]):
            self.run_button = gr.Button("Run", variant="primary", scale=0, min_width=120, elem_id="kv-run")
            self.stop_button = gr.Button("Stop", variant="stop", scale=0, min_width=120, elem_id="kv-stop",
                                         interactive=False)
            self.run_status = gr.HTML(line_html("ready: pick a preset or strategies, then Run"), elem_id="kv-run-status")
        self._build_cards(start)
        self.plot = gr.Plot(label="Live plots", show_label=False, elem_id="kv-plot", format="png", visible=False)
        with gr.Column(visible=False, elem_id="kv-results") as self.results:
            self.summary = gr.Dataframe(value=None, headers=None, interactive=False, wrap=True, elem_id="kv-summary",
                                        label="Summary", max_height=900, column_widths=SUMMARY_WIDTHS)
            gr.Markdown(SUMMARY_HELP, elem_classes=["kv-small"])
            self.exports = gr.File(label="Export: JSON record, summary CSV, plots PNG", file_count="multiple",
                                   interactive=False, elem_id="kv-exports")
        with gr.Accordion("View code: reproduce each column with plain transformers", open=False,
                          elem_id="kv-code-box"):
            self.code = gr.Code(language="python", label="generate(..., cache=...)", elem_id="kv-code",
                                interactive=False, lines=12, max_lines=60)
        self.timer = gr.Timer(1.0, active=True)
        self._wire()
        return self

    def _build_cards(self, start) -> None:
        columns = start.columns if start else [{"strategy": "dynamic"}]
        self.cards = []
        for row_start in range(0, MAX_COLUMNS, 4):
            with gr.Row(equal_height=False, elem_classes=["kv-cards"]):
                for slot in range(row_start, min(row_start + 4, MAX_COLUMNS)):
                    spec = columns[slot] if slot < len(columns) else None
                    self.cards.append(self._build_card(slot, spec))

    def _build_card(self, slot: int, spec: dict | None) -> dict:
        name = spec["strategy"] if spec else NO_STRATEGY
        knobs = {k: v for k, v in spec.items() if k not in ("strategy", "generation")} if spec else {}
        updates = self.card_config(name, knobs, None)
        with gr.Column(min_width=240, elem_classes=["kv-card", f"kv-slot-{slot}"], elem_id=f"kv-card-{slot}"):
            strategy = gr.Dropdown(strategy_choices(None), value=name, label=f"Column {slot + 1}",
                                   elem_id=f"kv-col-{slot}-strategy")
            status = gr.HTML(**updates["status"], elem_id=f"kv-col-{slot}-status")
            text = gr.Textbox(**updates["text"], lines=9, max_lines=9, show_label=False, interactive=False,
                              autoscroll=True, elem_id=f"kv-col-{slot}-text", elem_classes=["kv-text"])
            with gr.Row(equal_height=False, elem_classes=["kv-knobs"]):
                knob_boxes = [gr.Textbox(**updates["knobs"][j], min_width=76, max_lines=1,
                                         elem_id=f"kv-col-{slot}-knob-{j}") for j in range(self.knob_count)]
            about = gr.Markdown(**updates["about"], elem_classes=["kv-about"])
        return {"strategy": strategy, "about": about, "knobs": knob_boxes, "status": status, "text": text}

    def _baseline_choices(self) -> list[str]:
        return ["auto"] + [f"column {i + 1}" for i in range(MAX_COLUMNS)]

    @staticmethod
    def _baseline_value(preset) -> str:
        return "auto" if preset is None or preset.baseline is None else f"column {preset.baseline + 1}"

    # ----- per-card configuration -----

    def card_config(self, name: str, knobs: dict, loaded) -> dict:
        """Property dicts for one card's about text, knob fields, status and text, for strategy `name`."""
        if name == NO_STRATEGY or name not in STRATEGIES:
            about = "Pick a strategy to add a column." if name == NO_STRATEGY else f"unknown strategy {name!r}"
            return {
                "about": {"value": about, "visible": True},
                "knobs": [{"value": "", "label": "", "visible": False} for _ in range(self.knob_count)],
                "status": {"value": "", "visible": False},
                "text": {"value": "", "visible": False},
            }
        reason = availability(loaded).get(name) if loaded is not None else None
        about = strategy_help(name) + (f"\n\n**⊘ unavailable here:** {reason}" if reason else "")
        defaults = list(knob_defaults(name).items())
        fields = []
        for j in range(self.knob_count):
            if j < len(defaults):
                knob, default = defaults[j]
                fields.append({"value": knob_text(knobs.get(knob, default)), "label": knob, "visible": True,
                               "placeholder": "auto" if default is None else knob_text(default)})
            else:
                fields.append({"value": "", "label": "", "visible": False})
        return {
            "about": {"value": about, "visible": True},
            "knobs": fields,
            "status": {"value": status_html(name, "unavailable" if reason else "ready", "", reason or ""),
                       "visible": True},
            "text": {"value": "", "visible": True},
        }

    def card_updates(self, slot: int, name: str, knobs: dict, loaded) -> dict:
        """{component: gr.update} setting card `slot` to strategy `name` with `knobs`."""
        config = self.card_config(name, knobs, loaded)
        card = self.cards[slot]
        updates = {card["about"]: gr.update(**config["about"]), card["status"]: gr.update(**config["status"]),
                   card["text"]: gr.update(**config["text"])}
        for box, props in zip(card["knobs"], config["knobs"]):
            updates[box] = gr.update(**props)
        return updates

    def _loaded_for(self, source, dtype, device):
        try:
            return self.loader.pool.loaded(ModelSpec((source or "").strip() or "bundled", dtype, device))
        except ValueError:
            return None

    # ----- events -----

    def _wire(self) -> None:
        card_outputs = [c for card in self.cards for c in (card["about"], *card["knobs"], card["status"], card["text"])]
        strategies = [card["strategy"] for card in self.cards]
        model_inputs = [self.model_source, self.dtype, self.device]
        self.timer.tick(self.tick, model_inputs, [self.model_status, self.timer, *strategies],
                        show_progress="hidden", concurrency_limit=None, api_visibility="private")
        self.load_button.click(self.load, model_inputs, [self.model_status, self.timer], concurrency_limit=None,
                               api_visibility="private")
        for slot, card in enumerate(self.cards):
            card["strategy"].input(
                lambda name, source, dtype, device, slot=slot: self.card_updates(
                    slot, name, {}, self._loaded_for(source, dtype, device)),
                [card["strategy"], *model_inputs],
                [card["about"], *card["knobs"], card["status"], card["text"]],
                show_progress="hidden", concurrency_limit=None, api_visibility="private")
        self.decoding.change(lambda d: [gr.update(interactive=d == "sample")] * 3, self.decoding,
                             [self.temperature, self.top_p, self.top_k], show_progress="hidden",
                             concurrency_limit=None, api_visibility="private")
        self.form_outputs = [
            self.prompt, self.system, self.chat, self.max_new_tokens, self.decoding, self.temperature, self.top_p,
            self.top_k, self.repetition_penalty, self.seed, self.ignore_eos, self.fidelity, self.mode, self.baseline,
            self.model_source, self.dtype, self.device, self.preset_about, self.run_status, *strategies, *card_outputs,
        ]
        self.preset.input(self.apply_preset, [self.preset, *model_inputs], self.form_outputs,
                          show_progress="hidden", concurrency_limit=None, api_visibility="private")
        self.run_inputs = {
            self.session, self.prompt, self.system, self.chat, self.max_new_tokens, self.decoding, self.temperature,
            self.top_p, self.top_k, self.repetition_penalty, self.seed, self.ignore_eos, self.fidelity, self.mode,
            self.baseline, self.preset, *model_inputs, *strategies, *[b for card in self.cards for b in card["knobs"]],
        }
        self.run_outputs = [self.run_status, self.model_status, self.plot, self.results, self.summary, self.exports,
                            self.code,
                            *[c for card in self.cards for c in (card["status"], card["text"])]]
        self.run_button.click(
            self.prepare, self.session, [self.run_button, self.stop_button, self.run_status],
            concurrency_limit=None, show_progress="hidden", api_visibility="private",
        ).then(
            self.run, self.run_inputs, self.run_outputs, concurrency_limit=CONCURRENCY,
            concurrency_id=MODEL_CONCURRENCY_ID, show_progress="full", show_progress_on=[self.run_status],
            api_visibility="private",
        ).then(
            lambda: (gr.update(interactive=True), gr.update(interactive=False)), None,
            [self.run_button, self.stop_button], show_progress="hidden", concurrency_limit=None,
            api_visibility="private",
        )
        self.stop_button.click(self.stop, self.session, self.run_status, concurrency_limit=None,
                               show_progress="hidden", api_visibility="private")
        gr.api(self.api_compare, api_name="compare", concurrency_limit=CONCURRENCY,
               concurrency_id=MODEL_CONCURRENCY_ID)

    def tick(self, source, dtype, device):
        """Timer: refresh the model status line; stop ticking once the load has ended (ready or failed)."""
        try:
            spec = ModelSpec((source or "").strip() or "bundled", dtype, device)
        except ValueError as err:
            return line_html(f"✖ {err}", "error"), gr.Timer(active=False), *[gr.skip()] * MAX_COLUMNS
        status = self.loader.status(spec)
        if status.state == "loading":
            return model_line(status, spec), gr.Timer(active=True), *[gr.skip()] * MAX_COLUMNS
        choices = strategy_choices(status.loaded)
        return (model_line(status, spec), gr.Timer(active=False),
                *[gr.update(choices=choices) for _ in range(MAX_COLUMNS)])

    def load(self, source, dtype, device):
        """Load button: start loading in the background; the timer reports progress."""
        try:
            spec = ModelSpec((source or "").strip() or "bundled", dtype, device)
        except ValueError as err:
            return line_html(f"✖ {err}", "error"), gr.Timer(active=False)
        status = self.loader.start(spec)
        return model_line(status, spec), gr.Timer(active=True)

    def apply_preset(self, name, source, dtype, device) -> dict:
        """Preset dropdown: fill the prompt, settings, model fields and columns from `presets/<name>.yaml`."""
        try:
            preset = load_preset(self.presets.get(name, name))
        except PresetError as err:
            return {self.run_status: line_html(f"✖ {err}", "error")}
        generation = preset.generation
        loaded = self._loaded_for(preset.model.source, preset.model.dtype, preset.model.device)
        updates = {
            self.prompt: preset.prompt.text, self.system: preset.prompt.system, self.chat: preset.prompt.chat,
            self.max_new_tokens: generation.max_new_tokens,
            self.decoding: "sample" if generation.do_sample else "greedy",
            self.temperature: gr.update(value=generation.temperature, interactive=generation.do_sample),
            self.top_p: gr.update(value=generation.top_p, interactive=generation.do_sample),
            self.top_k: gr.update(value=generation.top_k, interactive=generation.do_sample),
            self.repetition_penalty: generation.repetition_penalty, self.seed: generation.seed,
            self.ignore_eos: not generation.stop_at_eos, self.fidelity: generation.fidelity,
            self.mode: preset.mode, self.baseline: self._baseline_value(preset),
            self.model_source: preset.model.source,
            self.dtype: preset.model.dtype if preset.model.dtype in self.dtypes else self.dtypes[0],
            self.device: preset.model.device if preset.model.device in self.devices else "auto",
            self.preset_about: preset.description,
            self.run_status: line_html(f"preset {preset.name}: {len(preset.columns)} columns; press Run"),
        }
        for slot, card in enumerate(self.cards):
            spec = preset.columns[slot] if slot < len(preset.columns) else None
            name = spec["strategy"] if spec else NO_STRATEGY
            knobs = {k: v for k, v in spec.items() if k not in ("strategy", "generation")} if spec else {}
            updates[card["strategy"]] = name
            updates.update(self.card_updates(slot, name, knobs, loaded))
        return updates

    def prepare(self, session: dict):
        """Run clicked (not queued): a fresh stop event for this session, Run disabled, Stop enabled."""
        session["stop"] = threading.Event()
        return (gr.update(interactive=False), gr.update(interactive=True),
                line_html("waiting for a free slot…", "busy"))

    def stop(self, session: dict):
        """Stop: end every column of this session's run within a token."""
        event = session.get("stop")
        if event is None or event.is_set():
            return gr.skip()
        event.set()
        return line_html("stopping…", "busy")

    def request_from(self, data: dict) -> RunRequest:
        """A RunRequest from the Run event's {component: value} inputs."""
        return RunRequest(
            prompt=data[self.prompt], system=data[self.system], chat=data[self.chat],
            max_new_tokens=data[self.max_new_tokens], decoding=data[self.decoding],
            temperature=data[self.temperature], top_p=data[self.top_p], top_k=data[self.top_k],
            repetition_penalty=data[self.repetition_penalty], seed=data[self.seed],
            ignore_eos=data[self.ignore_eos], fidelity=data[self.fidelity], mode=data[self.mode],
            baseline=data[self.baseline], preset=data[self.preset], model_source=data[self.model_source],
            dtype=data[self.dtype], device=data[self.device],
            slots=[(data[card["strategy"]], [data[b] for b in card["knobs"]]) for card in self.cards],
        )

    def run(self, data: dict):
        """Run (queued, model-bound): stream the run into the page. A failure is shown, never raised."""
        session = data[self.session]
        stop = session.get("stop") or threading.Event()
        try:
            yield from self.stream(self.request_from(data), stop)
        except Exception as err:  # noqa: BLE001 - the page shows what went wrong instead of a bare "Error"
            logger.exception("compare run failed")
            yield {self.run_status: line_html(f"✖ the run failed: {type(err).__name__}: {err}", "error")}

    # ----- the run itself -----

    def stream(self, request: RunRequest, stop: threading.Event):
        """Validate, load, run and yield {component: update} dicts as the run goes (throttled).

        Bad input yields one status-line message and ends; a column that fails shows it in its card.
        """
        if stop.is_set():
            yield {self.run_status: line_html("stopped before the run started", "info")}
            return
        try:
            plan = plan_run(request)
        except RunRejected as err:
            yield {self.run_status: line_html(f"✖ {err}", "error")}
            return
        try:
            loaded = self.loader.pool.loaded(plan.spec)
            if loaded is None:
                loaded = yield from self._wait_for_model(plan.spec)
            prompt_ids = encode_prompt(loaded.tokenizer, request.prompt, request.system or "", bool(request.chat))
        except (ModelLoadError, ValueError) as err:
            yield {self.run_status: line_html(f"✖ {err}", "error")}
            return
        strategies = [strategy for _, strategy in plan.columns]
        view = RunView([s.describe() for s in strategies], plan.slots)
        yield self._start_updates(plan, view)
        events = run_compare(loaded, prompt_ids, strategies, plan.settings, request.mode, stop,
                             plan.baseline_index())
        last_text = time.monotonic()
        plot_due = last_text + PLOT_EVERY_S
        changed: set[int] = set()
        try:
            for event in events:
                changed |= view.apply(event)
                view.stop_requested = stop.is_set()
                now = time.monotonic()
                if view.done is not None or now - last_text < TEXT_EVERY_S:
                    continue
                updates = self._column_updates(view, changed)
                updates[self.run_status] = line_html(view.progress_text(), "busy")
                plotted = now >= plot_due
                if plotted:
                    updates[self.plot] = render_figure(view)
                changed = set()
                yield updates
                last_text = time.monotonic()
                if plotted:
                    plot_due = last_text + max(PLOT_EVERY_S, PLOT_COST_FACTOR * (last_text - now))
        finally:
            stop.set()
            events.close()
        yield self._final_updates(plan, view, loaded)

    def _wait_for_model(self, spec: ModelSpec):
        """Generator: start or join the load of `spec`, yielding progress; returns the loaded model."""
        status = self.loader.start(spec)
        while status.state == "loading":
            yield {self.run_status: line_html(f"{status.message} ({100 * status.fraction:.0f}%)", "busy"),
                   self.model_status: model_line(status, spec)}
            time.sleep(LOAD_POLL_S)
            status = self.loader.status(spec)
        if status.state != "ready":
            raise ModelLoadError(status.message or f"could not load {spec.source!r}")
        yield {self.model_status: model_line(status, spec)}
        return status.loaded

    def _start_updates(self, plan: RunPlan, view: RunView) -> dict:
        updates = {self.run_status: line_html("starting…", "busy"), self.plot: gr.update(value=None, visible=True),
                   self.results: gr.update(visible=False), self.summary: None, self.exports: None, self.code: ""}
        for slot, card in enumerate(self.cards):
            if slot in plan.slot_errors:
                updates[card["status"]] = gr.update(value=status_html("invalid settings", "error", "",
                                                                      plan.slot_errors[slot]), visible=True)
                updates[card["text"]] = gr.update(value="", visible=True)
            elif slot not in plan.slots:
                updates[card["status"]] = gr.update(value="", visible=False)
                updates[card["text"]] = gr.update(value="", visible=False)
        updates.update(self._column_updates(view, set(range(len(view.columns)))))
        return updates

    def _column_updates(self, view: RunView, indices: set[int]) -> dict:
        updates = {}
        for i in sorted(indices):
            column = view.columns[i]
            card = self.cards[view.slots[i]]
            updates[card["status"]] = gr.update(
                value=status_html(column.title, column.status, column.readout(), column.message), visible=True)
            updates[card["text"]] = gr.update(value=column.text, visible=True)
        return updates

    def _final_updates(self, plan: RunPlan, view: RunView, loaded) -> dict:
        updates = self._column_updates(view, set(range(len(view.columns))))
        fig = render_figure(view)
        updates[self.plot] = fig
        if view.done is None:
            updates[self.run_status] = line_html("the run ended without a result", "error")
            return updates
        headers, table = view.summary_table()
        updates[self.summary] = gr.update(value=table, headers=headers)
        updates[self.results] = gr.update(visible=True)
        rows, _ = view.summary()
        record = record_for(plan, loaded, view.done)
        updates[self.exports] = write_exports(record, rows, fig)
        updates[self.code] = self.code_text(plan, view)
        errors = [f"column {s + 1}: {m}" for s, m in plan.slot_errors.items()]
        status = view.progress_text() + (" — not run: " + "; ".join(errors) if errors else "")
        updates[self.run_status] = line_html(status, "error" if errors else "ok")
        return updates

    @staticmethod
    def code_text(plan: RunPlan, view: RunView | None = None) -> str:
        """One self-contained snippet per column; columns that could not run here say why."""
        request = plan.request
        blocks = []
        for i, (slot, strategy) in enumerate(plan.columns):
            header = f"# ── column {slot + 1}: {strategy.describe()} " + "─" * 20
            column = view.columns[i] if view is not None else None
            if column is not None and column.status in ("unavailable", "error"):
                header += f"\n# ({column.status} here: {column.message})"
            blocks.append(header + "\n" + code_snippet(strategy, plan.settings, request.prompt, request.system or "",
                                                       bool(request.chat), plan.spec.source, plan.spec.dtype))
        return "\n\n".join(blocks)

    # ----- API -----

    def api_compare(self, preset: str, prompt: str | None = None, max_new_tokens: int | None = None) -> dict:
        """Run a preset headless and return its JSON run record (what `python -m kvlab compare --json` writes).

        Args:
            preset: the name of a file in presets/ (e.g. "quickstart").
            prompt: replaces the preset's prompt text when given.
            max_new_tokens: replaces the preset's max_new_tokens when given.
        """
        if preset not in self.presets:
            raise gr.Error(f"unknown preset {preset!r}; available: {', '.join(self.presets)}")
        try:
            data = load_preset(self.presets[preset]).model_dump()
            if prompt is not None:
                if not prompt.strip():
                    raise ValueError("the prompt is empty: type something to generate from")
                data["prompt"]["text"] = prompt
            if max_new_tokens is not None:
                settings = GenerationSettings(**{**data["generation"], "max_new_tokens": max_new_tokens})
                settings.check()
                data["generation"]["max_new_tokens"] = max_new_tokens
            parsed = parse_preset(data, preset)
            settings = parsed.settings()
            settings.check()
            loaded = self.loader.get(ModelSpec(**parsed.model.model_dump()))
            prompt_ids = encode_prompt(loaded.tokenizer, parsed.prompt.text, parsed.prompt.system, parsed.prompt.chat)
            done = collect(run_compare(loaded, prompt_ids, parsed.build_columns(), settings, parsed.mode,
                                       threading.Event(), parsed.baseline))
        except (PresetError, ModelLoadError, ValueError) as err:
            raise gr.Error(str(err)) from None
        return run_record(loaded, parsed, settings, done)


def _device_present(device: str) -> bool:
    import torch

    if device == "cuda":
        return torch.cuda.is_available()
    if device == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return device in ("auto", "cpu")


def build_compare_tab(pool, preload: bool = True) -> CompareTab:
    """Build the Compare tab inside the current `gr.Tab` context; `pool` is the app's shared ModelPool.

    preload: start loading the bundled model in the background now.
    """
    return CompareTab(pool, preload=preload).build()


CSS = """
.kv-intro p { margin: 0; color: var(--body-text-color-subdued); }
.kv-small, .kv-small p { font-size: 0.9em; color: var(--body-text-color-subdued); }
.kv-line { padding: 6px 10px; border-radius: 6px; font-size: 0.95em; }
.kv-line-info { background: var(--background-fill-secondary); }
.kv-line-busy { background: #eef4ff; color: #1d4ed8; }
.kv-line-ok { background: #ecfdf3; color: #067647; }
.kv-line-error { background: #fef3f2; color: #b42318; font-weight: 600; }
.kv-runbar { align-items: center; }
.kv-modelbar { align-items: flex-end; }
#kv-load { margin-bottom: 4px; }
.kv-card { border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px !important;
           background: var(--background-fill-primary); gap: 6px !important; }
.kv-about, .kv-about p { font-size: 0.8em; line-height: 1.35; color: var(--body-text-color-subdued); margin: 0; }
.kv-knobs { gap: 4px !important; }
.kv-knobs label span { font-size: 0.75em; }
.kv-status { font-size: 0.85em; line-height: 1.5; }
.kv-title { font-weight: 600; font-size: 1.05em; }
.kv-badge { display: inline-block; padding: 0 8px; border-radius: 999px; font-size: 0.85em; font-weight: 600;
            background: #e5e7eb; color: #374151; margin-right: 6px; }
.kv-s-running .kv-badge { background: #dbeafe; color: #1d4ed8; }
.kv-s-done .kv-badge { background: #dcfce7; color: #15803d; }
.kv-s-stopped .kv-badge { background: #fef9c3; color: #854d0e; }
.kv-s-error .kv-badge { background: #fee2e2; color: #b91c1c; }
.kv-s-unavailable .kv-badge { background: #f3f4f6; color: #6b7280; }
.kv-s-unavailable { opacity: 0.75; }
.kv-readout { font-variant-numeric: tabular-nums; }
.kv-msg { color: #b42318; font-size: 0.9em; }
.kv-s-unavailable .kv-msg, .kv-s-stopped .kv-msg, .kv-s-done .kv-msg { color: var(--body-text-color-subdued); }
.kv-text textarea { font-size: 0.85em !important; line-height: 1.4 !important; }
""" + "".join(f".kv-slot-{i} {{ border-top: 4px solid {color} !important; }}\n" for i, color in enumerate(COLORS))
