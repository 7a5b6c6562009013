"""Retake the README's pictures from the current app: `python scripts/readme_pictures.py [--only NAME]`.

Starts `python app.py` from this repository on a free localhost port (the environment the browser tests
use, tests/browser/conftest.py), drives Debian's chromium (`/usr/bin/chromium`, never a downloaded browser)
with Playwright, and writes each PNG into docs/. NAME is a picture's file name without `.png`:

- screenshot: the Compare tab showing a run of the default quickstart preset, as it ships (run through the app's
  `compare` API with no browser beside it, then opened from its record);
- native-plots: the same run's plots, hovering the cache plot (taken from the same run as `screenshot`);
- plan-tab: the Plan tab, gemma-3-27b-it at 1k-128k tokens with a 24 GB budget;
- inspect: Inspect stepping a sink cache past its 32-token window (step 20);
- inspect-snapkv: Inspect's token strip for a SnapKV cache after the prefill, per layer and KV head;
- diverge: Inspect opened from a greedy sampling-preset run's first-divergence link;
- needle: the Needle tab, three columns at 160 and 256 tokens, three depths.

Runs are kept small where the picture allows; the quickstart run is the preset's own (64 tokens).

A picture shows what a visitor on a quiet machine gets, or it is not taken: before each picture the script waits
(up to QUIET_WAIT_S) until the machine is quiet by the app's own busy rule (`kvlab.measure.noise.busy_reasons`:
other processes taking more than half a core per core, measured over QUIET_WINDOW_S by
`kvlab.measure.environment.OtherWork`), each picture is first written to artifacts/ and copied into docs/ only when
the processes outside this script, its app and its browser stayed as quiet while it was taken, and the Compare
picture only when the app did not mark its run busy and its summary came within SUMMARY_SLACK x
QUIET_SUMMARY_S (`--quiet-summary-s`). A Space visitor's browser runs on their own machine; here it would share the
app's two cores, so the quickstart runs with no browser open (`quickstart_record`) and the page then shows its
record, with the run's own figures in the status line; the other pictures' browser runs at the lowest priority
(`BROWSER_NICE`). A refused picture is named on stderr with
its reason, docs/ keeps the old one, and the exit status is 3.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode, urljoin

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1600, "height": 1000}
LONG_MS = 1_800_000
APP_START_S = 300
DONE = ("finished", "stopped", "✖")
ARTIFACTS = REPO_ROOT / "artifacts"
QUIET_SUMMARY_S = 23.0
"""Seconds from Run to the summary of the default quickstart preset (64 tokens) on a quiet 2-vCPU machine: 22.1 and
22.7 s through the app's `compare` API, 22.7-23.6 s for three runs in one process (2026-12-04, load under 1.5)."""
SUMMARY_SLACK = 1.5
"""A Compare picture whose summary took longer than this many times QUIET_SUMMARY_S is refused."""
QUIET_WAIT_S = 600
"""How long the script waits for a quiet machine before a picture."""
QUIET_WINDOW_S = 5.0
"""Seconds over which the other processes' work is measured before a picture."""
BROWSER_NICE = 19
"""The browser's scheduling priority (`nice`): the lowest, so the app's run never waits for the page's drawing."""
SNAPKV_PROMPT = (
    "Read the notes below and answer the question at the end.\n"
    "The lighthouse on Gull Rock was built in 1871 from granite quarried on the mainland. Its first keeper, "
    "Martha Hale, kept a log of every ship that passed, the weather at dawn and dusk, and the oil she burned. "
    "In 1903 the lamp was replaced by a lens made in Paris, which could be seen from twenty miles away. "
    "The station was automated in 1968, and the keeper's cottage became a small museum that opens each summer. "
    "Visitors can climb the 112 steps to the lantern room, where the old lens still turns on calm evenings.\n"
    "Question: who was the first keeper of the lighthouse, and when was the lens replaced?")


class Refused(Exception):
    """A picture that would not show what a visitor on a quiet machine gets; the message says why."""


def busy_now() -> list[str]:
    """The app's busy rule on the other processes' work over the next QUIET_WINDOW_S ([] when quiet); the app and
    the browser count as other processes here, so a picture also waits for the app's own background work."""
    from kvlab.measure.environment import OtherWork, cores_available
    from kvlab.measure.noise import busy_reasons

    others = OtherWork()
    time.sleep(QUIET_WINDOW_S)
    return busy_reasons(None, None, 0, cores_available(), others.cores())


