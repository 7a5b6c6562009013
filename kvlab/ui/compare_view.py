"""The Compare tab's pure part: the form -> a validated run plan, and the runner's events -> a view model.

- `RunRequest` is what the page sends when Run is clicked; `plan_run` checks
  everything that needs no model and returns a `RunPlan` (settings, model spec,
  the valid columns by slot with their cache budgets, the slots with bad knobs)
  or raises `RunRejected`.
- `RunView.apply(event)` folds one `kvlab.events` event into a view model: per
  column the streamed text, a status (waiting, running, done, stopped, error,
  unavailable) with its message, a live readout (tokens, tok/s, cache size), the
  series the plots draw (with each fallback switch of a budgeted column), and
  after the run the summary table with the best value per metric marked.
- `start_preset`, `slot_specs`, `model_line`, `chat_box` and the help texts: what
  the form starts with and shows (the 'chat message' box follows the model). After the run, `kvlab.ui.records` writes the record,
  the exports and the code.

No gradio, no threads of its own. The browser tab (`kvlab.ui.compare_tab`)
turns this into component updates; tests feed it fake events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.events import (
    ColumnDone,
    ColumnError,
    ColumnResult,
    ColumnStarted,
    Event,
    FallbackSwitched,
    FidelityScored,
    MemorySample,
    RunDone,
    RunPhase,
    StepMetrics,
    TokenEvent,
)
from kvlab.generation import GenerationSettings
from kvlab.bundled import bundled_model
from kvlab.models import ModelLoadError, ModelSpec
from kvlab.presets import Preset, PromptSpec, load_preset
from kvlab.report import LABELS, best_marks, best_sets, by_layer_type_text, candidates, summary_rows
from kvlab.budget import require_cache
from kvlab.runner import MAX_COLUMNS, MODES, Column
from kvlab.strategies import StrategyError

from .figures import MIB
from .knobs import NO_STRATEGY, column_budget, plan_columns, preset_overrides
from .theme import line_html
from .timing_text import phase_text, quiet_readout, timing_line

BEST_MARK = " ★"
MISSING = "–"
DEFAULT_PRESET = "quickstart"
INTRO = ("Run one prompt under several KV-cache strategies at once. Each column streams its own text; the plots "
         "follow cache memory and per-token time live; after the run the summary compares speed, memory and "
         "fidelity to a baseline column.")
MODE_HELP = ("fair: columns take turns, one forward pass at a time, so per-token times are comparable · "
             "parallel: free threads, for throughput (times include contention) · sequential: one column after another")
SUMMARY_HELP = (
    "★ marks the best value per metric among finished columns; timing figures closer than their measured noise "
    "are marked as ties (all or none). **TTFT**: prefill + first token. "
    "**decode tok/s**: generated tokens per second of compute (in fair mode each column is timed alone). "
    "In fair mode the timing figures come from a quiet re-timing of each column after the live run (the same "
    "tokens, page updates paused; the cards show the live rate beside it); the plots are the live run. "
    "**ITL p50 / p99**: inter-token latency, the median and 99th percentile of the decode steps after the "
    "first token, in ms (as vLLM's and GuideLLM's benchmarks report it; the mean, p90 and end-to-end latency "
    "are in the JSON and CSV). "
    "**peak cache**: bytes of the cache tensors (not process memory); *vs baseline* divides by the baseline's. "
    "**agreement**: share of the baseline's tokens matched at the same position; **first divergence**: first "
    "token index that differs. **top-1 agreement** and **mean KL** feed the baseline's text through each "
    "column's cache (teacher-forced) and compare next-token distributions, a fairer judge of a lossy cache."
)

DISPLAY_COLUMNS = [
    ("column", "text"), ("status", "text"), ("ttft_s", "seconds"), ("decode_tok_s", "rate"), ("itl_ms_p50", "ms"),
    ("itl_ms_p99", "ms"),
    ("peak_cache_bytes", "mib"), ("vs_baseline_bytes", "ratio"), ("predicted_cache_bytes", "mib"),
    ("cache_bytes_by_layer_type", "by_type"), ("agreement", "percent"), ("first_divergence", "int"), ("top1_agreement", "percent"), ("mean_kl", "kl"),
    ("note", "text"),
]
"""The summary table: (key in `report.summary_rows`, formatter kind), in display order."""

HEADERS = {**LABELS, "peak_cache_bytes": "peak cache (MiB)", "vs_baseline_bytes": "vs baseline",
           "predicted_cache_bytes": "predicted dense (MiB)", "cache_bytes_by_layer_type": "by layer type, end (MiB)"}
"""Header shown per key: the report's labels, with MiB where the page shows bytes as MiB."""
SUMMARY_WIDTHS = ["11%", "6%", "6%", "6%", "5%", "5%", "6%", "6%", "6%", "8%", "6%", "5%", "5%", "5%", "14%"]
"""Summary table column widths, in the order of DISPLAY_COLUMNS."""

