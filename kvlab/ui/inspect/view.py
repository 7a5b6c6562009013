"""The Inspect tab's pure part: the form -> a validated plan, and an Inspect session's step records -> what the
page shows.

- `InspectRequest` is what the page sends; `plan_inspect` checks everything that needs no model (prompt,
  steps, the strategy card) and returns an `InspectPlan` or raises `InspectRejected`.
- `InspectTabState` is one browser session's `kvlab.inspect.inspector.InspectSession` and the plan it runs, kept in a
  `gr.State` that the tab releases when the session ends or after INSPECT_STATE_TTL_S.
- For a `kvlab.inspect.inspector.StepRecord`: `step_markdown` (what the step fed and chose, its positions and mask),
  `loop_code` (the hand-written loop with this step's values, `kvlab.ui.shared.code.loop_snippet`), `layer_table`
  (the per-layer table), `strip_html` (the token strip: which positions each layer still holds) and
  `top_table` (the next-token top-5, beside a dynamic cache's for a lossy strategy).

No gradio, no model work: the tab (`kvlab.ui.inspect.tab`) lays this out and runs the steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kvlab.generation import GenerationSettings, prompt_refusal
from kvlab.inspect.inspector import MAX_INSPECT_STEPS, STRIP_STATES, InspectSession, StepRecord
from kvlab.models.loading import ModelSpec
from kvlab.strategies import Strategy, StrategyError

from ..shared.code import loop_snippet
from ..shared.knobs import knob_defaults, strategy_from_card
from ..shared.markup import html_text, md_text

INSPECT_STATE_TTL_S = 900
"""An idle session's Inspect run (its cache) is released after this many seconds."""
DEFAULT_STRATEGY = "sink"
DEFAULT_KNOBS = {"sink": {"window_length": 32}}
"""Knob values the Inspect card starts with: a sink window short enough to see eviction within a few steps."""
DEFAULT_PROMPT = "Tell me a story about a lighthouse keeper who befriends a whale."
DEFAULT_STEPS = 48
STEP_COUNTS = {"step": 1, "step10": 10, "run": MAX_INSPECT_STEPS}
"""Tokens each button runs: Step, Step ×10, Run to end (stops at the end of the run)."""
STRIP_MAX_CELLS = 640
"""Cells drawn per layer in the token strip; a longer sequence is drawn with one cell per group of positions."""
STATE_LABELS = {"sink": "attention sink (kept)", "held": "held", "quantized": "held, quantized",
                "residual": "held in the full-precision residual", "evicted": "evicted",
                "unused": "preallocated, not written yet"}
INTRO = ("Step through **kvlab's own decode loop** for one strategy: prefill, then one forward per token. After "
         "each step see the loop's code with this step's values, what every cache layer holds (table and token "
         "strip) and the next-token top-5 — for a lossy cache beside a dynamic cache fed the same tokens.")
NO_STEP = "_No step yet: press **Step** (the first step prefills the prompt and chooses the first token)._"


class InspectRejected(ValueError):
    """The form cannot start an Inspect run; the message says what to fix."""


@dataclass
class InspectRequest:
    """The Inspect form's values, not yet validated."""

    prompt: str
    strategy_name: str = DEFAULT_STRATEGY
    knobs: list[str] = field(default_factory=list)
    system: str = ""
    chat: bool = True
    max_new_tokens: float | int | None = DEFAULT_STEPS
    ignore_eos: bool = True
    model_source: str = "bundled"


@dataclass(frozen=True)
class InspectPlan:
    """A validated request: the strategy, greedy settings and the model spec."""

    request: InspectRequest
    strategy: Strategy
    settings: GenerationSettings
    spec: ModelSpec

    def key(self) -> tuple:
        """What identifies the run: a session started from another key is replaced on the next step."""
        r = self.request
        return (r.prompt, r.system, bool(r.chat), self.strategy, self.settings, self.spec)


def plan_inspect(request: InspectRequest) -> InspectPlan:
    """Check the form. Raises InspectRejected with a message for the status line."""
    refusal = prompt_refusal(request.prompt)
    if refusal:
        raise InspectRejected(refusal)
    steps = request.max_new_tokens
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)
    if not isinstance(steps, int) or not 1 <= steps <= MAX_INSPECT_STEPS:
        raise InspectRejected(f"new tokens must be a whole number from 1 to {MAX_INSPECT_STEPS} (Inspect keeps "
                              f"every step), got {request.max_new_tokens!r}")
    try:
        strategy = strategy_from_card(request.strategy_name, request.knobs)
        spec = ModelSpec.from_field(request.model_source)
    except (StrategyError, ValueError) as err:
        raise InspectRejected(str(err)) from None
    if strategy.is_compileable:
        raise InspectRejected("Inspect steps the model eagerly with hooks on its first layer, which would make a "
                              "compiled forward recompile: turn compile off here (Compare times compiled runs)")
    settings = GenerationSettings(max_new_tokens=steps, stop_at_eos=not request.ignore_eos, fidelity=False)
    return InspectPlan(request, strategy, settings, spec)


