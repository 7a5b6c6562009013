"""kvlab's web app: assembles the tabs around one shared ModelPool and launches them.

`create_app()` returns the `gr.Blocks`; `python app.py` serves it on 0.0.0.0,
port `GRADIO_SERVER_PORT`, else `PORT`, else 7860. Everything a tab does lives
in its `kvlab.ui` modules; this file only assembles them.

Started as a script, the app begins loading the bundled model on a background
thread *before* importing gradio (which takes seconds), so the two overlap
(`KVLAB_EARLY_LOAD=0` turns that off). The load ends with the one-time warm-up
of the columns the Compare page opens with (`kvlab.ui.compare.warm`) and of the
planner (`kvlab.ui.plan.warm`), so the first Run times like the second. gradio's queue holds at most
`KVLAB_QUEUE_MAX_SIZE` waiting events (default 16; 0 = no limit); model-bound
events start at once and take their turns for the model in kvlab's scheduler,
under the caps of `kvlab.sharing.limits` (`kvlab.ui.hosting.turns`). Gradio itself
refuses an upload larger than a record may be (`KVLAB_MAX_RECORD_MB`, default 16
MiB; `kvlab.measure.record_json`) before storing it. On a Hugging Face Space a
"Duplicate Space" button shows in the header; on ZeroGPU the GPU-bound handlers
are wrapped by `kvlab.ui.hosting.zerogpu`.

Started as a script, the app also handles SIGTERM from its first moment (what a
Space restart sends): it stops kvlab's work, closes the server and exits with
status 143 within a few seconds (`kvlab.ui.hosting.shutdown`), and it empties the
ready file (`KVLAB_READY_FILE`) before its model starts loading.
"""

import logging
import os
import sys

from kvlab import SETUP_HINT
from kvlab.sharing.limits import Limits, whole_setting
from kvlab.ui.hosting.shutdown import SigtermExit

EARLY_LOADER = None
"""The `BackgroundLoader` whose load of the bundled model started before gradio was imported (script only)."""
TERMINATION = SigtermExit()
"""The SIGTERM handler, installed by `python app.py` before anything loads and restored when it ends."""


def log_to_stderr() -> None:
    """Send kvlab's own log lines (model ready or failed, run errors) to stderr, where server logs are read
    (once per process)."""
    logger = logging.getLogger("kvlab")
    if any(getattr(h, "kvlab_stderr", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kvlab: %(message)s"))
    handler.kvlab_stderr = True
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)


QUEUE_MAX_SIZE_ENV = "KVLAB_QUEUE_MAX_SIZE"
DEFAULT_QUEUE_MAX_SIZE = 16
"""Events that may wait in the queue at once; more are refused with "queue is full" (0 = no limit)."""


def queue_max_size() -> int | None:
    """The queue's `max_size` from KVLAB_QUEUE_MAX_SIZE (default DEFAULT_QUEUE_MAX_SIZE; 0 means no limit: None).

    Raises:
        ValueError: the setting is not a whole number >= 0; the message names it and its value.
    """
    text = os.environ.get(QUEUE_MAX_SIZE_ENV, "").strip()
    if not text:
        return DEFAULT_QUEUE_MAX_SIZE
    try:
        size = int(text)
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"{QUEUE_MAX_SIZE_ENV} must be a whole number >= 0 (0 = no limit), got {text!r}")
    return size or None


STATE_SESSIONS_ENV = "KVLAB_STATE_SESSIONS"
DEFAULT_STATE_SESSIONS = 1000
"""Sessions whose state gradio keeps in memory (`launch(state_session_capacity=…)`, the oldest dropped first).
About 1.25 MiB each was measured on this app; gradio's own default, 10,000, would be about 12 GiB, and any
anonymous client can open sessions by the second."""


def state_sessions() -> int:
    """gradio's `state_session_capacity` from KVLAB_STATE_SESSIONS (default DEFAULT_STATE_SESSIONS).

    Raises:
        ValueError: the setting is not a whole number >= 1; the message names it and its value.
    """
    return whole_setting(STATE_SESSIONS_ENV, DEFAULT_STATE_SESSIONS)


DEFAULT_PORT = 7860


def server_port() -> int:
    """The port from GRADIO_SERVER_PORT, else PORT, else DEFAULT_PORT.

    Raises:
        ValueError: the setting is not a whole number; the message names it and its value.
    """
    text = os.environ.get("GRADIO_SERVER_PORT") or os.environ.get("PORT") or str(DEFAULT_PORT)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"GRADIO_SERVER_PORT (or PORT) must be a port number, got {text!r}") from None


