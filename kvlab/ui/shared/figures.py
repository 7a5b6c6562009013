"""The matplotlib figures, with the object API only (no pyplot state, safe from worker threads). The live
plots of Compare, Chat and Perplexity are gradio's native plots (`kvlab.ui.shared.plot_frames`); matplotlib draws
Compare's PNG export, on request only, and Plan's panel.

- `render_figure`: Compare's panels for the PNG export (cache bytes, per-token latency, process memory; on a model with
  more than one layer type also cache bytes by layer type, measured beside the prediction); a budgeted
  column's switches to smaller caches are vertical lines labelled with the new cache.
- `plan_figure`: Plan's cache GiB against context length (log axes) with the budget's room for the cache.
- `figure_png`: PNG bytes of any of them (the Compare export).

Pure: each takes view-model data and returns a `matplotlib.figure.Figure`; no gradio.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from .theme import COLORS

MIB = 1024 * 1024
LAYER_TYPE_STYLES = {"full_attention": "-", "sliding_attention": ":"}
"""Line style per layer type in the by-layer-type panel (any other type: dash-dot)."""
HYBRID_HEIGHT_IN = 6.6
PLAN_SIZE_IN = (11.0, 4.2)
PLAN_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _tidy(*axes) -> None:
    for ax in axes:
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)


def _draw_columns(view, cache_ax, latency_ax) -> bool:
    """Cache bytes (measured solid, prediction dashed) and per-token latency per column; True if any was drawn."""
    drawn = False
    for column, slot in zip(view.columns, view.slots):
        if not column.per_token_s:
            continue
        drawn = True
        color = COLORS[slot % len(COLORS)]
        steps = range(1, len(column.per_token_s) + 1)
        measured = range(1, len(column.cache_bytes) + 1)  # none for an engine column that reports no bytes
        cache_ax.plot(measured, [b / MIB for b in column.cache_bytes], color=color, lw=1.8, label=column.title)
        if any(column.predicted_cache_bytes):
            cache_ax.plot(measured, [b / MIB for b in column.predicted_cache_bytes], color=color, lw=1.2, ls="--",
                          alpha=0.8)
        latency_ax.plot(steps, [1000 * s for s in column.per_token_s], color=color, lw=1.2, label=column.title)
        _mark_switches(column.switches, color, cache_ax, latency_ax)
    return drawn


def _mark_switches(switches: list[dict], color: str, *axes) -> None:
    """A dotted vertical line at each fallback switch (plotted at its token, 1-based like the series), labelled
    with the cache it switched to on the first axes."""
    for switch in switches:
        x = switch["at_token"] + 1
        for ax in axes:
            ax.axvline(x, color=color, ls=":", lw=1.4)
        axes[0].text(x, 0.98, f" → {switch['to']}", transform=axes[0].get_xaxis_transform(), rotation=90,
                     va="top", ha="right", fontsize=7.5, color=color)


def _draw_memory(memory, memory_ax) -> None:
    if memory.elapsed_s:
        memory_ax.plot(memory.elapsed_s, [b / MIB for b in memory.rss_bytes], color="#444444", lw=1.5,
                       label="process RSS")
        if any(memory.cuda_allocated_bytes):
            memory_ax.plot(memory.elapsed_s, [b / MIB for b in memory.cuda_allocated_bytes], color="#d62728",
                           lw=1.5, label="CUDA allocated")
        memory_ax.legend(fontsize=8, loc="lower right", frameon=False)
    memory_ax.set(title="process memory (whole process, not just caches)", xlabel="time since run start (s)",
                  ylabel="MiB")


def several_layer_types(view) -> bool:
    """Whether any column of the view measured more than one layer type (a hybrid model)."""
    return any(len(column.cache_bytes_by_layer_type) > 1 for column in view.columns)


def _draw_by_layer_type(view, ax) -> None:
    """Per column and layer type: measured bytes (line style by type) over a wide faint band, the prediction."""
    from matplotlib.lines import Line2D

    for column, slot in zip(view.columns, view.slots):
        color = COLORS[slot % len(COLORS)]
        for kind, values in sorted(column.cache_bytes_by_layer_type.items()):
            steps = range(1, len(values) + 1)
            predicted = column.predicted_cache_bytes_by_layer_type.get(kind, [])
            if any(predicted):
                ax.plot(range(1, len(predicted) + 1), [b / MIB for b in predicted], color=color, lw=7, alpha=0.18,
                        solid_capstyle="butt")
            ax.plot(steps, [b / MIB for b in values], color=color, lw=1.8, ls=LAYER_TYPE_STYLES.get(kind, "-."))
    proxies = [Line2D([], [], color="#444444", ls=style, label=kind.replace("_attention", " layers"))
               for kind, style in LAYER_TYPE_STYLES.items()]
    proxies.append(Line2D([], [], color="#444444", lw=7, alpha=0.18, label="prediction"))
    ax.legend(handles=proxies, fontsize=8, loc="upper left", frameon=False)
    ax.set(title="KV cache by layer type: measured (lines), prediction (band)", xlabel="generated tokens",
           ylabel="cache tensors (MiB)")


def render_figure(view, width_in: float = 15.0, height_in: float = 3.8) -> Figure:
    """Compare's panels for a `kvlab.ui.compare.view.RunView`: KV cache vs generated tokens (measured solid,
    dense prediction dashed), per-token latency vs generated tokens, process RSS over time; when a column
    measured more than one layer type, a fourth panel splits the cache by layer type (two rows of two)."""
    hybrid = several_layer_types(view)
    fig = Figure(figsize=(width_in, HYBRID_HEIGHT_IN if hybrid else height_in), dpi=90, layout="constrained")
    if hybrid:
        (cache_ax, by_type_ax), (latency_ax, memory_ax) = fig.subplots(2, 2)
        _draw_by_layer_type(view, by_type_ax)
        _tidy(by_type_ax)
    else:
        cache_ax, latency_ax, memory_ax = fig.subplots(1, 3)
    drawn = _draw_columns(view, cache_ax, latency_ax)
    cache_ax.set(title="KV cache: measured (solid), dense prediction (dashed)", xlabel="generated tokens",
                 ylabel="cache tensors (MiB)")
    latency_ax.set(title="per-token latency (first token includes prefill)", xlabel="generated tokens",
                   ylabel="compute per token (ms)")
    if drawn:
        latency_ax.set_yscale("log")
        handles, labels = cache_ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncol=min(len(labels), 8), fontsize=9, frameon=False)
    _draw_memory(view.memory, memory_ax)
    _tidy(cache_ax, latency_ax, memory_ax)
    return fig


def figure_png(fig: Figure) -> bytes:
    """PNG bytes of a figure (for the export); raises nothing beyond matplotlib's own errors."""
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    return out.getvalue()