def wait_for_quiet(timeout_s: float = QUIET_WAIT_S) -> None:
    """Return once the machine is quiet with no run of ours going; raises Refused after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while reasons := busy_now():
        if time.monotonic() > deadline:
            raise Refused(f"the machine stayed busy for {timeout_s:.0f} s ({'; '.join(reasons)})")


class OutsideWork:
    """The cores processes outside this script's own tree (it, its app, its browser) took from creation to
    `reasons()`: the CPUs' taken seconds less the tree's, over the wall seconds. A process of the tree that ended
    meanwhile counts as outside (its seconds leave the tree's sum), which errs towards refusing."""

    def __init__(self):
        from kvlab.measure.environment import taken_cpu_s

        self._start = (time.perf_counter(), taken_cpu_s(), tree_cpu_s())

    def cores(self) -> float | None:
        """The outside processes' mean cores since creation, or None where the CPUs' times cannot be read."""
        from kvlab.measure.environment import taken_cpu_s

        wall0, taken0, tree0 = self._start
        taken, wall = taken_cpu_s(), time.perf_counter() - wall0
        if taken is None or taken0 is None or wall <= 0:
            return None
        return max(0.0, (taken - taken0) - (tree_cpu_s() - tree0)) / wall

    def reasons(self) -> list[str]:
        """The app's busy rule on `cores()` ([] when quiet)."""
        from kvlab.measure.environment import cores_available
        from kvlab.measure.noise import busy_reasons

        return busy_reasons(None, None, 0, cores_available(), self.cores())


def tree_cpu_s() -> float:
    """CPU seconds this script and every process under it (the app, Playwright's driver, the browser) used."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in (me, *me.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def lower_browser_priority() -> None:
    """Every browser process under this script gets nice BROWSER_NICE (the pages it opens later inherit it)."""
    import psutil

    for process in psutil.Process().children(recursive=True):
        try:
            if "chrom" in process.name().lower() or "headless_shell" in process.name().lower():
                process.nice(BROWSER_NICE)
        except psutil.Error:
            continue


def compare_refusal(record: dict, quiet_summary_s: float) -> str | None:
    """Why a quickstart run's record cannot be a README picture (None when it can): the app's busy verdict, or a
    summary later than SUMMARY_SLACK x `quiet_summary_s` seconds."""
    timing = record.get("timing") or {}
    if timing.get("busy"):
        return f"the app marked the run too busy for a fair comparison: {timing.get('note', '')}"
    summary_s = record.get("summary_s")
    if summary_s is None:
        return "the record gives no summary time"
    if summary_s > SUMMARY_SLACK * quiet_summary_s:
        return (f"the summary came after {summary_s:.1f} s, more than {SUMMARY_SLACK} x the quiet "
                f"{quiet_summary_s:.0f} s")
    return None


def keep(shot: Path, outside: OutsideWork) -> None:
    """Copy a picture taken into artifacts/ over docs/' one, unless processes `outside` this script's tree were
    busy while it was taken."""
    if reasons := outside.reasons():
        raise Refused(f"{shot.name}: the machine got busy while it was taken ({'; '.join(reasons)})")
    shutil.copyfile(shot, DOCS / shot.name)
    print("wrote", DOCS / shot.name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free port, as tests/browser/conftest.py starts it; returns (process, url) once it answers."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO_ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + APP_START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the app exited with {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return process, url
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    process.terminate()
    raise SystemExit(f"the app did not answer at {url} within {APP_START_S} s; see {log_path}")


def open_page(browser, url: str):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(LONG_MS)
    page.goto(url)
    return page


def wait_for_run(page, prefixes=DONE) -> str:
    """Wait until Compare's status line starts with one of `prefixes`; returns it."""
    page.wait_for_function("(ps) => { const t = (document.querySelector('#kv-run-status') || {}).innerText || '';"
                           " return ps.some(p => t.startsWith(p)); }", arg=list(prefixes), timeout=LONG_MS)
    return page.locator("#kv-run-status").inner_text()


def wait_for_model(page) -> None:
    page.wait_for_selector("#kv-run")
    page.wait_for_function("document.querySelector('#kv-model-status').innerText.includes('ready')", timeout=LONG_MS)


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def hover_cache_plot(page) -> None:
    """Move over the cache plot's data area until vega's tooltip shows (a value with its unit)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.locator("#kv-plot-cache svg.marks").bounding_box()
    tooltip = page.locator("#vg-tooltip-element.visible")
    for fx, fy in ((0.8, 0.45), (0.7, 0.3), (0.5, 0.5), (0.9, 0.6), (0.3, 0.7)):
        page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy, steps=8)
        try:
            tooltip.wait_for(state="visible", timeout=3000)
        except PlaywrightTimeout:  # no point near this spot: try the next one
            continue
        return
    print("native-plots: no tooltip appeared; the picture shows none", file=sys.stderr)


def quickstart_record(url: str) -> Path:
    """One run of the default quickstart preset through the app's `compare` API (the run a visitor's Run makes,
    on the same app), with no browser beside it: a Space visitor's browser draws on their own machine, while
    here it would share the app's two cores and make the decode steps vary (±27 % against ±10 % alone, which the
    app rightly calls too busy). Returns the record's path under artifacts/."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    try:
        record = client.predict("quickstart", None, None, api_name="/compare")
    finally:
        client.close()
    path = ARTIFACTS / "quickstart-run.json"
    path.write_text(json.dumps(record if isinstance(record, dict) else json.loads(record)))
    return path


