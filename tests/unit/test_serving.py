"""The app's gradio queue polls at gradio's calm (Windows) intervals, not every 1 ms: on this gradio the
attributes exist and `create_app` sets them; on a queue without them the app says so in the log and goes on."""

import logging
import platform
import types

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.ui.serving import EVENT_POLL_S, PROGRESS_POLL_S, calm_queue_polling  # noqa: E402

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
    with caplog.at_level(logging.WARNING, logger="kvlab.ui.serving"):
        assert calm_queue_polling(demo) is False
    assert demo._queue.sleep_when_free == 0.001
    assert "progress_update_sleep_when_free" in caplog.text
    assert calm_queue_polling(types.SimpleNamespace()) is False


# --- The page's idle frames: the script goes first in the served HTML -------------------------------------

import urllib.request  # noqa: E402

from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from kvlab.ui.serving import (  # noqa: E402
    IDLE_FRAME_SCRIPT,
    IdleFramesMiddleware,
    idle_frame_script,
    launch_kwargs,
    with_early_script,
)

PAGE = "<!doctype html><html><head lang='en'><meta charset='utf-8'><script type='module' src='x.js'></script></head><body>hi</body></html>"


def test_the_script_goes_right_after_the_head_tag_and_a_page_without_one_is_left_alone():
    out = with_early_script(PAGE.encode(), "window.x = 1;").decode()
    # after a <meta charset> that opens the head, so the charset stays in the page's first bytes
    assert out.startswith("<!doctype html><html><head lang='en'><meta charset='utf-8'><script>window.x = 1;</script>")
    assert out.replace("<script>window.x = 1;</script>", "") == PAGE
    assert with_early_script(b"<p>no head here</p>", "window.x = 1;") == b"<p>no head here</p>"
    assert with_early_script(b"<HEAD><title>t</title>", "y").startswith(b"<HEAD><script>y</script>")
    assert with_early_script(b"<head>\n  <meta charset=\"utf-8\" />\n<title>", "y") == \
        b"<head>\n  <meta charset=\"utf-8\" /><script>y</script>\n<title>"


def test_the_script_carries_its_settings_and_refuses_bad_ones():
    script = idle_frame_script(idle_frames=7, idle_ms=1234, idle_max_ms=5678)
    assert "quiet >= 7" in script and "wait = 1234;" in script and "2 * wait, 5678)" in script
    assert "__IDLE" not in script and "__IDLE" not in IDLE_FRAME_SCRIPT
    for bad in ({"idle_frames": 0}, {"idle_ms": -5}, {"idle_ms": 2.5}, {"idle_max_ms": True}):
        with pytest.raises(ValueError, match="positive whole numbers"):
            idle_frame_script(**bad)
    with pytest.raises(ValueError, match="must not be below"):
        idle_frame_script(idle_ms=500, idle_max_ms=400)


def _served(**routes):
    async def page(request):
        return HTMLResponse(PAGE)

    async def chunked(request):
        async def parts():
            for part in (PAGE[:20], PAGE[20:70], PAGE[70:]):
                yield part.encode()
        return StreamingResponse(parts(), media_type="text/html")

    async def data(request):
        return JSONResponse({"head": "<head>"})

    async def packed(request):
        # an encoding the client does not decode, so a script put into the bytes would show
        return Response(PAGE.encode(), media_type="text/html", headers={"content-encoding": "x-kvlab-test"})

    app = Starlette(routes=[Route("/", page, methods=["GET", "HEAD", "POST"]), Route("/chunked", chunked),
                            Route("/data", data), Route("/packed", packed)],
                    middleware=[Middleware(IdleFramesMiddleware, script="window.early = 1;")])
    return TestClient(app)


def test_html_pages_get_the_script_first_with_a_matching_length_and_nothing_else_changes():
    client = _served()
    tag = "<script>window.early = 1;</script>"
    for path in ("/", "/chunked"):
        response = client.get(path)
        assert response.status_code == 200
        assert response.text == PAGE.replace("<meta charset='utf-8'>", "<meta charset='utf-8'>" + tag)
        assert int(response.headers["content-length"]) == len(response.content)
    assert client.get("/data").json() == {"head": "<head>"}  # not HTML
    assert client.get("/packed").text == PAGE  # compressed: left as it is
    assert client.post("/").text == PAGE  # only pages fetched with GET
    head = client.head("/")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == client.get("/").headers["content-length"]  # HEAD agrees with GET


def test_gradio_serves_its_page_with_the_script_before_its_own_modules():
    with gr.Blocks() as demo:
        gr.Markdown("x")
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_kwargs())
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            html = response.read().decode()
    finally:
        demo.close()
    assert "__kvlabIdleFrames" in html
    assert html.index("__kvlabIdleFrames") < html.index('type="module"')
    assert html.index("<head>") < html.index("__kvlabIdleFrames")


def test_the_app_launches_with_the_script(monkeypatch):
    launched = {}

    class Demo:
        def launch(self, **kwargs):
            launched.update(kwargs)

    monkeypatch.setattr(app, "create_app", lambda **_: Demo())
    monkeypatch.setattr(app, "log_to_stderr", lambda: None)
    app.launch()
    middleware = launched["app_kwargs"]["middleware"]
    assert [m.cls for m in middleware] == [IdleFramesMiddleware]