FINISHED = ("done", "stopped", "error", "unavailable")


class RunRejected(ValueError):
    """The page's input cannot start a run; the message says what to fix."""


# ----- the form -----

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
    retime: bool = True
    mode: str = "fair"
    baseline: str = "auto"
    preset: str | None = None
    model_source: str = "bundled"
    dtype: str = "float32"
    device: str = "auto"
    slots: list[tuple[str, list[str]]] = field(default_factory=list)
    budgets: list[tuple[str, str]] = field(default_factory=list)
    """Per slot: the card's cache-budget (MiB) and fallback-chain fields (missing or empty: no budget)."""

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
            retime=bool(self.retime),
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
    budgets: dict = field(default_factory=dict)
    """Slot -> its `kvlab.budget.Budget`, for the columns that have one."""
    overrides: dict = field(default_factory=dict)
    """Slot -> the preset column's own `generation:` overrides, for the slots that still hold that column."""

    @property
    def slots(self) -> list[int]:
        return [slot for slot, _ in self.columns]

    def run_columns(self) -> list[Column]:
        """The runner's columns, in run order, each with its budget and its preset column's overrides."""
        return [Column(strategy, dict(self.overrides.get(slot, {})), budget=self.budgets.get(slot))
                for slot, strategy in self.columns]

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
    budgets = {}
    for slot, strategy in list(columns):
        texts = request.budgets[slot] if slot < len(request.budgets) else ("", "")
        try:
            budget = require_cache(strategy, column_budget(*texts))
            if budget is not None:
                budgets[slot] = budget
        except StrategyError as err:
            errors[slot] = str(err)
            columns.remove((slot, strategy))
    if not columns and not errors:
        raise RunRejected("no strategy picked: choose a strategy in at least one column")
    if not columns:
        raise RunRejected("no column can run: " + "; ".join(f"column {s + 1}: {m}" for s, m in errors.items()))
    return RunPlan(request, settings, spec, columns, errors, budgets, preset_overrides(request.preset, columns))



def start_preset(presets: dict) -> Preset:
    """The preset the page opens with: DEFAULT_PRESET, else an empty form with one dynamic column."""
    if DEFAULT_PRESET in presets:
        return load_preset(presets[DEFAULT_PRESET])
    return Preset.model_construct(name="", prompt=PromptSpec.model_construct(text="", system="", chat=True),
                                  columns=[{"strategy": "dynamic"}])


def slot_specs(columns: list[dict]) -> list[tuple[str, dict]]:
    """(strategy name, knobs) for each of the MAX_COLUMNS slots from a preset's columns."""
    specs = []
    for slot in range(MAX_COLUMNS):
        spec = columns[slot] if slot < len(columns) else {"strategy": NO_STRATEGY}
        specs.append((spec["strategy"], {k: v for k, v in spec.items() if k not in ("strategy", "generation")}))
    return specs


CHAT_INFO = "use the chat template"
BASE_INFO = "base model: no chat template, the prompt is plain text"


def chat_box(source: str, loaded, reset: bool) -> dict:
    """What the 'chat message' checkbox becomes for a model: on for a chat model when `reset` (the model was
    just picked), off and locked for a base model (no chat template), as is for a source not known yet.

    `loaded` (a LoadedModel or None) decides when given, else the bundled list; returns `gr.update` fields."""
    model = None
    try:
        model = bundled_model(source)
    except ModelLoadError:
        pass
    chat = loaded.has_chat_template if loaded is not None else (model.chat if model is not None else None)
    if chat is None:
        return {}
    if not chat:
        return {"value": False, "interactive": False, "info": BASE_INFO}
    return {"interactive": True, "info": CHAT_INFO, **({"value": True} if reset else {})}


def layer_text(info: dict) -> str:
    """`30 layers` or, on a hybrid model, `18 layers (sliding_attention window 512, full_attention)`."""
    types = info["layer_types"]
    if len(types) < 2:
        return f"{info['num_hidden_layers']} layers"
    window = f" window {info['sliding_window']}" if info.get("sliding_window") else ""
    return f"{info['num_hidden_layers']} layers ({', '.join(t + (window if t != 'full_attention' else '') for t in types)})"