def start_knobs(name: str) -> dict:
    """Knob values the card shows for `name` (DEFAULT_KNOBS over the dataclass defaults)."""
    return {**knob_defaults(name), **DEFAULT_KNOBS.get(name, {})}


@dataclass
class InspectTabState:
    """One browser session's Inspect run: the session, the plan it was started from (and its key), a stop flag."""

    session: InspectSession | None = None
    plan: InspectPlan | None = None
    key: tuple | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    diverge: object = None
    """The lockstep `kvlab.inspect.diverge.DivergeSession` beside the run ("compare with"), or None."""
    diverge_error: str = ""
    """Why the lockstep session could not start ('' when it runs or was not asked for)."""

    def release(self) -> None:
        """Drop the run (and so its caches)."""
        self.session, self.plan, self.key, self.diverge = None, None, None, None


def release_state(state: InspectTabState | None) -> None:
    """`gr.State`'s delete callback: free the cache of a session that ended or idled out."""
    if state is not None:
        state.release()


# ----- what one step shows -----

def _span(first: int, last: int) -> str:
    return f"[{first}]" if first == last else f"[{first}, …, {last}]"


def _fed_text(record: StepRecord) -> str:
    shown = record.fed_text if len(record.fed_text) <= 60 else "…" + record.fed_text[-59:]
    return repr(shown)


def step_markdown(record: StepRecord | None, session: InspectSession | None) -> str:
    """The step's summary: what it fed and chose, its forwards' positions and mask, bytes, KL (Markdown; the
    prompt's and the model's text is literal, `kvlab.ui.shared.markup.md_text`)."""
    if record is None or session is None:
        return NO_STEP
    total = session.settings.max_new_tokens
    kind = "prefill + first token" if record.index == 0 else "decode"
    lines = [f"**Token {record.index}** (step {record.index + 1} of at most {total}, {kind}; tokens count from 0 "
             "as in Compare and the CLI)"
             f" · fed `input_ids` {record.input_shape} ending {md_text(_fed_text(record))} · chose "
             f"**{md_text(repr(record.token_text))}** "
             f"(id {record.token_id}) · {1000 * record.per_token_s:.1f} ms"]
    for i, forward in enumerate(record.forwards):
        chunk = f"forward {i + 1} of {len(record.forwards)}: " if len(record.forwards) > 1 else ""
        passed = " — passed to the layers" if forward.mask_shape else " — not materialized: SDPA attends causally"
        mask = f"causal mask (1, 1, {forward.new_tokens}, {forward.kv_length}), kv_offset {forward.kv_offset}{passed}"
        tokens = f"{forward.new_tokens} token{'s' if forward.new_tokens != 1 else ''}"
        lines.append(f"- {chunk}{tokens} after {forward.past_tokens} counted by the cache · "
                     f"`cache_position` {_span(*forward.cache_position)} · `position_ids` "
                     f"[{_span(*forward.position_ids)}] · {mask}")
    held = record.layers[0].held_tokens if record.layers else 0
    extra = (f" · KL(dynamic ‖ {md_text(session.strategy.describe())}) = {record.kl_nats:.4f} nats"
             if record.kl_nats is not None else "")
    lines.append(f"- {record.seen_tokens} ids went through the cache; layer 0 holds {held} · cache "
                 f"{record.cache_bytes / 2**20:.2f} MiB{extra}")
    return "\n".join(lines)


def loop_values(record: StepRecord) -> dict[str, str]:
    """The `kvlab.ui.shared.code.LOOP_VALUES` of a step, for `loop_snippet`."""
    last = record.last
    chunks = f" (chunk {len(record.forwards)} of {len(record.forwards)})" if len(record.forwards) > 1 else ""
    return {
        "input_ids": f"step {record.index + 1}: shape {record.input_shape}, ending {_fed_text(record)}",
        "past": str(last.past_tokens) + chunks,
        "cache_position": _span(*last.cache_position),
        "position_ids": f"[{_span(*last.position_ids)}]",
        "mask": f"(1, 1, {last.new_tokens}, {last.kv_length}), kv_offset {last.kv_offset}",
        "next_token": f"{record.token_id} {record.token_text!r}",
    }


def loop_code(plan: InspectPlan, record: StepRecord | None) -> str:
    """The hand-written loop the session runs, with `record`'s values beside their lines."""
    r = plan.request
    return loop_snippet(plan.strategy, plan.settings, r.prompt, r.system or "", bool(r.chat), plan.spec.source,
                        plan.spec.dtype, loop_values(record) if record is not None else None)


LAYER_HEADERS = ["layers", "type", "class", "held / capacity", "keys", "values", "quantized keys", "dtype",
                 "device", "bytes", "packed", "scales + zeros", "residual"]


def _bytes(n: int) -> str:
    return "–" if not n else f"{n:,}"


