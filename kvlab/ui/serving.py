"""Serving the app so that the page does not slow the columns it times: the server's queue polling and the
browser's idle frames.

gradio 6's queue (`gradio.queueing.Queue`) runs two polling loops on the
server's event loop for as long as the app is up: one looks for a new event
to start every `sleep_when_free` seconds (1 ms on Linux and macOS, 50 ms on
Windows), the other for progress updates to send every
`progress_update_sleep_when_free` seconds (10 ms, 100 ms on Windows). That is
about 1,100 wake-ups a second, each a little Python on the event loop thread,
even while a run is going: about 8 % of one core in a Compare run through the
API. On a machine whose cores are all busy with torch's OpenMP team, every
wake-up preempts one of its threads and the others wait for it: on the
bundled model with 2 cores, a decode step took 67.8 ms (median of 192) with
gradio's Linux intervals against 60.6 ms with its Windows ones and 61.3 ms
with no polling: one process, an asyncio loop thread sleeping at each
interval beside decode steps on kvlab's compute thread, the three conditions
interleaved in windows of 16 steps (`python -m kvlab bench --only app`
measures the app as a whole against the CLI).

`calm_queue_polling` sets gradio's own Windows intervals. The cost: an event
waits up to 50 ms longer to start, and `gr.Progress` updates go out at most
10 times a second; kvlab streams its own updates from its generators, which
these loops do not pace.

`IdleFramesMiddleware` puts a small script first in the page that slows the
animation frames a gradio page asks for while nothing on it changes (a
browser on the same machine as the app competes with the decode steps for
the same cores); see its docstring.
"""

from __future__ import annotations

import logging
import re

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware

logger = logging.getLogger(__name__)

EVENT_POLL_S = 0.05
"""Seconds between the queue's looks for a new event to start (gradio's value on Windows)."""
PROGRESS_POLL_S = 0.1
"""Seconds between the queue's looks for progress updates to send (gradio's value on Windows)."""
_INTERVALS = {"sleep_when_free": EVENT_POLL_S, "progress_update_sleep_when_free": PROGRESS_POLL_S}


def calm_queue_polling(demo) -> bool:
    """Set the polling intervals of `demo`'s queue (a `gr.Blocks` after `.queue()`) to EVENT_POLL_S and
    PROGRESS_POLL_S. Returns True when set; False, with a warning in the log, when this gradio's queue has no
    such attributes (another gradio version: the app still serves, with gradio's own intervals). Raises
    nothing."""
    queue = getattr(demo, "_queue", None)
    missing = [name for name in _INTERVALS if not isinstance(getattr(queue, name, None), (int, float))]
    if missing:
        logger.warning("gradio's queue has no %s here: its polling intervals are left as gradio set them",
                       ", ".join(missing))
        return False
    for name, seconds in _INTERVALS.items():
        setattr(queue, name, seconds)
    return True


# --- The page's idle frames -------------------------------------------------------------------------------

IDLE_FRAMES = 30
"""Animation frames in a row in which the page changed nothing (about half a second) before the page's
`requestAnimationFrame` callbacks are slowed to one batch every IDLE_FRAME_MS."""
IDLE_FRAME_MS = 250
"""Milliseconds before the first slowed batch of `requestAnimationFrame` callbacks; each batch that still
changes nothing doubles the wait, up to IDLE_FRAME_MAX_MS."""
IDLE_FRAME_MAX_MS = 4000
"""The longest wait, in milliseconds, between batches of callbacks while the page changes nothing."""

