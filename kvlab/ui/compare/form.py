"""The Compare tab's form, pure: the page's values -> a validated `RunPlan`, and what the form starts with.

- `RunRequest` is what the page sends when Run is clicked; `plan_run` checks
  everything that needs no model and returns a `RunPlan` (settings, model spec,
  the valid columns by slot with their cache budgets and preset overrides, the
  slots with bad knobs) or raises `RunRejected`.
- `carried_overrides` is what the form keeps when a preset is applied: each
  preset column's own `generation:` overrides with the column they belong to;
  `plan_run` gives them to the slots that still hold that column (the preset
  file is not read again at Run time).
- `start_preset`, `slot_specs`, `model_line` and the help texts: what the form
  starts with and shows.

No gradio. The events a run yields go to `kvlab.ui.compare.view`'s view model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.budget import require_cache
from kvlab.columns import MAX_COLUMNS, Column
from kvlab.compare.columns import MODES
from kvlab.generation import GenerationSettings, prompt_refusal
from kvlab.measure import DEFAULT_POLICY
from kvlab.models.loading import ModelSpec
from kvlab.compare.preset import Preset, PromptSpec, load_preset
from kvlab.strategies import Strategy, StrategyError

from ..shared.knobs import NO_STRATEGY, column_budget, plan_columns
from ..shared.theme import line_html

DEFAULT_PRESET = "quickstart"
INTRO = ("Run one prompt under several KV-cache strategies at once. Each column streams its own text; the plots "
         "follow cache memory and per-token time live; after the run the summary compares speed, memory and "
         "fidelity to a baseline column.")
MODE_HELP = ("fair: columns take turns, one forward pass at a time, so per-token times are comparable · "
             "parallel: free threads, for throughput (times include contention) · sequential: one column after another")


class RunRejected(ValueError):
    """The page's input cannot start a run; the message says what to fix."""


# ----- the form -----

@dataclass
class RunRequest:
    """Everything the page sends when Run is clicked (the form's values, not yet validated)."""

    prompt: str
    clip: str = ""
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
    timing_policy: str = DEFAULT_POLICY
    mode: str = "fair"
    baseline: str = "auto"
    preset: str | None = None
    model_source: str = "bundled"
    dtype: str = "float32"
    device: str = "auto"
    slots: list[tuple[str, list[str]]] = field(default_factory=list)
    budgets: list[tuple[str, str]] = field(default_factory=list)
    """Per slot: the card's cache-budget (MiB) and fallback-chain fields (missing or empty: no budget)."""
    preset_overrides: dict = field(default_factory=dict)
    """What the form carries from the preset it last applied (`carried_overrides`): slot -> that preset column's
    strategy and its `generation:` overrides."""

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
            timing_policy=self.timing_policy or DEFAULT_POLICY,
        )

    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_field(self.model_source, self.dtype, self.device)


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
    refusal = prompt_refusal(request.prompt)
    if refusal:
        raise RunRejected(refusal)
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
    return RunPlan(request, settings, spec, columns, errors, budgets,
                   slot_overrides(request.preset_overrides, columns))


def carried_overrides(columns: list[dict]) -> dict[int, dict]:
    """What the form carries from an applied preset's `columns`: slot -> {"strategy": the column's `describe()`,
    "knobs": its knobs, "generation": its overrides}, for the columns that have `generation:` overrides and
    a valid strategy (an invalid one is reported when it runs, as its card shows it)."""
    carried = {}
    for slot, spec in enumerate(columns[:MAX_COLUMNS]):
        try:
            column = Column.from_spec(spec)
        except StrategyError:
            continue
        if column.overrides:
            carried[slot] = {"strategy": column.strategy.describe(), "knobs": column.strategy.knobs(),
                             "generation": dict(column.overrides)}
    return carried


def slot_overrides(carried: dict[int, dict], columns: list[tuple[int, Strategy]]) -> dict[int, dict]:
    """Slot -> the carried `generation:` overrides, for each planned slot whose strategy is still the preset
    column's (same name and knobs); a slot the user changed runs with the run's settings, as the command line
    runs a preset's columns."""
    found = {}
    for slot, strategy in columns:
        kept = (carried or {}).get(slot)
        if kept and kept["strategy"] == strategy.describe() and kept["knobs"] == strategy.knobs():
            found[slot] = dict(kept["generation"])
    return found


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


def layer_text(info: dict) -> str:
    """`30 layers` or, on a hybrid model, `18 layers (sliding_attention window 512, full_attention)`."""
    types = info["layer_types"]
    if len(types) < 2:
        return f"{info['num_hidden_layers']} layers"
    window = f" window {info['sliding_window']}" if info.get("sliding_window") else ""
    return f"{info['num_hidden_layers']} layers ({', '.join(t + (window if t != 'full_attention' else '') for t in types)})"


def model_line(status, spec: ModelSpec) -> str:
    """The model status line for a `kvlab.ui.shared.loader.LoadStatus` (with the licence of a bundled model)."""
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