def layer_table(record: StepRecord | None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the per-layer table; byte columns per layer, a collapsed row per layer of its range."""
    rows = []
    for row in record.layers if record is not None else ():
        first, last = row.layers
        name = str(first) if first == last else f"{first}–{last} (×{row.count})"
        capacity = "grows" if row.capacity is None else str(row.capacity)
        devices = " · ".join(f"{device} {size:,}" for device, size in row.devices.items()) if len(row.devices) > 1 \
            else next(iter(row.devices), "–")
        shapes = [str(shape or "–") for shape in (row.key_shape, row.value_shape, row.quantized_shape)]
        rows.append([name, row.layer_type, row.class_name, f"{row.held_tokens} / {capacity}", *shapes, row.dtype,
                     devices, f"{row.bytes:,}", _bytes(row.parts["packed"]), _bytes(row.parts["scales"]),
                     _bytes(row.parts["residual"])])
    return LAYER_HEADERS, rows


def _cells(runs, width: int, per_cell: int) -> list[str]:
    """One state per cell; a cell covering several positions takes the state of its last one."""
    states = [""] * width
    for state, start, stop in runs:
        for cell in range(start // per_cell, min(width, -(-stop // per_cell))):
            states[cell] = state
    return states


def _strip_row(label: str, runs, width: int, per_cell: int, tokens: list[str] | None, scores, key: str) -> str:
    """One strip row: a cell per position coloured by its state, the position, token and (for a scored
    eviction's KV head) the method's score in its tooltip."""
    cells = []
    for cell, state in enumerate(_cells(runs, width, per_cell)):
        start = cell * per_cell
        where = str(start) if per_cell == 1 else f"{start}–{start + per_cell - 1}"
        token = f" {tokens[start]!r}" if tokens and per_cell == 1 and start < len(tokens) else ""
        value = scores[start] if per_cell == 1 and start < len(scores) else None
        score = "" if value is None else f" score {value:.4g}"
        cells.append(f'<i class="kv-tok kv-st-{state or "none"}" title="{html_text(where + token)}: '
                     f'{html_text(STATE_LABELS.get(state, "not seen") + score)}"></i>')
    counts = ", ".join(f"{state} {stop - start}" for state, start, stop in runs)
    return (f'<div class="kv-strip-row" data-layers="{key}"><span class="kv-strip-label">'
            f'{html_text(label)}<br><small>{html_text(counts)}</small></span>'
            f'<span class="kv-strip-cells">{"".join(cells)}</span></div>')


def strip_html(record: StepRecord | None, tokens: list[str] | None = None) -> str:
    """The token strip: per layer row (collapsed ranges as in the table) one cell per sequence position coloured
    by its state (STRIP_STATES), with a legend; cells carry the position and token as a tooltip. A layer pruned
    by a scored-eviction strategy gets a row per KV head, each position's score in its tooltip."""
    if record is None or not record.layers:
        why = "no cache: every step recomputes the whole sequence" if record is not None else "no step yet"
        return f'<div class="kv-strip-empty">{html_text(why)}</div>'
    end = max(run[2] for row in record.layers for run in row.strip)
    per_cell = -(-end // STRIP_MAX_CELLS)
    width = -(-end // per_cell)
    parts = ['<div class="kv-strip">']
    for row in record.layers:
        first, last = row.layers
        label = f"layer {first}" if first == last else f"layers {first}–{last}"
        parts.append(_strip_row(label, row.strip, width, per_cell, tokens, (), f"{first}-{last}"))
        for head, runs in enumerate(row.head_strips):
            scores = row.head_scores[head] if head < len(row.head_scores) else ()
            key = f"{first}-{last}/{head}"
            parts.append(_strip_row(f"  KV head {head}", runs, width, per_cell, tokens, scores, key))
    scale = "" if per_cell == 1 else f" · one cell = {per_cell} positions"
    legend = "".join(f'<span><i class="kv-tok kv-st-{state}"></i>{html_text(STATE_LABELS[state])}</span>'
                     for state in STRIP_STATES)
    parts.append(f'<div class="kv-strip-legend">{legend}<span>positions 0–{end - 1}{scale}</span></div></div>')
    return "".join(parts)


TOP_HEADERS = ["#", "token", "p", "dynamic: token", "dynamic: p"]


def top_table(record: StepRecord | None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the next-token top-5; the dynamic reference's columns only for a lossy strategy."""
    if record is None:
        return TOP_HEADERS[:3], []
    reference = record.reference_top
    rows = []
    for rank, candidate in enumerate(record.top):
        row = [str(rank + 1), repr(candidate.text), f"{candidate.prob:.3f}"]
        if reference is not None:
            row += [repr(reference[rank].text), f"{reference[rank].prob:.3f}"]
        rows.append(row)
    return (TOP_HEADERS if reference is not None else TOP_HEADERS[:3]), rows


def status_text(session: InspectSession | None) -> str:
    """One status line: steps taken, how the run stands."""
    if session is None:
        return "ready: pick a strategy and press Step"
    done = len(session.records)
    if session.finished:
        return f"run ended after {done} steps ({session.stop_reason}): press Reset to start again"
    return f"{done} of {session.settings.max_new_tokens} steps taken with {session.strategy.describe()}"


def sequence_tokens(session: InspectSession | None) -> list[str]:
    """The text of every id that went through the cache so far, by position (the strip's tooltips)."""
    if session is None or not session.records:
        return []
    tokenizer = session.loaded.tokenizer
    return [tokenizer.decode([token]) for token in session.decoder.sequence[0].tolist()]