def port_refusal(port: int) -> str | None:
    """The one line that says `port` cannot be served (taken, or not allowed), or None when it can be bound on
    0.0.0.0 now. Checked before the model starts loading, so a second app on a taken port loads nothing."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as err:
            return (f"kvlab: cannot serve on port {port} ({err.strerror or err}): set GRADIO_SERVER_PORT "
                    "(or PORT) to a free port")
    return None


if __name__ == "__main__":
    from kvlab.measure.record_json import max_record_bytes
    from kvlab.models.sources import max_model_mb
    from kvlab.ui.compare.kept_runs import check_settings as check_kept_runs
    from kvlab.sharing.limits import proxy_hops

    try:
        queue_max_size()  # bad settings are said before anything loads
        state_sessions()
        Limits.from_env()
        max_record_bytes()
        max_model_mb()
        check_kept_runs()
        proxy_hops()
        refusal = port_refusal(server_port())
    except ValueError as bad:
        sys.exit(f"kvlab: {bad}")
    if refusal:
        sys.exit(refusal)
    log_to_stderr()
    TERMINATION.install()

try:
    if __name__ == "__main__":
        from kvlab.models import readiness

        readiness.reset()  # an earlier start's lines must not make this one look ready
    if __name__ == "__main__" and os.environ.get("KVLAB_EARLY_LOAD", "1") != "0":
        from kvlab.models.loading import ModelPool, ModelSpec
        from kvlab.ui.compare.warm import OpeningWarmUp
        from kvlab.ui.plan.warm import PlannerWarmUp
        from kvlab.ui.shared.loader import BackgroundLoader

        log_to_stderr()
        EARLY_LOADER = BackgroundLoader(ModelPool(), warm=(OpeningWarmUp(), PlannerWarmUp()))
        EARLY_LOADER.start(ModelSpec())

    import gradio as gr

    from kvlab.models.loading import ModelPool
    from kvlab.measure.record_json import max_record_bytes
    from kvlab.ui.chat.tab import build_chat_tab
    from kvlab.ui.compare.tab import build_compare_tab
    from kvlab.ui.inspect.tab import build_inspect_tab
    from kvlab.ui.needle.tab import build_needle_tab
    from kvlab.ui.perplexity.tab import build_perplexity_tab
    from kvlab.ui.plan.tab import build_plan_tab
    from kvlab.ui.report.tab import build_report_tab
    from kvlab.ui.hosting.server import calm_queue_polling, close_promptly
    from kvlab.ui.shared.theme import CSS
    from kvlab.ui.hosting.tools import mcp_enabled, register_tools
    from kvlab.ui.hosting.turns import configure as configure_turns
except ImportError as missing:
    sys.exit(f"kvlab: the package {(missing.name or str(missing)).split('.')[0]} is not installed here: {SETUP_HINT}")

TITLE = "kvlab: KV-cache strategies side by side"
COMPARE_TAB = "compare"
"""The Compare tab's id: the Plan tab's "measure it for real" switches to it."""
INSPECT_TAB = "inspect"
"""The Inspect tab's id: a link from Compare's "first divergence" cell opens it."""
CACHE_CLEANUP = (300, 900)
"""Every 5 minutes, delete the files gradio stored for this app (uploads, its copies of served exports) older
than 15 minutes: an upload is read when it arrives, so one is kept at most 20 minutes (gradio's `delete_cache`;
an hour and an hour kept a visitor's uploads up to two hours)."""
def on_space() -> bool:
    """Whether the app runs on a Hugging Face Space (Spaces set SYSTEM=spaces and SPACE_ID)."""
    return os.environ.get("SYSTEM") == "spaces" and bool(os.environ.get("SPACE_ID"))


def create_app(pool: ModelPool | None = None, preload: bool = True, loader=None) -> gr.Blocks:
    """The whole app. `pool` holds the model weights every tab and session shares; `preload` starts
    loading the bundled model in the background right away, then warms the planner; `loader` is a
    `kvlab.ui.shared.loader.BackgroundLoader` on `pool` whose load already started (see EARLY_LOADER).

    Raises:
        ValueError: KVLAB_QUEUE_MAX_SIZE, or a cap of `kvlab.sharing.limits.Limits` (KVLAB_MAX_RUN_STEPS,
            KVLAB_MAX_RUNS_PER_CLIENT, KVLAB_MAX_WAITING, KVLAB_CONCURRENCY), is not a whole number in range.
    """
    max_size = queue_max_size()
    configure_turns(Limits.from_env())  # model-bound events take their turns under these caps
    pool = loader.pool if loader is not None else (pool or ModelPool())
    with gr.Blocks(title=TITLE, analytics_enabled=False, fill_width=True, delete_cache=CACHE_CLEANUP) as demo:
        with gr.Row(equal_height=True):
            gr.Markdown(f"# {TITLE}", elem_classes=["kv-header"])
            gr.DuplicateButton(visible=on_space(), elem_id="kv-duplicate")
        with gr.Tabs() as tabs:
            with gr.Tab("Compare", id=COMPARE_TAB):
                compare = build_compare_tab(pool, preload=preload, loader=loader)
            with gr.Tab("Chat"):
                chat = build_chat_tab(pool)
            with gr.Tab("Perplexity"):
                build_perplexity_tab(pool)
            with gr.Tab("Plan"):
                build_plan_tab(pool, compare, tabs, COMPARE_TAB, warm=preload)
            with gr.Tab("Inspect", id=INSPECT_TAB):
                inspect = build_inspect_tab(pool)
            with gr.Tab("Needle"):
                build_needle_tab(pool)
            with gr.Tab("Report"):
                build_report_tab(pool)
        register_tools(pool)  # compare_strategies, plan, needle, diverge: API endpoints and MCP tools
        compare.wire_page_load(demo)
        inspect.wire_link(demo, tabs, INSPECT_TAB)
        demo.unload(compare.unload)
        demo.unload(chat.unload)
        demo.unload(inspect.unload)
    # Every event starts at once; model-bound ones then wait for their turn in kvlab's scheduler (turns.py).
    demo.queue(default_concurrency_limit=None, max_size=max_size)
    calm_queue_polling(demo)  # gradio polls its queue every 1 ms: that slowed every timed step (kvlab.ui.hosting.server)
    return demo


def mcp_flag(argv: list[str]) -> bool | None:
    """`--mcp` / `--no-mcp` on the command line (the last one wins), else None (KVLAB_MCP or the Space default
    decides, `kvlab.ui.hosting.tools.mcp_enabled`)."""
    flags = [arg for arg in argv if arg in ("--mcp", "--no-mcp")]
    return None if not flags else flags[-1] == "--mcp"


def launch() -> None:
    """Serve the app; a port that cannot be opened, or a bad KVLAB_QUEUE_MAX_SIZE, KVLAB_MAX_RECORD_MB,
    KVLAB_STATE_SESSIONS or KVLAB_MCP, is reported in one line naming the setting to change. gradio keeps the
    state of at most `state_sessions()` sessions, dropping the oldest. Uploads larger than a record may be
    (`kvlab.measure.record_json.max_record_bytes`) are refused by gradio before they are stored. With the MCP
    switch on (`--mcp`, KVLAB_MCP=1, or on a Space), gradio's MCP server answers at /gradio_api/mcp/ (streamable
    HTTP) and /gradio_api/mcp/sse (docs/mcp.md). However it ends (Ctrl-C, SIGTERM's SystemExit from
    `TERMINATION`), the server is closed."""
    log_to_stderr()
    port = server_port()
    try:
        mcp = mcp_enabled(mcp_flag(sys.argv[1:]))
        max_upload = max_record_bytes()
        sessions = state_sessions()
        demo = create_app(loader=EARLY_LOADER)
    except ValueError as err:
        sys.exit(f"kvlab: {err}")
    try:
        # show_error off: gradio's pop-up renders an unexpected error's message as HTML, and such a message may
        # quote a visitor's or a record's text; the tabs say what went wrong in their own status lines (gr.Error,
        # the MCP tools' refusals, is shown either way)
        demo.launch(server_name="0.0.0.0", server_port=port, css=CSS, show_error=False, mcp_server=mcp,
                    max_file_size=max_upload, state_session_capacity=sessions)
    except OSError as err:
        sys.exit(f"kvlab: cannot serve on port {port} ({str(err).splitlines()[0]}): set GRADIO_SERVER_PORT "
                 "(or PORT) to a free port")
    finally:
        close_promptly(demo)


if __name__ == "__main__":
    try:
        launch()
    finally:
        TERMINATION.restore()
        TERMINATION.finish()