def take_compare(browser, url: str, names: set[str], quiet_summary_s: float, outside: OutsideWork) -> None:
    """The default quickstart preset run through the app's API, then opened in the Compare tab from its record
    (the status line: `replayed: measured on … · finished in … · summary after …`): the whole page, then its
    plots hovered; refused (Refused) when the app marked the run busy or its summary came late."""
    path = quickstart_record(url)
    record = json.loads(path.read_text())
    print(f"compare: summary after {record.get('summary_s', 0):.1f} s, finished in {record.get('wall_s', 0):.1f} s")
    if reason := compare_refusal(record, quiet_summary_s):
        raise Refused(f"screenshot, native-plots: {reason}")
    page = open_page(browser, url)
    wait_for_model(page)
    page.locator("#kv-replay-box").click()
    page.locator("#kv-replay input[type=file]").set_input_files(str(path))
    status = wait_for_run(page, ("replayed", "✖"))
    print("compare:", status.splitlines()[0])
    page.locator("#kv-plot-cache svg.marks").wait_for(state="visible")
    page.locator("#kv-replay-box").click()  # closed again, as the page opens
    page.wait_for_timeout(1000)
    if "screenshot" in names:
        page.screenshot(path=str(ARTIFACTS / "screenshot.png"), full_page=True)
        keep(ARTIFACTS / "screenshot.png", outside)
    if "native-plots" in names:
        page.locator("#kv-plots").scroll_into_view_if_needed()
        hover_cache_plot(page)
        page.locator("#kv-plots").screenshot(path=str(ARTIFACTS / "native-plots.png"))
        keep(ARTIFACTS / "native-plots.png", outside)
    page.context.close()


def take_plan(browser, url: str) -> None:
    page = open_page(browser, url)
    page.get_by_role("tab", name="Plan").click()
    page.locator("#plan-run").wait_for(state="visible")
    pick(page, "plan-model", "google/gemma-3-27b-it")
    page.locator("#plan-contexts textarea").fill(", ".join(str(1024 << i) for i in range(8)))
    pick(page, "plan-budget", "24 GB (RTX 3090/4090, L4, A10)")
    page.click("#plan-run")
    page.wait_for_function("/planned|✖/.test(document.querySelector('#plan-status .kv-line').innerText)")
    page.locator("#plan-plot img").wait_for(state="visible")
    page.screenshot(path=str(ARTIFACTS / "plan-tab.png"), full_page=True)
    page.context.close()


def wait_for_token(page, index: int) -> None:
    page.wait_for_function(f"(document.querySelector('#kvi-step-info') || {{}}).innerText?.includes('Token {index} ')",
                           timeout=LONG_MS)


def take_inspect(browser, url: str) -> None:
    """Inspect opens on a sink cache with a 32-token window: Step, then Step ×10 twice (past the window)."""
    page = open_page(browser, url)
    page.get_by_role("tab", name="Inspect").click()
    page.locator("#kvi-step").wait_for(state="visible")
    page.click("#kvi-step")
    wait_for_token(page, 0)
    for index in (10, 20):
        page.click("#kvi-step10")
        wait_for_token(page, index)
    page.screenshot(path=str(ARTIFACTS / "inspect.png"), full_page=True)
    page.context.close()


