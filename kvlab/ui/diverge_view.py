"""Inspect's "compare with" view, pure: a lockstep session's records -> the divergence figure and summary, and
the link from Compare's "first divergence" cell into Inspect (built and parsed here).

- `diverge_figure`: at the shown step, per layer, KV error, attention lost and hidden-state drift (relative L2),
  with the logit lens' first differing layer shaded; below, KL(reference || strategy) per step with the first
  divergence marked. Measures that could not be computed are left out of the chart and named in
  `diverge_markdown` with the reason (never drawn as 0).
- `inspect_query` / `parse_inspect_query`: the URL query that opens Inspect on a strategy, reference, prompt,
  settings and step.

No gradio, no model work (`kvlab.inspect.diverge` measures, `kvlab.ui.inspect_tab` lays out).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvlab.inspect.diverge import DivergeSession, DivergeStep, first_layer_with

from .theme import COLORS

COMPARE_CHOICES = ("none", "dynamic", "static")
"""What Inspect's "compare with" offers: no lockstep reference, or an exact cache to step beside the strategy."""
DEFAULT_COMPARE = "dynamic"
LAYER_MEASURES = (("kv_error", "KV error (relative)"), ("attention_lost", "attention lost (mass)"),
                  ("hidden_rel_l2", "hidden drift (relative L2)"))
"""The per-layer lines: (LayerDivergence field, legend label)."""
TOP_LAYERS = 3
"""Layers named as the largest KV error / drift at a step."""
FIGURE_SIZE_IN = (11.0, 5.2)
NO_COMPARE = "_Pick a reference in **compare with** and press Step: each step is also run in lockstep beside it._"
QUERY_FLAG = "inspect"
"""The query parameter that marks a link into Inspect (`?inspect=1&...`)."""


