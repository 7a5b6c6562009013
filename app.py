"""kvlab's web app: assembles the tabs around one shared ModelPool and launches them.

`create_app()` returns the `gr.Blocks`; `python app.py` serves it on 0.0.0.0,
port `GRADIO_SERVER_PORT`, else `PORT`, else 7860. Everything a tab does lives
in its `kvlab.ui` modules; this file only assembles them.
"""

import logging
import os
import sys

import gradio as gr

from kvlab.models import ModelPool
from kvlab.ui.chat_tab import build_chat_tab
from kvlab.ui.compare_tab import build_compare_tab
from kvlab.ui.inspect_tab import build_inspect_tab
from kvlab.ui.perplexity_tab import build_perplexity_tab
from kvlab.ui.theme import CSS

DEFAULT_PORT = 7860
TITLE = "kvlab: KV-cache strategies side by side"
CACHE_CLEANUP = (3600, 3600)
"""Every hour, delete gradio's cached copies of served files (exports) older than an hour."""


def create_app(pool: ModelPool | None = None, preload: bool = True) -> gr.Blocks:
    """The whole app. `pool` holds the model weights every tab and session shares; `preload` starts
    loading the bundled model in the background right away."""
    pool = pool or ModelPool()
    with gr.Blocks(title=TITLE, analytics_enabled=False, fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        gr.Markdown(f"# {TITLE}", elem_classes=["kv-header"])
        with gr.Tab("Compare"):
            build_compare_tab(pool, preload=preload)
        with gr.Tab("Chat"):
            build_chat_tab(pool)
        with gr.Tab("Perplexity"):
            build_perplexity_tab(pool)
        with gr.Tab("Inspect"):
            build_inspect_tab(pool)
    # Light events (presets, strategy pickers, Stop) run at once; model-bound ones set their own limit.
    demo.queue(default_concurrency_limit=None)
    return demo


def server_port() -> int:
    return int(os.environ.get("GRADIO_SERVER_PORT") or os.environ.get("PORT") or DEFAULT_PORT)


def log_to_stderr() -> None:
    """Send kvlab's own log lines (model ready or failed, run errors) to stderr, where server logs are read."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kvlab: %(message)s"))
    logger = logging.getLogger("kvlab")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)


def launch() -> None:
    log_to_stderr()
    create_app().launch(server_name="0.0.0.0", server_port=server_port(), css=CSS, show_error=True)


if __name__ == "__main__":
    launch()
