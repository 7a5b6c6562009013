"""The matplotlib figures every tab draws, with the object API only (no pyplot state, safe from worker threads).

- `render_figure`: Compare's three live panels (cache bytes, per-token latency, process memory); a budgeted
  column's switches to smaller caches are vertical lines labelled with the new cache.
- `turns_figure`: Chat's per-turn TTFT with/without reuse and reused/prefilled tokens.
- `perplexity_figure`: Perplexity's running log-PPL and cache bytes against position.
- `figure_png`: PNG bytes of any of them (the Compare export).

Pure: each takes view-model data and returns a `matplotlib.figure.Figure`; no gradio.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from kvlab.perplexity import moving_log_ppl

from .theme import COLORS, PERPLEXITY_COLORS

MIB = 1024 * 1024
CHAT_SIZE_IN = (7.0, 2.6)
PERPLEXITY_SIZE_IN = (12.0, 3.8)


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
        cache_ax.plot(steps, [b / MIB for b in column.cache_bytes], color=color, lw=1.8, label=column.title)
        if any(column.predicted_cache_bytes):
            cache_ax.plot(steps, [b / MIB for b in column.predicted_cache_bytes], color=color, lw=1.2, ls="--",
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


def render_figure(view, width_in: float = 15.0, height_in: float = 3.8) -> Figure:
    """Compare's three panels for a `kvlab.ui.compare_view.RunView`: KV cache vs generated tokens (measured
    solid, dense prediction dashed), per-token latency vs generated tokens, process RSS over time."""
    fig = Figure(figsize=(width_in, height_in), dpi=90, layout="constrained")
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
    """PNG bytes of a figure (for the export)."""
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    return out.getvalue()


def turns_figure(turns) -> Figure | None:
    """Chat's per-turn plot for `kvlab.chat.TurnStats`s: TTFT with vs without reuse (s), and reused vs
    prefilled tokens. None before any turn."""
    if not turns:
        return None
    fig = Figure(figsize=CHAT_SIZE_IN, dpi=100, layout="constrained")
    times, tokens = fig.subplots(1, 2)
    xs = list(range(len(turns)))
    labels = [str(t.turn) for t in turns]
    width = 0.38
    times.bar([x - width / 2 for x in xs], [t.ttft_s for t in turns], width, label="with reuse")
    times.bar([x + width / 2 for x in xs], [t.no_reuse_ttft_s or 0.0 for t in turns], width, label="without reuse")
    times.set(title="TTFT per turn", xlabel="turn", ylabel="seconds", xticks=xs, xticklabels=labels)
    times.legend(fontsize=7)
    tokens.bar(xs, [t.reused_tokens for t in turns], label="reused")
    tokens.bar(xs, [t.prefilled_tokens for t in turns], bottom=[t.reused_tokens for t in turns], label="prefilled")
    tokens.set(title="Input tokens per turn", xlabel="turn", ylabel="tokens", xticks=xs, xticklabels=labels)
    tokens.legend(fontsize=7)
    return fig


def perplexity_figure(nll: dict[str, list[float]], cache_bytes: dict[str, list[int]], window: int) -> Figure:
    """Two panels: running log-PPL over the last `window` tokens (nats) vs position, cache bytes (MiB) vs position.

    Args:
        nll: cache label -> per-token NLL (nats), in position order.
        cache_bytes: cache label -> bytes the cache held at each of those positions.
    """
    fig = Figure(figsize=PERPLEXITY_SIZE_IN, layout="tight")
    ax_ppl, ax_mem = fig.subplots(1, 2)
    for i, (name, values) in enumerate(nll.items()):
        if values:
            xs = range(1, len(values) + 1)
            color = PERPLEXITY_COLORS[i % len(PERPLEXITY_COLORS)]
            ax_ppl.plot(xs, moving_log_ppl(values, window), label=name, color=color)
            ax_mem.plot(xs, [b / MIB for b in cache_bytes[name]], label=name, color=color)
    for ax in (ax_ppl, ax_mem):
        ax.axvline(window, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("position (tokens)")
        ax.grid(alpha=0.3)
    ax_ppl.set_ylabel(f"log-perplexity, last {window} tokens (nats)")
    ax_mem.set_ylabel("cache tensor bytes (MiB)")
    if any(nll.values()):
        ax_ppl.legend(loc="upper left")
    return fig
