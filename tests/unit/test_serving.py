"""The app's gradio queue polls at gradio's calm (Windows) intervals, not every 1 ms: on this gradio the
attributes exist and `create_app` sets them; on a queue without them the app says so in the log and goes on."""

import logging
import platform
import types

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.ui.hosting.server import EVENT_POLL_S, PROGRESS_POLL_S, calm_queue_polling  # noqa: E402

pytestmark = pytest.mark.unit


def test_a_plain_gradio_queue_polls_every_millisecond_here_and_create_app_calms_it():
    with gr.Blocks() as plain:
        gr.Markdown("x")
    plain.queue()
    if platform.system() != "Windows":  # what gradio does by itself here: the busy polling this module exists for
        assert plain._queue.sleep_when_free < EVENT_POLL_S
        assert plain._queue.progress_update_sleep_when_free < PROGRESS_POLL_S
    demo = app.create_app(preload=False)
    assert demo._queue.sleep_when_free == EVENT_POLL_S
    assert demo._queue.progress_update_sleep_when_free == PROGRESS_POLL_S


def test_a_queue_without_the_intervals_is_left_alone_with_a_warning(caplog):
    demo = types.SimpleNamespace(_queue=types.SimpleNamespace(sleep_when_free=0.001))
    with caplog.at_level(logging.WARNING, logger="kvlab.ui.hosting.server"):
        assert calm_queue_polling(demo) is False
    assert demo._queue.sleep_when_free == 0.001
    assert "progress_update_sleep_when_free" in caplog.text
    assert calm_queue_polling(types.SimpleNamespace()) is False




def test_the_api_and_the_mcp_tools_are_kvlab_s_tools_only():
    """gradio serves every public event as an API endpoint and, with `mcp_server`, as an MCP tool: the tabs'
    own events (send, clear, undo, stop, ...) are private, so an agent sees only kvlab's typed tools and the
    preset `compare` API."""
    import app

    demo = app.create_app(preload=False)
    assert sorted(demo.get_api_info()["named_endpoints"]) == [
        "/compare", "/compare_strategies", "/diverge", "/needle", "/plan_memory"]