_IDLE_FRAME_JS = """
(() => {
  // kvlab: run the page's requestAnimationFrame callbacks at full rate while they change the page; once
  // __IDLE_FRAMES__ frames in a row changed nothing (gradio's status tracker keeps a frame loop going after its
  // element is gone), one batch after __IDLE_FRAME_MS__ ms, the wait doubling after each batch that changes nothing,
  // up to __IDLE_FRAME_MAX_MS__ ms. A change to the page or the user's input (resize, scroll, pointer, keys) goes
  // back to full rate at once.
  if (window.__kvlabIdleFrames || typeof window.requestAnimationFrame !== "function" ||
      typeof MutationObserver !== "function") return;
  const stats = window.__kvlabIdleFrames = { frames: 0, slowed: 0 };
  const nativeRaf = window.requestAnimationFrame.bind(window);
  let callbacks = new Map(), running = null, nextId = 1, scheduled = false, timer = null, quiet = 0, changed = true,
    wait = __IDLE_FRAME_MS__;
  const frame = (now) => {
    scheduled = false; timer = null; stats.frames++;
    quiet = changed ? 0 : quiet + 1; changed = false;
    running = callbacks; callbacks = new Map();
    for (const cb of running.values()) {  // a callback cancelled by an earlier one is skipped (Map iteration)
      try { cb(now); } catch (err) { setTimeout(() => { throw err; }); }
    }
    running = null;
  };
  const schedule = () => {
    if (scheduled) return;
    scheduled = true;
    if (quiet >= __IDLE_FRAMES__) {
      stats.slowed++;
      const ms = wait;
      wait = Math.min(2 * wait, __IDLE_FRAME_MAX_MS__);
      timer = setTimeout(() => { timer = null; nativeRaf(frame); }, ms);
    } else nativeRaf(frame);
  };
  const wake = () => {
    changed = true; quiet = 0; wait = __IDLE_FRAME_MS__;
    if (timer !== null) { clearTimeout(timer); timer = null; nativeRaf(frame); }
  };
  new MutationObserver(wake).observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
  for (const type of ["resize", "scroll", "wheel", "pointerdown", "pointermove", "keydown", "focus"]) {
    window.addEventListener(type, wake, { capture: true, passive: true });
  }
  window.requestAnimationFrame = (cb) => {
    if (typeof cb !== "function") return nativeRaf(cb);  // the browser's own TypeError
    const id = nextId++; callbacks.set(id, cb); schedule(); return id;
  };
  window.cancelAnimationFrame = (id) => { callbacks.delete(id); if (running !== null) running.delete(id); };
})();
"""


def idle_frame_script(idle_frames: int = IDLE_FRAMES, idle_ms: int = IDLE_FRAME_MS,
                      idle_max_ms: int = IDLE_FRAME_MAX_MS) -> str:
    """The page script (JavaScript source) that slows the page's `requestAnimationFrame` callbacks once
    `idle_frames` frames in a row changed nothing in the page (no DOM mutation seen by a `MutationObserver`
    on the document): the next batch runs after `idle_ms` milliseconds, and each batch that still changes
    nothing doubles the wait, up to `idle_max_ms`. The next change, or the user's input (resize, scroll,
    wheel, pointer, keys, focus), runs the waiting callbacks at once and goes back to full rate.
    Callbacks keep their order, their frame timestamp and `cancelAnimationFrame`; a callback that throws is
    reported without stopping the others. CSS animations and transitions do not go through
    `requestAnimationFrame` and are not touched. `window.__kvlabIdleFrames`
    counts the frames run (`frames`) and the batches delayed (`slowed`).

    Raises:
        ValueError: idle_frames, idle_ms or idle_max_ms is not a positive whole number, or idle_max_ms is
            below idle_ms.
    """
    values = (idle_frames, idle_ms, idle_max_ms)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ValueError(f"idle_frames, idle_ms and idle_max_ms must be positive whole numbers, got {values!r}")
    if idle_max_ms < idle_ms:
        raise ValueError(f"idle_max_ms ({idle_max_ms}) must not be below idle_ms ({idle_ms})")
    return (_IDLE_FRAME_JS.replace("__IDLE_FRAMES__", str(idle_frames))
            .replace("__IDLE_FRAME_MAX_MS__", str(idle_max_ms)).replace("__IDLE_FRAME_MS__", str(idle_ms)))


IDLE_FRAME_SCRIPT = idle_frame_script()
"""The page script `IdleFramesMiddleware` puts first in the app's HTML. It must run before gradio's own
modules: gradio's status tracker takes `window.requestAnimationFrame` when its module loads, so a script
added later (gradio's `head=`, `js=`) cannot reach its loop."""

_HEAD = re.compile(rb"<head(\s[^>]*)?>", re.IGNORECASE)
_CHARSET = re.compile(rb"\s*<meta\s[^>]*charset[^>]*>", re.IGNORECASE)


