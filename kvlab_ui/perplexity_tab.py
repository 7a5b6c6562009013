"""The Perplexity tab: StreamingLLM's central figure, live on the loaded model.

A long text streams token by token through dense, window and sink caches (and
the model's own sliding window where it has one); the running log-perplexity of
each grows on the plot as it is measured, with cache bytes beside it. Measuring
is `kvlab.perplexity`'s job; this module builds components and wires events.
Per-session state (the stop event) lives in `gr.State`.
"""

from __future__ import annotations

import math
import os
import threading
import time

import gradio as gr
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvlab.models import ModelLoadError, ModelSpec  # noqa: E402
from kvlab_ui.compare_tab import CONCURRENCY, MODEL_CONCURRENCY_ID  # noqa: E402
from kvlab.perplexity import default_text, moving_log_ppl, perplexity_strategies, ppl_by_segment, stream_many  # noqa: E402
from kvlab.strategies import StrategyError  # noqa: E402

MAX_TOKENS_CAP = int(os.environ.get("KVLAB_MAX_PERPLEXITY_TOKENS", "8192"))
PLOT_EVERY_S = 1.5
CHOICES = {"dynamic": "dynamic", "window": "sink:num_sink_tokens=0", "sink": "sink", "sliding_window": "sliding_window"}
"""Checkbox label -> strategy spec (compare syntax); window and sink take the window/sinks sliders."""
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
BUILT_IN = "Python's help topics (pydoc_data.topics)"
PASTED = "the text pasted below"
EXPLAIN = (
    "Each token of a long text is predicted from what the cache still holds. **dynamic** keeps everything; "
    "**window** (a sink cache with 0 sinks) keeps only the last `window` tokens (the paper's window-attention baseline); **sink** keeps the "
    "first `sinks` tokens as attention sinks plus the recent ones (Xiao et al. 2023, *Efficient Streaming Language "
    "Models with Attention Sinks*). Past the window, window attention's perplexity shoots up while sink stays "
    "close to dynamic at constant memory. Curves show log-perplexity (nats) over the last `window` tokens."
)


def render(curves: dict[str, list[float]], sizes: dict[str, list[int]], window: int):
    """Two panels: running log-PPL vs position, cache bytes vs position."""
    fig, (ax_ppl, ax_mem) = plt.subplots(1, 2, figsize=(12, 3.8))
    for name, nll in curves.items():
        if nll:
            xs = range(1, len(nll) + 1)
            color = PALETTE[list(curves).index(name) % len(PALETTE)]
            ax_ppl.plot(xs, moving_log_ppl(nll, window), label=name, color=color)
            ax_mem.plot(xs, [b / 2**20 for b in sizes[name]], label=name, color=color)
    for ax in (ax_ppl, ax_mem):
        ax.axvline(window, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("position (tokens)")
        ax.grid(alpha=0.3)
    ax_ppl.set_ylabel(f"log-perplexity, last {window} tokens (nats)")
    ax_mem.set_ylabel("cache tensor bytes (MiB)")
    ax_ppl.legend(loc="upper left")
    fig.tight_layout()
    return fig


def segment_table(curves: dict[str, list[float]], window: int):
    """A frame: one row per cache, one column per `window`-token segment (perplexity, not log)."""
    import pandas as pd

    segments = {name: ppl_by_segment(nll, window) for name, nll in curves.items()}
    longest = max(segments.values(), key=len, default=[])
    headers = [f"tokens {s['start'] + 1}-{s['end']}" for s in longest]
    rows = [[name] + [round(s["ppl"], 2) for s in parts] + [None] * (len(longest) - len(parts))
            for name, parts in segments.items()]
    return pd.DataFrame(rows, columns=["cache"] + headers)


def build_perplexity_tab(pool) -> None:
    """Components and events of the tab, inside the caller's `gr.Tab`."""
    gr.Markdown(EXPLAIN)
    with gr.Row():
        source = gr.Textbox("bundled", label="model ('bundled', hub id or local folder)", scale=2)
        text_choice = gr.Radio([BUILT_IN, PASTED], value=BUILT_IN, label="text", scale=2)
        strategies = gr.CheckboxGroup(list(CHOICES), value=["dynamic", "window", "sink"], label="caches", scale=2)
    with gr.Row():
        tokens = gr.Slider(64, MAX_TOKENS_CAP, value=1024, step=64, label="tokens to stream", elem_id="ppl-tokens")
        window = gr.Slider(16, 2048, value=256, step=16, label="window_length (tokens)", elem_id="ppl-window")
        sinks = gr.Slider(0, 16, value=4, step=1, label="num_sink_tokens (sink)")
    pasted = gr.Textbox(label="your text (used when 'the text pasted below' is picked)", lines=3)
    with gr.Row():
        run = gr.Button("Run perplexity", variant="primary", elem_id="ppl-run")
        stop = gr.Button("Stop", elem_id="ppl-stop")
    status = gr.Markdown("", elem_id="ppl-status")
    plot = gr.Plot(label="log-perplexity and cache bytes vs position", elem_id="ppl-plot")
    table = gr.Dataframe(label="perplexity per window-sized segment", interactive=False, elem_id="ppl-table")
    session = gr.State({})

    def prepare(state: dict):
        """Run clicked (before queueing): a fresh stop event for this session's run."""
        state["stop"] = threading.Event()
        return "waiting for a free slot…"

    def stop_run(state: dict):
        if state.get("stop") is not None:
            state["stop"].set()

    def stream(state, source, text_choice, strategies, tokens, window, sinks, pasted):
        stop_event = state.get("stop") or threading.Event()
        yield {status: "loading the model…"}
        try:
            loaded = pool.get(ModelSpec(source=(source or "").strip() or "bundled"))
            text = pasted if text_choice == PASTED else default_text()
            if not text or not text.strip():
                raise ValueError("the text is empty: paste a long text or pick the built-in one")
            ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"][:, : int(tokens)]
            if ids.shape[1] < 2:
                raise ValueError("the text has fewer than 2 tokens")
            makers = perplexity_strategies(loaded, ",".join(CHOICES[name] for name in strategies or []),
                                           int(window), int(sinks))
        except (ValueError, ModelLoadError, StrategyError) as err:
            yield {status: f"⚠️ {err}"}
            return
        curves = {name: [] for name in makers}
        sizes = {name: [] for name in makers}
        total = ids.shape[1] - 1
        last_plot = 0.0
        for step in stream_many(loaded, ids, makers, stop_event):
            curves[step.name].append(step.nll)
            sizes[step.name].append(step.cache_bytes)
            position = step.position
            now = time.perf_counter()
            if now - last_plot >= PLOT_EVERY_S:
                last_plot = now
                fig = render(curves, sizes, int(window))
                yield {plot: fig, status: f"token {position} of {total} · "
                       + " · ".join(f"{n} ppl {math.exp(sum(v[-int(window):]) / len(v[-int(window):])):.1f}"
                                    for n, v in curves.items() if v)}
                plt.close(fig)
        fig = render(curves, sizes, int(window))
        word = "stopped" if stop_event.is_set() else "done"
        yield {plot: fig, table: segment_table(curves, int(window)),
               status: f"{word}: {min(len(v) for v in curves.values())} tokens per cache"}
        plt.close(fig)

    run.click(prepare, session, status, concurrency_limit=None, api_visibility="private").then(
        stream, [session, source, text_choice, strategies, tokens, window, sinks, pasted], [status, plot, table],
        concurrency_limit=CONCURRENCY, concurrency_id=MODEL_CONCURRENCY_ID, api_visibility="private")
    stop.click(stop_run, session, None, concurrency_limit=None, api_visibility="private")