def take_inspect_snapkv(browser, url: str) -> None:
    """A link into Inspect on snapkv at token 0 (the prefill compressed the prompt); the strip's first rows."""
    query = {"inspect": 1, "strategy": "snapkv", "compare": "dynamic", "prompt": SNAPKV_PROMPT, "system": "",
             "chat": 1, "steps": 4, "model": "bundled", "step": 0}
    page = open_page(browser, urljoin(url, "?" + urlencode(query)))
    wait_for_token(page, 0)
    strip = page.locator("#kvi-strip")
    strip.scroll_into_view_if_needed()
    box = strip.bounding_box()  # in the viewport; a full-page clip counts from the page's top
    top = box["y"] + page.evaluate("window.scrollY")
    page.screenshot(path=str(ARTIFACTS / "inspect-snapkv.png"), full_page=True,
                    clip={"x": box["x"], "y": top, "width": box["width"], "height": min(box["height"], 420)})
    page.context.close()


def take_diverge(browser, url: str) -> None:
    """The sampling preset run greedy for 12 tokens; its first-divergence link opened as a new tab would."""
    page = open_page(browser, url)
    wait_for_model(page)
    pick(page, "kv-preset", "sampling")
    page.wait_for_function("document.querySelector('#kv-prompt textarea').value.includes('coffee shop')")
    page.locator("#kv-decoding").get_by_text("greedy").click()
    page.locator("#kv-max-new input").fill("12")
    page.click("#kv-run")
    print("diverge run:", wait_for_run(page).splitlines()[0])
    links = page.locator("#kv-summary a[href*='inspect=1']")
    links.first.wait_for(state="attached")
    href = links.first.get_attribute("href")
    inspect = page.context.new_page()
    inspect.set_default_timeout(LONG_MS)
    inspect.goto(urljoin(page.url, href))
    inspect.wait_for_selector("#kvi-step-info")
    step = int(dict(p.split("=", 1) for p in href.split("?", 1)[1].split("&"))["step"])
    wait_for_token(inspect, step)
    inspect.locator("#kvi-diverge-plot img").wait_for(state="visible")
    inspect.screenshot(path=str(ARTIFACTS / "diverge.png"), full_page=True)
    page.context.close()


def take_needle(browser, url: str) -> None:
    page = open_page(browser, url)
    page.get_by_role("tab", name="Needle").click()
    page.locator("#needle-columns textarea").fill("dynamic, sink:window_length=64, quantized:backend=quanto:nbits=4")
    page.locator("#needle-lengths textarea").fill("160, 256")
    page.locator("#needle-depths textarea").fill("0, 0.5, 1")
    page.locator("#needle-run").click()
    page.locator("#needle-status").filter(has_text="finished in").wait_for(timeout=LONG_MS)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(ARTIFACTS / "needle.png"), full_page=True)
    page.context.close()


PICTURES = {"plan-tab": take_plan, "inspect": take_inspect, "inspect-snapkv": take_inspect_snapkv,
            "diverge": take_diverge, "needle": take_needle}
COMPARE = ("screenshot", "native-plots")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[*COMPARE, *PICTURES],
                        help="retake this picture only (repeatable); default: every one")
    parser.add_argument("--quiet-summary-s", type=float, default=QUIET_SUMMARY_S,
                        help="the quickstart's Run -> summary seconds on a quiet machine (default %(default)s)")
    args = parser.parse_args(argv)
    names = set(args.only or [*COMPARE, *PICTURES])
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is not installed (apt-get install chromium); no browser is downloaded", file=sys.stderr)
        return 2
    process, url = start_app(ARTIFACTS / f"app-pictures-{os.getpid()}.log")
    refused = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            lower_browser_priority()
            try:
                takes = [(None, lambda outside: take_compare(browser, url, names, args.quiet_summary_s, outside))] \
                    if names & set(COMPARE) else []
                takes += [(name, lambda outside, take=take: take(browser, url)) for name, take in PICTURES.items()
                          if name in names]
                for name, take in takes:
                    try:
                        wait_for_quiet()
                        outside = OutsideWork()
                        take(outside)
                        if name is not None:
                            keep(ARTIFACTS / f"{name}.png", outside)
                    except Refused as refusal:
                        refused.append(str(refusal))
                        print(f"refused: {refusal}; docs/ keeps the picture it had", file=sys.stderr)
            finally:
                browser.close()
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
    return 3 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
