"""The Plan tab's pure part: the form -> a validated `PlanRequest`, a `Plan` -> table rows, plot series and text.

- `PlanForm` is what the page sends; `plan_request(form)` reads the context
  lengths (`1024`, `32k`; k = 1024 tokens), batch, dtype, the GPU budget (a
  card from `BUDGET_CARDS` or a number of GiB) and the strategy cards (the
  same cards and knob fields as Compare, `kvlab.ui.shared.knobs`), and returns the
  request with the cards it could not read, or raises `PlanRejected` with a
  message for the status line.
- `plan_progress(form, iterate)` resolves the model (a catalog hub id,
  `bundled`, a folder or a hub id; in the caller's thread, since a hub id reads
  the network), then plans one strategy per step through `iterate` (the app
  passes `kvlab.compute.compute_iter`), yielding a status line per step and
  then a `PlanView`; closing it between steps stops the plan. `run_plan` is
  the same, run to the end.
- `PlanView`: one table row per strategy (cache GiB at each context with ✔/✖
  against the budget, weights, total at the longest context, the longest
  context that fits, why a strategy cannot serve the model), the plot's series
  and budget line, the model line, the status line and each strategy's
  explanation.

No gradio, no threads. The layout and wiring are `kvlab.ui.plan.tab`'s; the
planning is `kvlab.plan.planner`'s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from kvlab.models.bundled import MODELS as BUNDLED_MODELS
from kvlab.columns import MAX_COLUMNS
from kvlab.models.loading import BUNDLED
from kvlab.plan.budget_input import budget_bytes
from kvlab.plan.catalog import ConfigError, known_models, resolve_config
from kvlab.plan.planner import GIB, Plan, PlanError, PlanRequest, plan_steps
from kvlab.plan.token_counts import parse_token_counts

from ..shared.figures import plan_figure, tokens_label
from ..shared.knobs import NO_STRATEGY, column_spec, plan_columns
from ..shared.markup import md_text

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_CONTEXTS = "1k, 4k, 16k, 64k, 128k"
DEFAULT_DTYPE = "bfloat16"
DEFAULT_BUDGET = "24"
NO_BUDGET = "none"
PLAN_SLOTS = MAX_COLUMNS
"""Strategy cards on the tab: as many as Compare has columns, so "measure it for real" carries them over."""
DEFAULT_SLOTS = [("dynamic", {}), ("static", {}), ("quantized", {"backend": "quanto", "nbits": 4}),
                 ("quantized", {"backend": "hqq", "nbits": 4}), ("sink", {"window_length": 1024}),
                 ("sliding_window", {})] + [(NO_STRATEGY, {})] * (MAX_COLUMNS - 6)
BUDGET_CARDS = {
    "16": "16 GB (T4, V100 16GB, RTX 4080)",
    "24": "24 GB (RTX 3090/4090, L4, A10)",
    "40": "40 GB (A100 40GB)",
    "48": "48 GB (RTX A6000, L40S)",
    "80": "80 GB (A100 80GB, H100)",
    "141": "141 GB (H200)",
}
"""GPU budget cards: GiB -> label. A card sold as N GB reports about N GiB in total (nvidia-smi); the CUDA
context and allocator take a little of it."""
PAST_LIMIT_MARK = " ⚠"
"""Appended to a context's column header when it exceeds the model's max_position_embeddings."""
INTRO = ("Plan what a KV cache costs for any model **before** loading it: exact cache bytes of each strategy at "
         "each context length (transformers' own cache classes run on shape-only tensors; no weights are read), "
         "the weights at the dtype, and the longest context that fits a GPU budget (weights + cache; activations "
         "are not counted). GiB = 2^30 bytes.")
CONTEXT_HELP = "tokens, comma separated; k = 1024 (1k, 32k, 128k)"
BUDGET_HELP = "a card, or type GiB (e.g. 30); 'none' for no budget"
MEASURE_HELP = ("Measure it for real: opens Compare with this model and these strategies. Compare runs float32 "
                "on CPU; plan in float32 to compare its cache bytes to the byte.")


class PlanRejected(ValueError):
    """The form cannot be planned; the message says what to fix."""


def budget_choices() -> list[tuple[str, str]]:
    """The budget dropdown's (label, value) pairs: no budget, then the cards."""
    return [("no budget", NO_BUDGET)] + [(label, gib) for gib, label in BUDGET_CARDS.items()]


def model_choices() -> list[tuple[str, str]]:
    """The model dropdown's (label, value) pairs: the bundled models (the default first: the model Compare
    loads), then the catalog's hub ids."""
    bundled = [(f"{key} ({model.name}{', the model Compare loads' if key == BUNDLED else ''})", key)
               for key, model in BUNDLED_MODELS.items()]
    return bundled + [(hub_id, hub_id) for hub_id in known_models()]