def model_line(status, spec: ModelSpec) -> str:
    """The model status line for a `kvlab.ui.loader.LoadStatus` (with the licence of a bundled model)."""
    if status.state == "ready":
        info = status.loaded.info()
        kind = "" if info["chat_template"] else ", base model (plain-text prompts)"
        terms = f" · licence: {info['license']}" if info.get("license") else ""
        return line_html(
            f"✔ {info['name']} ready: {layer_text(info)}, {info['num_key_value_heads']} KV heads × "
            f"{info['head_dim']} dims{kind}, {info['dtype']} on {info['device']} (loaded in {info['load_s']:.1f} s)"
            f"{terms}", "ok")
    if status.state == "loading":
        return line_html(f"{status.message} ({100 * status.fraction:.0f}%) — the page stays usable meanwhile",
                         "busy")
    if status.state == "error":
        return line_html(f"✖ {status.message}", "error")
    return line_html(f"{spec.source} is not loaded yet: click Load (or Run, which loads it first)", "info")


# ----- the view model -----

def format_mib(n_bytes: int | None) -> str:
    """Bytes as MiB with two decimals (`4055040` -> `3.87 MiB`)."""
    return MISSING if n_bytes is None else f"{n_bytes / MIB:.2f} MiB"


def format_value(value, kind: str) -> str:
    """One summary cell as text; None becomes a dash."""
    if value is None:
        return MISSING
    formats = {"seconds": "{:.3f}", "rate": "{:.1f}", "ms": "{:.1f}", "ratio": "{:.2f}×", "kl": "{:.4f}"}
    if kind in formats:
        return formats[kind].format(value)
    if kind == "mib":
        return f"{value / MIB:.2f}"
    if kind == "by_type":
        return by_layer_type_text(value, MIB, 2)
    if kind == "percent":
        return f"{100 * value:.1f}%"
    return str(value)


@dataclass
class ColumnView:
    """One column as the page shows it. Series are indexed by generated token (step); the by-layer-type ones
    map a layer type to its series. keeps: what the cache keeps on this model ('' without sliding layers)."""

    index: int
    title: str
    status: str = "waiting"
    message: str = ""
    text: str = ""
    prompt_tokens: int = 0
    cache_bytes: list[int] = field(default_factory=list)
    predicted_cache_bytes: list[int] = field(default_factory=list)
    cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    predicted_cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    per_token_s: list[float] = field(default_factory=list)
    keeps: str = ""
    switches: list[dict] = field(default_factory=list)
    result: ColumnResult | None = None

    @property
    def tokens(self) -> int:
        return len(self.per_token_s)

    def tok_s(self) -> float | None:
        """Decode tokens per second of compute (the first token, which includes prefill, is left out)."""
        decode = self.per_token_s[1:]
        total = sum(decode)
        return len(decode) / total if decode and total > 0 else None

    def readout(self) -> str:
        """The live line under the status, e.g. `23 tokens · 12.1 tok/s · cache 1.94 MiB`."""
        if self.status in ("error", "unavailable") and not self.tokens:
            return ""
        parts = [f"{self.tokens} token{'s' if self.tokens != 1 else ''}"]
        rate = self.tok_s()
        quiet = quiet_readout(self.result, rate)
        if quiet or rate is not None:
            parts.append(quiet or f"{rate:.1f} tok/s")
        if self.cache_bytes:
            parts.append(f"cache {format_mib(self.cache_bytes[-1])}")
        result = self.result
        if result is not None and result.is_baseline:
            parts.append("baseline")
        elif result is not None and result.top1_agreement is not None:
            parts.append(f"top-1 {100 * result.top1_agreement:.0f}%")
        return " · ".join(parts)

    def status_text(self) -> str:
        """Status word plus its message, e.g. `unavailable: needs a CUDA GPU ...`."""
        return f"{self.status}: {self.message}" if self.message else self.status


@dataclass
class MemoryView:
    """Process memory samples: time since the run started (s), RSS and CUDA allocated (bytes)."""

    elapsed_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    cuda_allocated_bytes: list[int] = field(default_factory=list)


