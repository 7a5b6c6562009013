"""Inspect's "compare with" view, pure: a lockstep session's records -> the divergence figure and summary.

- `diverge_figure`: at the shown step, per layer, KV error, attention lost and hidden-state drift (relative L2),
  with the logit lens' first differing layer shaded; below, KL(reference || strategy) per step with the first
  divergence marked. Measures that could not be computed are left out of the chart and named in
  `diverge_markdown` with the reason (never drawn as 0).
The link from Compare's "first divergence" cell into Inspect is `kvlab.ui.shared.inspect_links`.

No gradio, no model work (`kvlab.inspect.diverge` measures, `kvlab.ui.inspect.tab` lays out).
"""

from __future__ import annotations


from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kvlab.inspect.diverge import DivergeSession, DivergeStep, first_layer_with

from ..shared.markup import md_text
from ..shared.theme import COLORS

COMPARE_CHOICES = ("none", "dynamic", "static")
"""What Inspect's "compare with" offers: no lockstep reference, or an exact cache to step beside the strategy."""
LAYER_MEASURES = (("kv_error", "KV error (relative)"), ("attention_lost", "attention lost (mass)"),
                  ("hidden_rel_l2", "hidden drift (relative L2)"))
"""The per-layer lines: (LayerDivergence field, legend label)."""
TOP_LAYERS = 3
"""Layers named as the largest KV error / drift at a step."""
FIGURE_SIZE_IN = (11.0, 5.2)
NO_COMPARE = "_Pick a reference in **compare with** and press Step: each step is also run in lockstep beside it._"


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
    layers_ax.set_title(f"token {record.index}: {session.strategy.describe()} vs {session.reference.describe()}, "
                        "per layer")
    layers_ax.set_xlabel("decoder layer")
    layers_ax.legend(fontsize=8, loc="upper left")
    kl_ax.plot([r.index for r in records], [r.kl_nats for r in records], marker="o", markersize=3,
               color="#444444", label="KL(reference ‖ strategy), nats")
    first = session.first_divergence
    if first is not None:
        kl_ax.axvline(first, color="#cc3333", linestyle="--", label=f"first divergence: token {first}")
    kl_ax.axvline(record.index, color="#888888", linestyle=":", label="shown token")
    kl_ax.set_xlabel("new token (from 0)")
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
    """The summary under the figure: first divergence, the shown step's measures, what was not computed and why
    (Markdown; the model's tokens and any message are literal, `kvlab.ui.shared.markup.md_text`)."""
    if error:
        return f"**compare with:** ✖ {md_text(error)}"
    if session is None:
        return NO_COMPARE
    if not session.records:
        return (f"_{md_text(session.strategy.describe())} will be stepped beside "
                f"{md_text(session.reference.describe())}: press Step._")
    record = session.records[-1]
    first = session.first_divergence
    explanation = getattr(session.strategy, "explanation", "")
    lines = [f"**Lockstep with {md_text(session.reference.describe())}** (the reference is fed this run's tokens) · first "
             f"divergence: {'none yet' if first is None else f'token {first}'}"
             + (f" · loop mistake: {md_text(explanation)}" if explanation else ""),
             f"- token {record.index}: KL {record.kl_nats:.4f} nats · top-1 "
             f"{md_text(repr(record.top[0].text))} vs "
             f"reference {md_text(repr(record.reference_top[0].text))} · cache holds {record.cache_length} slots for "
             f"{record.seen_tokens} tokens seen",
             f"- first layer with KV error: {_first(record, 'kv_error')} · attention lost: "
             f"{_first(record, 'attention_lost')} · hidden drift: {_first(record, 'hidden_rel_l2')} · logit lens "
             f"differs from layer: {'–' if record.lens_diverged_from is None else record.lens_diverged_from}",
             f"- largest KV error: {_top_layers(record, 'kv_error')} · largest drift: "
             f"{_top_layers(record, 'hidden_rel_l2')}"]
    reasons = sorted({f"{name}: {why}" for layer in record.layers for name, why in layer.reasons.items()})
    lines += [f"- not computed — {md_text(reason)}" for reason in reasons]
    return "\n".join(lines)


def _first(record: DivergeStep, name: str) -> str:
    layer = first_layer_with(record, name)
    if layer is not None:
        return str(layer)
    return "not computed" if all(getattr(x, name) is None for x in record.layers) else "none"