def with_early_script(html: bytes, script: str = IDLE_FRAME_SCRIPT) -> bytes:
    """`html` with `<script>script</script>` right after its `<head>` tag, or after a `<meta charset>` that
    directly follows it (so the charset stays in the first bytes a browser looks at); `html` unchanged when
    it has no `<head>` tag. Raises nothing."""
    match = _HEAD.search(html)
    if match is None:
        return html
    charset = _CHARSET.match(html, match.end())
    at = charset.end() if charset is not None else match.end()
    tag = b"<script>" + script.encode() + b"</script>"
    return html[:at] + tag + html[at:]


class IdleFramesMiddleware:
    """ASGI middleware: every uncompressed `text/html` answer to a GET gets IDLE_FRAME_SCRIPT first in its
    `<head>` (a HEAD for a page path is answered as that GET without its body, so the lengths agree);
    everything else passes untouched.

    Why: a gradio 6 page asks the browser for an animation frame 60 to 80 times a second for as long as it
    is open, even an empty `gr.Blocks()`: the status tracker's elapsed-time loop (`statustracker-*.js`)
    keeps running once the app's loading tracker is gone, and so does the spring of its loader. Each frame
    costs the browser's renderer a little CPU; on a machine whose cores run kvlab's timed decode steps, a
    browser on the same machine took 0.13 to 0.17 of a core during a quiet re-timing (headless Chromium,
    2 cores), and every decode step paid for it. With the script, frames that change nothing come at most
    4 times a second, then less and less often (one every 4 s from about 4 s on). Each frame the page asks
    for keeps Chromium's compositor threads ticking for a while after it, so the rate matters beyond the
    callbacks' own work: on an idle app page, 145 Chromium thread wake-ups a second and 0.014 core at a
    steady 4 frames a second, 19 to 24 wake-ups and 0.001 to 0.005 core with the growing wait (no frames at
    all: 18 and 0.001). A CLI quickstart run beside an idle page at 4 frames a second decoded 1 to 3 %
    slower than with no browser (3 rounds, interleaved); with every frame held, no slower.

    Pass it through gradio: `demo.launch(app_kwargs={"middleware": [Middleware(IdleFramesMiddleware)]})`
    (`launch_kwargs` builds that). Gradio's own middlewares (CORS, Brotli) sit outside this one, so it sees
    the page before compression.
    """

    def __init__(self, app, script: str = IDLE_FRAME_SCRIPT):
        self.app = app
        self.script = script

    async def __call__(self, scope, receive, send):
        head = scope.get("method") == "HEAD" and _is_page_path(scope.get("path", ""))
        if scope.get("type") != "http" or (scope.get("method") != "GET" and not head):
            await self.app(scope, receive, send)
            return
        if head:  # answered as a GET, so its length is the page's with the script; the body is dropped
            scope = {**scope, "method": "GET"}
        start: dict | None = None
        body: list[bytes] = []

        async def send_page(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = Headers(raw=message.get("headers") or [])
                html = headers.get("content-type", "").startswith("text/html")
                if html and "content-encoding" not in headers:
                    start = message  # held until the whole page is here
                    return
                await send(message)
            elif message["type"] == "http.response.body" and start is not None:
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                page = with_early_script(b"".join(body), self.script)
                headers = MutableHeaders(raw=list(start.get("headers") or []))
                headers["content-length"] = str(len(page))
                await send({**start, "headers": headers.raw})
                await send({"type": "http.response.body", "body": b"" if head else page, "more_body": False})
            elif head and message["type"] == "http.response.body":
                await send({**message, "body": b""})
            else:
                await send(message)

        await self.app(scope, receive, send_page)


def _is_page_path(path: str) -> bool:
    """Whether `path` may be one of the app's pages ("/" or a page name), not an API route, file or asset."""
    last = path.rsplit("/", 1)[-1]
    return path == "/" or (not path.startswith("/gradio_api") and "=" not in path and "." not in last)


def launch_kwargs() -> dict:
    """Keyword arguments for `gr.Blocks.launch` that serve the app's pages with IDLE_FRAME_SCRIPT
    (`app_kwargs` goes to gradio's FastAPI app)."""
    return {"app_kwargs": {"middleware": [Middleware(IdleFramesMiddleware)]}}