class RunView:
    """The view model of one run, built by `apply`-ing its events in order.

    Args:
        titles: one title per run column (the strategies' `describe()`), in run order.
        slots: for each run column, the page slot it is shown in (its colour); default 0..n-1.
    """

    def __init__(self, titles: list[str], slots: list[int] | None = None):
        self.columns = [ColumnView(i, title) for i, title in enumerate(titles)]
        self.slots = list(slots) if slots is not None else list(range(len(titles)))
        self.memory = MemoryView()
        self.done: RunDone | None = None
        self.stop_requested = False
        self.run_phase: RunPhase | None = None

    def apply(self, event: Event) -> set[int]:
        """Fold one event in; returns the run column indices whose text or status changed."""
        if isinstance(event, MemorySample):
            self.memory.elapsed_s.append(event.elapsed_s)
            self.memory.rss_bytes.append(event.rss_bytes)
            self.memory.cuda_allocated_bytes.append(event.cuda_allocated_bytes)
            return set()
        if isinstance(event, RunPhase):
            self.run_phase = event
            return set()
        if isinstance(event, RunDone):
            self.done = event
            for column, result in zip(self.columns, event.results):
                column.result = result
            return set(range(len(self.columns)))
        if not isinstance(event, (ColumnStarted, TokenEvent, StepMetrics, FallbackSwitched, ColumnDone, ColumnError,
                                  FidelityScored)):
            raise TypeError(f"not a runner event: {event!r}")
        self._apply_to_column(self.columns[event.column], event)
        return {event.column}

    @staticmethod
    def _apply_to_column(column: ColumnView, event: Event) -> None:
        if isinstance(event, ColumnStarted):
            column.title, column.prompt_tokens, column.status = event.name, event.prompt_tokens, "running"
            column.keeps = event.keeps
        elif isinstance(event, TokenEvent):
            column.text += event.text
        elif isinstance(event, StepMetrics):
            column.per_token_s.append(event.per_token_s)
            column.cache_bytes.append(event.cache_bytes)
            column.predicted_cache_bytes.append(event.predicted_cache_bytes)
            for kind, value in event.cache_bytes_by_layer_type.items():
                column.cache_bytes_by_layer_type.setdefault(kind, []).append(value)
            for kind, value in event.predicted_cache_bytes_by_layer_type.items():
                column.predicted_cache_bytes_by_layer_type.setdefault(kind, []).append(value)
        elif isinstance(event, FallbackSwitched):
            column.switches.append(event.fallback)
            sentence = f"switched to {event.fallback['to']} at token {event.fallback['at_token']}: " \
                       f"{event.fallback['reason']}"
            column.message = "; ".join(filter(None, [column.message, sentence]))
        elif isinstance(event, ColumnDone):
            column.result, column.text = event.result, event.result.text
            column.status = "stopped" if event.result.stopped else "done"
            column.message = event.result.message
        elif isinstance(event, ColumnError):
            column.result, column.status, column.message = event.result, event.status, event.message
        else:
            column.result, column.message = event.result, event.result.message

    @property
    def columns_finished(self) -> bool:
        return all(c.status in FINISHED for c in self.columns)

    def phase(self) -> str:
        """`running`, `scoring` (columns finished, fidelity being scored), `stopping`, `stopped` or `done`."""
        if self.done is not None:
            return "stopped" if self.done.stopped else "done"
        if self.stop_requested:
            return "stopping"
        return "scoring" if self.columns_finished else "running"

    def progress_text(self) -> str:
        """One line for the run status, e.g. `running: 3 of 5 columns, 120 tokens so far`."""
        phase = self.phase()
        tokens = sum(c.tokens for c in self.columns)
        if phase == "running" and self.run_phase is not None and self.run_phase.phase == "warm_up" and not tokens:
            return phase_text(self.run_phase, tokens)
        if phase == "running":
            active = sum(c.status == "running" for c in self.columns)
            return f"running: {active} of {len(self.columns)} columns generating, {tokens} tokens so far"
        if phase == "scoring":
            return phase_text(self.run_phase, tokens) or \
                "columns finished; scoring fidelity against the baseline (teacher-forced)…"
        if phase == "stopping":
            return "stopping every column…"
        wall = f" in {self.done.wall_s:.1f} s" if self.done else ""
        counts = {}
        for c in self.columns:
            counts[c.status] = counts.get(c.status, 0) + 1
        detail = ", ".join(f"{n} {status}" for status, n in counts.items())
        return f"{'stopped' if phase == 'stopped' else 'finished'}{wall}: {tokens} tokens ({detail})" + \
            timing_line(self.done.timing if self.done else {})

    def summary(self) -> tuple[list[dict], dict[str, int]]:
        """(report.summary_rows of the final results, metric -> index of the best row); empty before RunDone."""
        if self.done is None:
            return [], {}
        rows = summary_rows(self.done.results)
        return rows, best_marks(rows)

    def summary_table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows of display strings) with `BEST_MARK` after the best value of each metric.

        Rows that tie with the best value are all marked; a metric on which every candidate row ties
        (nothing to choose) is not marked at all.
        """
        rows, _ = self.summary()
        marked = best_sets(rows)
        headers = [HEADERS[key] for key, _ in DISPLAY_COLUMNS]
        table = [[format_value(row[key], kind) + (BEST_MARK if i in marked.get(key, ()) else "")
                  for key, kind in DISPLAY_COLUMNS] for i, row in enumerate(rows)]
        return headers, table


def best_rows(rows: list[dict], metric: str, best: int) -> set[int]:
    """Indices of the rows tied with row `best` on `metric` (the candidates `report.best_marks` chose
    from); empty when every candidate ties."""
    value = rows[best][metric]
    competing = candidates(rows, metric)
    tied = {i for i in competing if rows[i][metric] == value}
    return set() if len(tied) == len(competing) and len(competing) > 1 else tied