def _series(record: DivergeStep, name: str) -> tuple[list[int], list[float]]:
    points = [(layer.layer, getattr(layer, name)) for layer in record.layers if getattr(layer, name) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def diverge_figure(session: DivergeSession | None, step: int | None = None) -> Figure | None:
    """The figure for `session` at record `step` (default: the latest); None before any step."""
    if session is None or not session.records:
        return None
    records = session.records
    record = records[-1 if step is None else step]
    fig = Figure(figsize=FIGURE_SIZE_IN, layout="constrained")
    layers_ax, kl_ax = fig.subplots(2, 1, height_ratios=(3, 2))
    for (name, label), color in zip(LAYER_MEASURES, COLORS):
        xs, ys = _series(record, name)
        if xs:
            layers_ax.plot(xs, ys, marker="o", markersize=3, label=label, color=color)
    if record.lens_diverged_from is not None:
        layers_ax.axvspan(record.lens_diverged_from - 0.5, len(record.layers) - 0.5, color="#cc3333", alpha=0.08,
                          label=f"logit lens top-1 differs from layer {record.lens_diverged_from}")
    layers_ax.set_title(f"step {record.index + 1}: {session.strategy.describe()} vs {session.reference.describe()}, "
                        "per layer")
    layers_ax.set_xlabel("decoder layer")
    layers_ax.legend(fontsize=8, loc="upper left")
    kl_ax.plot([r.index + 1 for r in records], [r.kl_nats for r in records], marker="o", markersize=3,
               color="#444444", label="KL(reference ‖ strategy), nats")
    first = session.first_divergence
    if first is not None:
        kl_ax.axvline(first + 1, color="#cc3333", linestyle="--", label=f"first divergence: step {first + 1}")
    kl_ax.axvline(record.index + 1, color="#888888", linestyle=":", label="shown step")
    kl_ax.set_xlabel("step")
    kl_ax.legend(fontsize=8, loc="upper left")
    for ax in (layers_ax, kl_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        ax.title.set_fontsize(10)
    return fig


def _top_layers(record: DivergeStep, name: str) -> str:
    xs, ys = _series(record, name)
    ranked = sorted(zip(ys, xs), reverse=True)[:TOP_LAYERS]
    return ", ".join(f"{layer} ({value:.3g})" for value, layer in ranked) or "not computed"


def diverge_markdown(session: DivergeSession | None, error: str = "") -> str:
    """The summary under the figure: first divergence, the shown step's measures, what was not computed and why."""
    if error:
        return f"**compare with:** ✖ {error}"
    if session is None:
        return NO_COMPARE
    if not session.records:
        return f"_{session.strategy.describe()} will be stepped beside {session.reference.describe()}: press Step._"
    record = session.records[-1]
    first = session.first_divergence
    explanation = getattr(session.strategy, "explanation", "")
    lines = [f"**Lockstep with {session.reference.describe()}** (the reference is fed this run's tokens) · first "
             f"divergence: {'none yet' if first is None else f'step {first + 1}'}"
             + (f" · loop mistake: {explanation}" if explanation else ""),
             f"- step {record.index + 1}: KL {record.kl_nats:.4f} nats · top-1 {record.top[0].text!r} vs "
             f"reference {record.reference_top[0].text!r} · cache holds {record.cache_length} slots for "
             f"{record.seen_tokens} tokens seen",
             f"- first layer with KV error: {_first(record, 'kv_error')} · attention lost: "
             f"{_first(record, 'attention_lost')} · hidden drift: {_first(record, 'hidden_rel_l2')} · logit lens "
             f"differs from layer: {'–' if record.lens_diverged_from is None else record.lens_diverged_from}",
             f"- largest KV error: {_top_layers(record, 'kv_error')} · largest drift: "
             f"{_top_layers(record, 'hidden_rel_l2')}"]
    reasons = sorted({f"{name}: {why}" for layer in record.layers for name, why in layer.reasons.items()})
    lines += [f"- not computed — {reason}" for reason in reasons]
    return "\n".join(lines)


def _first(record: DivergeStep, name: str) -> str:
    layer = first_layer_with(record, name)
    if layer is not None:
        return str(layer)
    return "not computed" if all(getattr(x, name) is None for x in record.layers) else "none"


# ----- the link from Compare -----

def strategy_item(strategy) -> str:
    """A strategy in the command line's `name:knob=value` spelling, knobs that differ from their defaults only."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(strategy)}
    knobs = [f"{name}={'true' if value is True else 'false' if value is False else value}"
             for name, value in strategy.knobs().items() if value != defaults.get(name) and value is not None]
    return ":".join([strategy.name, *knobs])


@dataclass(frozen=True)
class InspectLink:
    """What a link into Inspect carries: the strategy (`name:knob=value`), the reference, the prompt and its
    settings, and the step to show (0-based)."""

    strategy: str
    reference: str
    prompt: str
    system: str
    chat: bool
    max_new_tokens: int
    model: str
    step: int


def inspect_query(link: InspectLink) -> str:
    """`?inspect=1&strategy=...`: the query that opens Inspect on `link`."""
    fields = {QUERY_FLAG: 1, "strategy": link.strategy, "compare": link.reference, "prompt": link.prompt,
              "system": link.system, "chat": int(link.chat), "steps": link.max_new_tokens, "model": link.model,
              "step": link.step}
    return "?" + urlencode(fields)


def parse_inspect_query(params: dict) -> InspectLink | None:
    """The `InspectLink` of a page's query parameters, None when they carry none.

    Raises:
        ValueError: a link whose numbers are not whole numbers (the message names the field).
    """
    if str(params.get(QUERY_FLAG, "")) != "1":
        return None
    numbers = {}
    for name in ("steps", "step", "chat"):
        try:
            numbers[name] = int(params.get(name, 0))
        except (TypeError, ValueError):
            raise ValueError(f"the link's {name} must be a whole number, got {params.get(name)!r}") from None
    return InspectLink(strategy=str(params.get("strategy", "")), reference=str(params.get("compare", DEFAULT_COMPARE)),
                       prompt=str(params.get("prompt", "")), system=str(params.get("system", "")),
                       chat=bool(numbers["chat"]), max_new_tokens=numbers["steps"],
                       model=str(params.get("model", "bundled")), step=numbers["step"])


def divergence_links(request, plan, results) -> dict[int, str]:
    """Run column index -> the query opening Inspect at its first divergence, beside `dynamic`, with the run's
    prompt and settings; only for a greedy run and a column that diverged within Inspect's step limit.

    request / plan: Compare's `RunRequest` and `RunPlan`; results: the run's `ColumnResult`s, in run order.
    """
    from kvlab.inspect.inspector import MAX_INSPECT_STEPS

    if request.decoding != "greedy":
        return {}
    steps = min(int(plan.settings.max_new_tokens), MAX_INSPECT_STEPS)
    links = {}
    for index, (column, result) in enumerate(zip(plan.run_columns(), results)):
        step = getattr(result, "first_divergence", None)
        strategy = column.strategy
        if step is None or strategy is None or not strategy.use_cache or strategy.is_compileable or step >= steps:
            continue
        link = InspectLink(strategy=strategy_item(strategy), reference=DEFAULT_COMPARE, prompt=request.prompt,
                           system=request.system or "", chat=bool(request.chat), max_new_tokens=steps,
                           model=plan.spec.source, step=int(step))
        links[index] = inspect_query(link)
    return links
