"""The Perplexity tab: StreamingLLM's central figure, live on the loaded model.

A long text streams token by token through dense, window and sink caches (and
any other registered strategy usable in perplexity); the running
log-perplexity of each grows on the plot as it is measured, with cache bytes
beside it. This module lays out the components and wires their events; the
form, the view model, the plots' data and the table are `kvlab.ui.perplexity.view`'s (drawn by gradio's
native `gr.LinePlot` in the browser, with a PNG export button),
the measuring is `kvlab.quality.perplexity.run_perplexity`'s (the quality report with a one-token context and
its per-token curve). Per-session state (the stop event) lives in `gr.State`.
"""

from __future__ import annotations

import logging
import threading
import time

import gradio as gr

from kvlab.protocol import ColumnFailed
from kvlab.quality.perplexity import DEFAULT_SINKS, DEFAULT_WINDOW, run_perplexity
from kvlab.sharing.cost import RunCost

from ..hosting import zerogpu
from ..hosting.costs import stream_cost
from ..shared.live_plots import line_plot, roster_update
from ..shared.markup import md_text
from ..shared.model_picker import model_dropdown
from ..shared.plot_frames import PPL, PPL_BYTES
from ..shared.runs import PRIVATE, load_and_plan, session_stop, wire_run
from .view import (
    default_choices,
    BUILT_IN,
    DEFAULT_CHOICES,
    DEFAULT_TOKENS,
    MAX_TOKENS_CAP,
    PASTED,
    PerplexityRequest,
    PerplexityView,
    perplexity_choices,
    plan_perplexity,
)

logger = logging.getLogger(__name__)
PLOT_EVERY_S = 1.5
"""Least time between two redraws of the plot while the text streams."""
EXPLAIN = (
    "Each token of a long text is predicted from what the cache still holds. **dynamic** keeps everything; "
    "**window** (a sink cache with 0 sinks) keeps only the last `window` tokens (the paper's window-attention "
    "baseline); **sink** keeps the first `sinks` tokens as attention sinks plus the recent ones (Xiao et al. 2023, "
    "*Efficient Streaming Language Models with Attention Sinks*). Past the window, window attention's perplexity "
    "shoots up while sink stays close to dynamic at constant memory. Curves show log-perplexity (nats) over the "
    "last `window` tokens. Caches that cannot run on the model are left out, with the reason. On a hybrid model "
    "(Gemma 3) compare **dynamic all-full** (every token on every layer) with **sliding_window** (the model's own "
    "window from its config, marked dashed): the sliding layers never attend past their window, so the curves "
    "coincide and only the cache bytes differ."
)


