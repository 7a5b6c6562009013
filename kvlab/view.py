"""What the Compare tab shows, computed from the runner's events; and its plots.

`RunView.apply(event)` folds one `kvlab.events` event into a view model: per
column the streamed text, a status (waiting, running, done, stopped, error,
unavailable) with its message, a live readout (tokens, tok/s, cache size), the
series the plots draw, and after the run the summary rows with the best value
per metric marked. `render_figure` draws the three live plots with matplotlib's
object API (no pyplot state, safe from worker threads); `code_snippet` writes
the transformers code that reproduces one column.

Pure: no gradio, no threads, no model. The browser tab turns this view model
into component updates; tests feed it fake events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .events import (
    ColumnDone,
    ColumnError,
    ColumnResult,
    ColumnStarted,
    Event,
    FidelityScored,
    MemorySample,
    RunDone,
    StepMetrics,
    TokenEvent,
)
from .report import LABELS, best_marks, candidates, summary_rows

MIB = 1024 * 1024
BEST_MARK = " ★"
MISSING = "–"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
"""One colour per column slot (matplotlib's tab10 without grey and olive), the same in every plot."""

STATUS_TEXT = {
    "waiting": "waiting",
    "running": "running",
    "done": "done",
    "stopped": "stopped",
    "error": "error",
    "unavailable": "unavailable",
}

DISPLAY_COLUMNS = [
    ("column", "text"), ("status", "text"), ("ttft_s", "seconds"), ("decode_tok_s", "rate"),
    ("peak_cache_bytes", "mib"), ("vs_baseline_bytes", "ratio"), ("predicted_cache_bytes", "mib"),
    ("agreement", "percent"), ("first_divergence", "int"), ("top1_agreement", "percent"), ("mean_kl", "kl"),
    ("note", "text"),
]
"""The summary table: (key in `report.summary_rows`, formatter kind), in display order."""

HEADERS = {**LABELS, "peak_cache_bytes": "peak cache (MiB)", "vs_baseline_bytes": "vs baseline",
           "predicted_cache_bytes": "predicted dense (MiB)"}
"""Header shown per key: the report's labels, with MiB where the page shows bytes as MiB."""


def format_mib(n_bytes: int | None) -> str:
    """Bytes as MiB with two decimals (`4055040` -> `3.87 MiB`)."""
    return MISSING if n_bytes is None else f"{n_bytes / MIB:.2f} MiB"


def format_value(value, kind: str) -> str:
    """One summary cell as text; None becomes a dash."""
    if value is None:
        return MISSING
    if kind == "seconds":
        return f"{value:.3f}"
    if kind == "rate":
        return f"{value:.1f}"
    if kind == "mib":
        return f"{value / MIB:.2f}"
    if kind == "ratio":
        return f"{value:.2f}×"
    if kind == "percent":
        return f"{100 * value:.1f}%"
    if kind == "kl":
        return f"{value:.4f}"
    return str(value)


@dataclass
class ColumnView:
    """One column as the page shows it. Series are indexed by generated token (step)."""

    index: int
    title: str
    status: str = "waiting"
    message: str = ""
    text: str = ""
    prompt_tokens: int = 0
    cache_bytes: list[int] = field(default_factory=list)
    predicted_cache_bytes: list[int] = field(default_factory=list)
    per_token_s: list[float] = field(default_factory=list)
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
        if rate is not None:
            parts.append(f"{rate:.1f} tok/s")
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
        word = STATUS_TEXT.get(self.status, self.status)
        return f"{word}: {self.message}" if self.message else word


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

    def apply(self, event: Event) -> set[int]:
        """Fold one event in; returns the run column indices whose text or status changed."""
        if isinstance(event, ColumnStarted):
            column = self.columns[event.column]
            column.title, column.prompt_tokens, column.status = event.name, event.prompt_tokens, "running"
            return {event.column}
        if isinstance(event, TokenEvent):
            self.columns[event.column].text += event.text
            return {event.column}
        if isinstance(event, StepMetrics):
            column = self.columns[event.column]
            column.per_token_s.append(event.per_token_s)
            column.cache_bytes.append(event.cache_bytes)
            column.predicted_cache_bytes.append(event.predicted_cache_bytes)
            return {event.column}
        if isinstance(event, MemorySample):
            self.memory.elapsed_s.append(event.elapsed_s)
            self.memory.rss_bytes.append(event.rss_bytes)
            self.memory.cuda_allocated_bytes.append(event.cuda_allocated_bytes)
            return set()
        if isinstance(event, ColumnDone):
            column = self.columns[event.column]
            column.result = event.result
            column.text = event.result.text
            column.status = "stopped" if event.result.stopped else "done"
            column.message = event.result.message
            return {event.column}
        if isinstance(event, ColumnError):
            column = self.columns[event.column]
            column.result, column.status, column.message = event.result, event.status, event.message
            return {event.column}
        if isinstance(event, FidelityScored):
            self.columns[event.column].result = event.result
            self.columns[event.column].message = event.result.message
            return {event.column}
        if isinstance(event, RunDone):
            self.done = event
            for column, result in zip(self.columns, event.results):
                column.result = result
            return set(range(len(self.columns)))
        raise TypeError(f"not a runner event: {event!r}")

    @property
    def columns_finished(self) -> bool:
        return all(c.status in ("done", "stopped", "error", "unavailable") for c in self.columns)

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
        if phase == "running":
            active = sum(c.status == "running" for c in self.columns)
            return f"running: {active} of {len(self.columns)} columns generating, {tokens} tokens so far"
        if phase == "scoring":
            return "columns finished; scoring fidelity against the baseline (teacher-forced)…"
        if phase == "stopping":
            return "stopping every column…"
        wall = f" in {self.done.wall_s:.1f} s" if self.done else ""
        counts = {}
        for c in self.columns:
            counts[c.status] = counts.get(c.status, 0) + 1
        detail = ", ".join(f"{n} {status}" for status, n in counts.items())
        return f"{'stopped' if phase == 'stopped' else 'finished'}{wall}: {tokens} tokens ({detail})"

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
        rows, marks = self.summary()
        marked = {key: best_rows(rows, key, best) for key, best in marks.items()}
        headers = [HEADERS[key] for key, _ in DISPLAY_COLUMNS]
        table = []
        for i, row in enumerate(rows):
            cells = []
            for key, kind in DISPLAY_COLUMNS:
                cell = format_value(row[key], kind)
                if i in marked.get(key, ()):
                    cell += BEST_MARK
                cells.append(cell)
            table.append(cells)
        return headers, table


def best_rows(rows: list[dict], metric: str, best: int) -> set[int]:
    """Indices of the rows tied with row `best` on `metric` (the candidates `report.best_marks` chose
    from); empty when every candidate ties."""
    value = rows[best][metric]
    competing = candidates(rows, metric)
    tied = {i for i in competing if rows[i][metric] == value}
    return set() if len(tied) == len(competing) and len(competing) > 1 else tied


def render_figure(view: RunView, width_in: float = 15.0, height_in: float = 3.8):
    """Three panels: KV cache vs generated tokens (measured solid, dense prediction dashed),
    per-token latency vs generated tokens, process RSS over time. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=90, layout="constrained")
    cache_ax, latency_ax, memory_ax = fig.subplots(1, 3)
    drawn = False
    for column, slot in zip(view.columns, view.slots):
        if not column.per_token_s:
            continue
        drawn = True
        color = COLORS[slot % len(COLORS)]
        steps = range(1, len(column.per_token_s) + 1)
        cache_ax.plot(steps, [b / MIB for b in column.cache_bytes], color=color, lw=1.8, label=column.title)
        if any(column.predicted_cache_bytes):
            cache_ax.plot(steps, [b / MIB for b in column.predicted_cache_bytes], color=color, lw=1.2, ls="--",
                          alpha=0.8)
        latency_ax.plot(steps, [1000 * s for s in column.per_token_s], color=color, lw=1.2, label=column.title)
    cache_ax.set(title="KV cache: measured (solid), dense prediction (dashed)", xlabel="generated tokens",
                 ylabel="cache tensors (MiB)")
    latency_ax.set(title="per-token latency (first token includes prefill)", xlabel="generated tokens",
                   ylabel="compute per token (ms)")
    if drawn:
        latency_ax.set_yscale("log")
        handles, labels = cache_ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncol=min(len(labels), 8), fontsize=9, frameon=False)
    memory = view.memory
    if memory.elapsed_s:
        memory_ax.plot(memory.elapsed_s, [b / MIB for b in memory.rss_bytes], color="#444444", lw=1.5,
                       label="process RSS")
        if any(memory.cuda_allocated_bytes):
            memory_ax.plot(memory.elapsed_s, [b / MIB for b in memory.cuda_allocated_bytes], color="#d62728",
                           lw=1.5, label="CUDA allocated")
        memory_ax.legend(fontsize=8, loc="lower right", frameon=False)
    memory_ax.set(title="process memory (whole process, not just caches)", xlabel="time since run start (s)",
                  ylabel="MiB")
    for ax in (cache_ax, latency_ax, memory_ax):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    return fig


def figure_png(fig) -> bytes:
    """PNG bytes of a figure (for the export)."""
    import io

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    return out.getvalue()


def _model_reference(source: str, bundled_hub_id: str) -> tuple[str, str]:
    """(expression naming the model for from_pretrained, comment line) for a model source."""
    if source == "bundled":
        return repr(bundled_hub_id), (f"# kvlab's bundled model is {bundled_hub_id} (from a Q4_1 GGUF, so tokens "
                                      "may differ slightly from the hub weights)")
    return repr(source), ""


def code_snippet(strategy, settings, prompt_text: str, system: str = "", chat: bool = True,
                 model_source: str = "bundled", dtype: str = "float32") -> str:
    """Plain transformers code that reproduces one column with `model.generate(..., cache=...)`.

    Args:
        strategy: a `kvlab.strategies.Strategy` (its `cache_code()` and `generate_kwargs_code()`).
        settings: the `GenerationSettings` of the run.
        prompt_text, system, chat: the prompt as the page had it.
        model_source: `bundled`, a hub id or a local folder; dtype: a `kvlab.models.DTYPES` name.
    """
    from .models import BUNDLED_HUB_ID

    imports, cache_line = strategy.cache_code()
    transformers_names = ["AutoModelForCausalLM", "AutoTokenizer"]
    for line in imports:
        if line.startswith("from transformers import "):
            transformers_names += [n.strip() for n in line.removeprefix("from transformers import ").split(",")]
    other_imports = [line for line in imports if not line.startswith("from transformers import ")]
    model_expr, model_comment = _model_reference(model_source, BUNDLED_HUB_ID)
    lines = ["import torch", f"from transformers import {', '.join(dict.fromkeys(transformers_names))}",
             *other_imports, ""]
    if model_comment:
        lines.append(model_comment)
    lines += [
        f"model_id = {model_expr}",
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        f"model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch.{dtype})",
        "",
    ]
    if chat:
        messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
            {"role": "user", "content": prompt_text}]
        lines += [
            f"messages = {json.dumps(messages, ensure_ascii=False)}",
            "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
            "return_dict=True)",
        ]
    else:
        lines.append(f"inputs = tokenizer({json.dumps(prompt_text, ensure_ascii=False)}, return_tensors=\"pt\")")
    lines.append(f"max_new_tokens = {settings.max_new_tokens}")
    if cache_line:
        lines.append(cache_line)
    kwargs = ["**inputs", "max_new_tokens=max_new_tokens"]
    if settings.do_sample:
        lines.append(f"torch.manual_seed({settings.seed})")
        kwargs += ["do_sample=True", f"temperature={settings.temperature}", f"top_p={settings.top_p}",
                   f"top_k={settings.top_k}"]
    else:
        kwargs.append("do_sample=False")
    if settings.repetition_penalty != 1.0:
        kwargs.append(f"repetition_penalty={settings.repetition_penalty}")
    if not settings.stop_at_eos:
        kwargs.append("eos_token_id=None")
    kwargs.append(strategy.generate_kwargs_code())
    call = ",\n    ".join(kwargs)
    lines += [
        f"out = model.generate(\n    {call},\n)",
        "print(tokenizer.decode(out[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))",
    ]
    return "\n".join(lines) + "\n"


# --- the column form: strategy name + knob fields as text <-> strategy specs ---

NO_STRATEGY = "(none)"


def knob_defaults(strategy_name: str) -> dict:
    """Knob name -> default for a registered strategy, in field order (`label` is not a knob)."""
    import dataclasses

    from .strategies import STRATEGIES

    cls = STRATEGIES[strategy_name]
    defaults = {}
    for f in dataclasses.fields(cls):
        if f.name == "label":
            continue
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
        else:
            defaults[f.name] = None
    return defaults


def max_knobs() -> int:
    """The most knobs any registered strategy has (how many knob fields a column needs)."""
    from .strategies import STRATEGIES

    return max((len(knob_defaults(name)) for name in STRATEGIES), default=0)


def knob_text(value) -> str:
    """A knob value as a form field shows it: None -> '', booleans lower case."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_knob(text, default):
    """A knob field's text -> value: empty keeps the default, else YAML scalars (`4`, `true`, `hqq`)."""
    import yaml

    if text is None or not str(text).strip():
        return default
    try:
        return yaml.safe_load(str(text).strip())
    except yaml.YAMLError:
        return str(text).strip()


def column_spec(strategy_name: str, knob_texts: list[str]) -> dict:
    """`{"strategy": name, knob: value, ...}` from a column's strategy and its knob fields (in field order).

    Only knobs that differ from their defaults are written, so specs stay short.
    """
    spec = {"strategy": strategy_name}
    for (name, default), text in zip(knob_defaults(strategy_name).items(), knob_texts):
        value = parse_knob(text, default)
        if value != default:
            spec[name] = value
    return spec


def plan_columns(slots: list[tuple[str, list[str]]]) -> tuple[list[tuple[int, object]], dict[int, str]]:
    """Validate the page's column slots.

    Args:
        slots: per slot, (strategy name or NO_STRATEGY, knob field texts).

    Returns:
        ([(slot, Strategy), ...] for the valid picked slots, {slot: error message} for invalid ones).
    """
    from .strategies import STRATEGIES, StrategyError, make_strategy

    valid, errors = [], {}
    for slot, (name, knob_texts) in enumerate(slots):
        if not name or name == NO_STRATEGY:
            continue
        if name not in STRATEGIES:
            errors[slot] = f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}"
            continue
        try:
            valid.append((slot, make_strategy(column_spec(name, knob_texts))))
        except StrategyError as err:
            errors[slot] = str(err)
    return valid, errors
