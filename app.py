"""kvlab's web app: assembles the tabs around one shared ModelPool and launches them.

`create_app()` returns the `gr.Blocks`; `python app.py` serves it on 0.0.0.0,
port `GRADIO_SERVER_PORT`, else `PORT`, else 7860. Everything a tab does lives
in its `kvlab.ui` modules; this file only assembles them.
"""

import logging
import os
import sys

from kvlab import SETUP_HINT

try:
    import gradio as gr

    from kvlab.models import ModelPool
    from kvlab.ui.chat_tab import build_chat_tab
    from kvlab.ui.compare_tab import build_compare_tab
    from kvlab.ui.inspect_tab import build_inspect_tab
    from kvlab.ui.perplexity_tab import build_perplexity_tab
    from kvlab.ui.plan_tab import build_plan_tab
    from kvlab.ui.theme import CSS
except ImportError as missing:
    sys.exit(f"kvlab: the package {missing.name or missing} is not installed here: {SETUP_HINT}")

DEFAULT_PORT = 7860
TITLE = "kvlab: KV-cache strategies side by side"
COMPARE_TAB = "compare"
"""The Compare tab's id: the Plan tab's "measure it for real" switches to it."""
CACHE_CLEANUP = (3600, 3600)
"""Every hour, delete gradio's cached copies of served files (exports) older than an hour."""


def create_app(pool: ModelPool | None = None, preload: bool = True) -> gr.Blocks:
    """The whole app. `pool` holds the model weights every tab and session shares; `preload` starts
    loading the bundled model in the background right away, then warms the planner."""
    pool = pool or ModelPool()
    with gr.Blocks(title=TITLE, analytics_enabled=False, fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        gr.Markdown(f"# {TITLE}", elem_classes=["kv-header"])
        with gr.Tabs() as tabs:
            with gr.Tab("Compare", id=COMPARE_TAB):
                compare = build_compare_tab(pool, preload=preload)
            with gr.Tab("Chat"):
                chat = build_chat_tab(pool)
            with gr.Tab("Perplexity"):
                build_perplexity_tab(pool)
            with gr.Tab("Plan"):
                build_plan_tab(pool, compare, tabs, COMPARE_TAB, warm=preload)
            with gr.Tab("Inspect"):
                inspect = build_inspect_tab(pool)
        demo.unload(chat.unload)
        demo.unload(inspect.unload)
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
    """Serve the app; a port that cannot be opened is reported in one line naming the setting that moves it."""
    log_to_stderr()
    port = server_port()
    try:
        create_app().launch(server_name="0.0.0.0", server_port=port, css=CSS, show_error=True)
    except OSError as err:
        sys.exit(f"kvlab: cannot serve on port {port} ({str(err).splitlines()[0]}): set GRADIO_SERVER_PORT "
                 "(or PORT) to a free port")


if __name__ == "__main__":
    launch()