def parse_contexts(text) -> tuple[int, ...]:
    """Context lengths in tokens from `1024, 32k, 128k` (k = 1024, m = 1024²), sorted, each once
    (`kvlab.plan.token_counts`, which `kvlab plan --context` reads too).

    Raises:
        PlanRejected: empty, or a part that is not a whole number of tokens. Ranges are checked by the planner.
    """
    try:
        return parse_token_counts(text)
    except ValueError as err:
        raise PlanRejected(str(err)) from None


def parse_budget(value) -> int | None:
    """Bytes from a budget card's value or typed GiB (`30`, `30 GiB`, `30GB`); None for no budget.

    Raises:
        PlanRejected: not a number, not finite, not above 0 or above MAX_BUDGET_GIB.
    """
    text = str(value or "").strip()
    if not text or text.lower() in (NO_BUDGET, "no budget"):
        return None
    number = re.sub(r"\s*(gib|gb|g)?\s*(\(.*\))?$", "", text, flags=re.IGNORECASE)
    try:
        gib = float(number)
    except ValueError:
        raise PlanRejected(f"the budget is a card ({', '.join(f'{g} GB' for g in BUDGET_CARDS)}) or a number of "
                           f"GiB, got {text!r}") from None
    try:
        return budget_bytes(gib)
    except ValueError as err:
        raise PlanRejected(str(err)) from None


def _whole(value, name: str) -> int:
    if value is None or value == "":
        raise PlanRejected(f"{name} is empty: give a whole number, e.g. 1")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    raise PlanRejected(f"{name} must be a whole number, got {value!r}")


@dataclass
class PlanForm:
    """The tab's inputs as the page sends them (not yet validated). slots: per card, (strategy, knob texts)."""

    model: str = DEFAULT_MODEL
    contexts: str = DEFAULT_CONTEXTS
    batch: float | int | None = 1
    dtype: str = DEFAULT_DTYPE
    budget: str | None = DEFAULT_BUDGET
    slots: list[tuple[str, list[str]]] = field(default_factory=list)


def plan_request(form: PlanForm) -> tuple[PlanRequest, list[int], dict[int, str]]:
    """(the checked request, the card slot of each of its strategies, {slot: why its card cannot be read}).

    Raises:
        PlanRejected: no model, bad contexts, batch, dtype or budget, no strategy picked, or no card readable.
    """
    model = (form.model or "").strip()
    if not model:
        raise PlanRejected(f"no model given: pick one from the list or type a hub id or a folder; known: "
                           f"bundled, {', '.join(known_models())}")
    valid, errors = plan_columns(form.slots)
    if not valid and not errors:
        raise PlanRejected("no strategy picked: choose a strategy in at least one card")
    if not valid:
        raise PlanRejected("no card can be planned: " + _slot_errors_text(errors))
    specs = tuple(column_spec(form.slots[slot][0], form.slots[slot][1]) for slot, _ in valid)
    request = PlanRequest(model=model, contexts=parse_contexts(form.contexts), batch=_whole(form.batch, "batch"),
                          dtype=form.dtype, strategies=specs, budget_bytes=parse_budget(form.budget))
    try:
        request.check()
    except PlanError as err:
        raise PlanRejected(str(err)) from None
    return request, [slot for slot, _ in valid], errors


def _slot_errors_text(errors: dict[int, str]) -> str:
    return "; ".join(f"card {slot + 1}: {message}" for slot, message in errors.items())


def plan_progress(form: PlanForm, iterate=iter) -> Iterator[str | PlanView]:
    """Check the form and resolve its model here, then plan it one step at a time through `iterate` (each step
    of `kvlab.plan.planner.plan_steps`); yields a status line after each step, then the `PlanView`. Closing
    the generator between two steps stops the plan (nothing more is measured).

    Raises:
        PlanRejected: bad input, an unknown or refused model (the message lists the catalog), a folder without
            config.json, a config over a limit, or a config transformers cannot build.
    """
    request, slots, errors = plan_request(form)
    started = time.perf_counter()
    try:
        resolved = resolve_config(request.model)
        steps = iterate(plan_steps(replace(request, model=resolved)))
        for item in steps:
            if isinstance(item, Plan):
                yield PlanView(item, slots, errors, time.perf_counter() - started)
                return
            yield (f"planning {resolved.name}: {item.done} of {item.total} "
                   f"strateg{'y' if item.total == 1 else 'ies'} done…")
    except (ConfigError, PlanError) as err:
        raise PlanRejected(str(err)) from None