class PerplexityTab:
    """The Perplexity tab's components and handlers; `pool` is the app's shared ModelPool."""

    def __init__(self, pool):
        self.pool = pool

    def build(self) -> "PerplexityTab":
        gr.Markdown(EXPLAIN)
        with gr.Row():
            self.source = model_dropdown("bundled", scale=2, elem_id="ppl-model")
            self.text_choice = gr.Radio([BUILT_IN, PASTED], value=BUILT_IN, label="text", scale=2)
        with gr.Row():
            self.choices = gr.CheckboxGroup(perplexity_choices(), value=DEFAULT_CHOICES, label="caches", scale=3,
                                            elem_id="ppl-caches")
            self.extra = gr.Textbox(label="more caches (compare syntax)", scale=2, elem_id="ppl-extra",
                                    placeholder="e.g. quantized:backend=hqq:nbits=2,sink:num_sink_tokens=1")
        with gr.Row():
            self.tokens = gr.Slider(64, MAX_TOKENS_CAP, value=DEFAULT_TOKENS, step=64, label="tokens to stream",
                                    elem_id="ppl-tokens")
            self.window = gr.Slider(16, 2048, value=DEFAULT_WINDOW, step=16, label="window_length (tokens)",
                                    elem_id="ppl-window")
            self.sinks = gr.Slider(0, 16, value=DEFAULT_SINKS, step=1, label="num_sink_tokens (sink)",
                                   elem_id="ppl-sinks")
        self.pasted = gr.Textbox(label="your text (used when 'the text pasted below' is picked)", lines=3)
        with gr.Row():
            self.run_button = gr.Button("Run perplexity", variant="primary", elem_id="ppl-run")
            self.stop_button = gr.Button("Stop", elem_id="ppl-stop")
        self.status = gr.Markdown("", elem_id="ppl-status")
        with gr.Row(elem_id="ppl-plot"):
            self.ppl_plot = line_plot(PPL, "ppl-plot-ppl")
            self.bytes_plot = line_plot(PPL_BYTES, "ppl-plot-bytes")
        self.table = gr.Dataframe(label="perplexity per window-sized segment", interactive=False, elem_id="ppl-table")
        self.session = gr.State({})
        self._wire()
        return self

    def _wire(self) -> None:
        self.run_inputs = {self.session, self.source, self.text_choice, self.choices, self.extra, self.tokens,
                           self.window, self.sinks, self.pasted}
        wire_run(self.run_button, self.stop_button, self.session, self.status, zerogpu.gpu(self._on_run, self.gpu_s),
                 self.run_inputs, [self.status, self.ppl_plot, self.bytes_plot, self.table], self.cost)
        self.source.input(lambda source: gr.update(value=default_choices(source)), self.source, self.choices,
                          **PRIVATE)

    def request_from(self, data: dict) -> PerplexityRequest:
        """A PerplexityRequest from the Run event's {component: value} inputs."""
        return PerplexityRequest(source=data[self.source], text_choice=data[self.text_choice],
                                 choices=list(data[self.choices] or []), extra=data[self.extra],
                                 tokens=data[self.tokens], window=data[self.window], sinks=data[self.sinks],
                                 pasted=data[self.pasted])

    def caches(self, data: dict) -> int:
        """How many caches a run streams: the ticked curves and the extra strategies."""
        return len(data[self.choices] or []) + len([s for s in (data[self.extra] or "").split(",") if s.strip()])

    def gpu_s(self, data: dict) -> int:
        """ZeroGPU seconds a run asks for: its caches × tokens to stream (`zerogpu.estimate_s`)."""
        return zerogpu.estimate_s(self.caches(data), int(data[self.tokens] or 1))

    def cost(self, data: dict) -> RunCost:
        """What a run costs before it is queued: its caches × tokens, one forward each (`costs.stream_cost`)."""
        return stream_cost(self.caches(data), data[self.tokens])

    def plots(self, view: PerplexityView, primer: bool = False) -> dict:
        """Both native plots redrawn from `view`, every cache of the run in its colour from the first frame on
        (`roster_update`), even the caches that have no point yet; `primer`: the run's first update."""
        ppl, nbytes = view.frames()
        colors, roster = view.colors(), list(view.nll)
        return {self.ppl_plot: roster_update(ppl, PPL, colors, roster, primer, caption=view.caption()),
                self.bytes_plot: roster_update(nbytes, PPL_BYTES, colors, roster, primer)}

    def _on_run(self, data: dict):
        yield from self.stream(self.request_from(data), session_stop(data[self.session]))

    def stream(self, request: PerplexityRequest, stop: threading.Event):
        """Load, plan and stream the run, yielding {component: update}; bad input ends with a message."""
        # 1. Load the model and plan the run; anything that cannot start is a status message.
        ready = yield from load_and_plan(self.pool, request.source, self.status,
                                         lambda m: plan_perplexity(request, m))
        if ready is None:
            return
        loaded, plan = ready
        # 2. Stream every cache in turns, redrawing at most every PLOT_EVERY_S; a failing cache ends the run.
        view = PerplexityView([c.describe() for c in plan.columns], int(request.window), plan.input_ids.shape[1] - 1,
                              plan.skipped, plan.model_window)
        yield {**self.plots(view, primer=True), self.status: md_text(view.progress_text())}
        last_plot, failed = 0.0, None
        try:
            for event in run_perplexity(loaded, plan.input_ids, plan.columns, stop):
                view.apply(event)
                if isinstance(event, ColumnFailed) and failed is None:
                    logger.error("perplexity run failed: %s: %s", event.name, event.message)
                    failed = f"the run failed after {view.progress_text()}: {event.message}"
                    stop.set()
                now = time.perf_counter()
                if now - last_plot >= PLOT_EVERY_S:
                    last_plot = now
                    yield {**self.plots(view), self.status: md_text(view.progress_text())}
        except Exception as err:  # noqa: BLE001 - the page shows what failed and keeps the curves so far
            logger.exception("perplexity run failed")
            failed = f"the run failed after {view.progress_text()}: {type(err).__name__}: {err}"
        if failed:
            yield {**self.plots(view), self.table: view.table(), self.status: "⚠️ " + md_text(failed)}
            return
        # 3. The final curves, the per-segment table and how it ended.
        yield {**self.plots(view), self.table: view.table(), self.status: md_text(view.final_text(stop.is_set()))}


def build_perplexity_tab(pool) -> PerplexityTab:
    """Build the Perplexity tab inside the current `gr.Tab`; returns it."""
    return PerplexityTab(pool).build()