def tokens_label(tokens: int) -> str:
    """`128k` for whole multiples of 1024 tokens, else `1,000`."""
    return f"{tokens // 1024:,}k" if tokens >= 1024 and tokens % 1024 == 0 else f"{tokens:,}"


def plan_figure(series: list[dict], room_gib: float | None, budget_gib: float | None, weights_gib: float,
                limit: int | None, title: str, absent: tuple[str, ...] = ()) -> Figure:
    """Plan's panel: cache GiB against context length, both axes logarithmic, one line per strategy.

    Args:
        series: per strategy, `label`, `slot` (its card: the colour), `contexts` (tokens), `cache_gib` and
            `on_device_gib` (drawn dashed where it differs: an offloaded cache's GPU part). Equal lines stay
            visible: each later line is thinner, with its own marker.
        room_gib: budget minus weights, GiB: the line a cache must stay under (None: no budget; <= 0: the
            weights alone exceed the budget, said in the title).
        budget_gib, weights_gib: the budget and the weights, GiB (for the labels).
        limit: the model's max_position_embeddings; contexts past it are shaded.
        absent: labels of strategies without bytes (they cannot serve the model), listed in the legend.
    """
    fig = Figure(figsize=PLAN_SIZE_IN, dpi=90, layout="constrained")
    ax = fig.subplots()
    for i, item in enumerate(series):
        style = {"color": COLORS[item["slot"] % len(COLORS)], "marker": PLAN_MARKERS[i % len(PLAN_MARKERS)],
                 "lw": max(1.2, 4.2 * 0.75**i), "ms": max(3.0, 9.0 * 0.85**i)}
        points = [(c, g) for c, g in zip(item["contexts"], item["cache_gib"]) if g > 0]
        if not points:
            ax.plot([], [], **style, label=f"{item['label']} (0 bytes)")
            continue
        ax.plot(*zip(*points), **style, label=item["label"])
        if item["on_device_gib"] != item["cache_gib"]:
            device = [(c, g) for c, g in zip(item["contexts"], item["on_device_gib"]) if g > 0]
            ax.plot(*zip(*device), color=style["color"], lw=1.2, ls="--", label=f"{item['label']}: on the GPU")
    for label in absent:
        ax.plot([], [], color="#9ca3af", lw=1.0, ls="-.", label=f"{label}: cannot serve this model")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    contexts = sorted({c for item in series for c in item["contexts"]})
    if contexts:
        ax.set_xticks(contexts, [tokens_label(c) for c in contexts])
        ax.minorticks_off()
    heading = title
    if room_gib is not None and room_gib > 0:
        room = f"budget {budget_gib:g} GiB − weights {weights_gib:.1f} GiB = {room_gib:.1f} GiB for the cache"
        ax.axhline(room_gib, color="#b42318", lw=1.5, ls=":", label=room)
    elif room_gib is not None:
        heading += f": the weights alone ({weights_gib:.1f} GiB) exceed the {budget_gib:g} GiB budget"
    if limit and contexts and contexts[-1] > limit:
        ax.axvspan(limit, ax.get_xlim()[1], color="#999999", alpha=0.15, lw=0,
                   label=f"past max_position_embeddings ({limit:,})")
    ax.set(title=heading, xlabel="context length (tokens, log scale)", ylabel="KV cache (GiB, log scale)")
    if series or absent:  # beside the axes, so no entry sits on the budget line or a curve
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    _tidy(ax)
    return fig