def run_plan(form: PlanForm, iterate=iter) -> PlanView:
    """`plan_progress(form, iterate)` run to the end: the view.

    Raises:
        PlanRejected: see `plan_progress`.
    """
    *_, view = plan_progress(form, iterate)
    return view


def compare_columns(slots: list[tuple[str, list[str]]]) -> list[tuple[str, dict]]:
    """(strategy, knobs) for each of Compare's columns from the plan's cards (an unreadable card: no strategy)."""
    columns = []
    for name, texts in slots[:MAX_COLUMNS]:
        try:
            spec = column_spec(name, texts)
        except KeyError:
            spec = {"strategy": NO_STRATEGY}
        columns.append((spec.pop("strategy"), spec))
    return columns + [(NO_STRATEGY, {})] * (MAX_COLUMNS - len(columns))


def slot_forms() -> list[tuple[str, dict]]:
    """(strategy, knobs) the cards open with."""
    return [(name, dict(knobs)) for name, knobs in DEFAULT_SLOTS[:PLAN_SLOTS]]


def default_requests() -> list[PlanRequest]:
    """The request the tab's opening form makes (its cards, contexts, batch, dtype and budget) for each catalog
    model, in catalog order: what the app plans once after start (`kvlab.ui.plan.tab.PlanTab`), so the kept
    measurements (`kvlab.plan.measured`) answer a visitor's first plan of any catalog model, and a changed
    context list or budget measures only what is new."""
    specs = tuple({"strategy": name, **knobs} for name, knobs in slot_forms() if name != NO_STRATEGY)
    return [PlanRequest(model=model, contexts=parse_contexts(DEFAULT_CONTEXTS), dtype=DEFAULT_DTYPE,
                        strategies=specs, budget_bytes=parse_budget(DEFAULT_BUDGET)) for model in known_models()]


def gib_text(size: int | None) -> str:
    """Bytes as GiB for the table: `0.484`, `31.0`, `113`; `—` for none."""
    if size is None:
        return "—"
    value = size / GIB
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if value >= 0.001 else "<0.001"


class PlanView:
    """What the tab shows for one `Plan`.

    Args:
        result: the planner's answer. slots: the card slot of each planned strategy (colours, like Compare's).
        slot_errors: cards that could not be read, {slot: why}. elapsed_s: seconds the plan took.
    """

    def __init__(self, result: Plan, slots: list[int], slot_errors: dict[int, str] | None = None,
                 elapsed_s: float = 0.0):
        self.plan, self.slots = result, list(slots)
        self.slot_errors = dict(slot_errors or {})
        self.elapsed_s = elapsed_s
        self.contexts = list(result.settings["contexts"])
        self.budget_bytes = result.settings["budget_bytes"]
        self.limit = result.model.get("max_position_embeddings")
        self.weights_bytes = result.strategies[0].cells[0].weights_bytes

    def past_limit(self, context: int) -> bool:
        """Whether `context` exceeds the model's max_position_embeddings (what it was trained for)."""
        return bool(self.limit) and context > self.limit

    def headers(self) -> list[str]:
        """Column headers: contexts as `1k` (1024 tokens) or `1,000`, marked past max_position_embeddings."""
        budget = "budget" if self.budget_bytes is None else f"{self.budget_bytes / GIB:g} GiB"
        return (["strategy"]
                + [f"cache GiB at {tokens_label(c)}" + (PAST_LIMIT_MARK if self.past_limit(c) else "")
                   for c in self.contexts]
                + ["weights GiB", f"total GiB at {tokens_label(self.contexts[-1])}", f"max context in {budget}",
                   "note"])

    def column_widths(self) -> list[str]:
        """Table column widths (percent), in header order: the note gets the most room."""
        fixed = {"strategy": 12, "weights": 7, "total": 7, "max": 10, "note": 19}
        each = (100 - sum(fixed.values())) / len(self.contexts)
        return ([f"{fixed['strategy']}%"] + [f"{each:.1f}%"] * len(self.contexts)
                + [f"{fixed[key]}%" for key in ("weights", "total", "max", "note")])

    def _max_context_text(self, strategy) -> str:
        if self.budget_bytes is None or strategy.status != "ok":
            return "—"
        if strategy.max_context_unbounded:
            return "unbounded"
        bound = strategy.max_context_in_budget
        if bound == 0:
            return "none: weights alone exceed it" if self.weights_bytes > self.budget_bytes else "none"
        return f"{bound:,} tokens" + (PAST_LIMIT_MARK if self.past_limit(bound) else "")

    def _cache_text(self, cell) -> str:
        text = gib_text(cell.cache_bytes)
        if cell.cache_bytes is None or cell.fits is None:
            return text
        return f"{text}\u00a0{'✔' if cell.fits else '✖'}"  # a no-break space keeps the mark beside its number

    def rows(self) -> list[list[str]]:
        """One row per planned strategy in card order, then one per unreadable card."""
        rows = []
        for strategy in self.plan.strategies:
            errors = [cell.error for cell in strategy.cells if cell.error]
            note = strategy.message if strategy.status != "ok" else (errors[0] if errors else "")
            rows.append([strategy.name] + [self._cache_text(cell) for cell in strategy.cells]
                        + [gib_text(self.weights_bytes), gib_text(strategy.cells[-1].total_bytes),
                           self._max_context_text(strategy), note])
        for slot, message in self.slot_errors.items():
            rows.append([f"card {slot + 1}"] + ["—"] * (len(self.contexts) + 3) + [f"invalid settings: {message}"])
        return rows

    def series(self) -> list[dict]:
        """Per planned strategy with bytes: label, card slot, contexts, cache GiB and on-device GiB (offloaded)."""
        drawn = []
        for strategy, slot in zip(self.plan.strategies, self.slots):
            cells = [cell for cell in strategy.cells if cell.cache_bytes is not None]
            if not cells:
                continue
            drawn.append({"label": strategy.name, "slot": slot, "contexts": [cell.context for cell in cells],
                          "cache_gib": [cell.cache_bytes / GIB for cell in cells],
                          "on_device_gib": [cell.cache_bytes_on_device / GIB for cell in cells]})
        return drawn

    def room_gib(self) -> float | None:
        """GiB left for the cache in the budget after the weights (None without a budget; may be <= 0)."""
        return None if self.budget_bytes is None else (self.budget_bytes - self.weights_bytes) / GIB

    def figure(self):
        """Cache GiB against context (log axes) per strategy, with the budget's room for the cache."""
        drawn = {item["label"] for item in self.series()}
        absent = tuple(s.name for s in self.plan.strategies if s.name not in drawn)
        budget = None if self.budget_bytes is None else self.budget_bytes / GIB
        return plan_figure(self.series(), self.room_gib(), budget, self.weights_bytes / GIB, self.limit,
                           self.plan.model["name"], absent)

    def model_text(self) -> str:
        """The model line (name, origin, class, layers by type, parameters, weights, limit) and its notes
        (Markdown; what the model's source and config say is literal, `kvlab.ui.shared.markup.md_text`)."""
        model, settings = self.plan.model, self.plan.settings
        groups = ", ".join(f"{count} {md_text(label)}" for label, count in model["layer_groups"].items())
        limit = f"; max_position_embeddings {self.limit:,}" if self.limit else ""
        lines = [f"**{md_text(model['name'])}** ({md_text(model['origin'])}, {md_text(model['model_class'])}): "
                 f"{model['layers']} layers "
                 f"({groups}), {model['parameters'] / 1e9:.2f} B parameters = {gib_text(self.weights_bytes)} GiB of "
                 f"weights in {settings['dtype']}, batch {settings['batch']}{limit}"]
        lines += [f"- {md_text(note)}" for note in model["notes"]]
        if any(self.past_limit(c) for c in self.contexts):
            lines.append(f"- {PAST_LIMIT_MARK.strip()} marks contexts past max_position_embeddings")
        return "\n".join(lines)

    def status(self) -> tuple[str, str]:
        """(text, kind) for the status line: what was planned, what cannot serve the model, unreadable cards."""
        planned = self.plan.strategies
        refused = [s for s in planned if s.status != "ok"]
        text = (f"✔ planned {len(planned)} strateg{'y' if len(planned) == 1 else 'ies'} × {len(self.contexts)} "
                f"context{'s' if len(self.contexts) != 1 else ''} in {self.elapsed_s:.2f} s")
        if refused:
            text += " · cannot serve this model: " + "; ".join(f"{s.name}: {s.message}" for s in refused)
        if self.slot_errors:
            text += " · not planned: " + _slot_errors_text(self.slot_errors)
        return text, "error" if len(refused) == len(planned) or self.slot_errors else "ok"

    def explanations(self) -> str:
        """Markdown: per strategy, how its bytes grow, and its notes (literal text: they name the config's layer
        types)."""
        lines = []
        for strategy in self.plan.strategies:
            explanation = strategy.explanation.removeprefix(strategy.name + ": ")
            lines.append(f"- **{md_text(strategy.name)}**: {md_text(explanation)}")
            lines += [f"  - {md_text(note)}" for note in strategy.notes]
        return "\n".join(lines)

