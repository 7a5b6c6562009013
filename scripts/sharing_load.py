"""Six API clients and one browser page on one app at once: the figures behind docs/spaces.md's bound.

Starts `app.py` (KVLAB_PROXY_HOPS=1, so each `gradio_client` client is its own visitor by its
`X-Forwarded-For` address, as on a Space), lets six clients loop the `quickstart` preset through the `/compare`
API, then opens the app in headless Chromium and presses Run on the page's own quickstart. Prints, as one JSON
object: the page's wait (click to "running", seconds), the position and wait its status line showed, the API
runs' durations, the step rate they give, the bound (one run of KVLAB_MAX_RUN_STEPS token steps at that rate),
and the load average before and during the run (the app's busy rule reads the same figure).

Usage: `.venv/bin/python scripts/sharing_load.py [--tokens 64] [--settle-s 3600]`. Needs the test set-up
(`make setup-test`: gradio_client, Playwright) and Debian's chromium at /usr/bin/chromium. Takes a few minutes.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
CLIENTS = 6
STATUS_JS = "document.querySelector('#kv-run-status').innerText"
DEFAULT_RUN_STEPS = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(port: int, log) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False",
           "KVLAB_PROXY_HOPS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "app.py"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
            return process
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"sharing_load: the app exited ({process.returncode}); see {log.name}")
            time.sleep(1)
    process.terminate()
    raise SystemExit("sharing_load: the app did not serve within 300 s")


def client_loop(url: str, index: int, tokens: int, stop: threading.Event, runs: list) -> None:
    """Run the quickstart again and again until `stop`; a run in flight then is cancelled, not waited for."""
    from gradio_client import Client

    client = Client(url, verbose=False, headers={"X-Forwarded-For": f"10.0.0.{index + 1}"})
    try:
        while not stop.is_set():
            began = time.monotonic()
            job = client.submit("quickstart", None, tokens, api_name="/compare")
            while not job.done() and not stop.is_set():
                time.sleep(0.5)
            if not job.done():
                job.cancel()
                break
            job.result()
            runs.append({"client": index, "began": began, "ended": time.monotonic()})
            log(f"client {index}: a run took {runs[-1]['ended'] - began:.1f} s")
    except Exception as err:  # noqa: BLE001 - the script reports what a client met and goes on
        runs.append({"client": index, "error": str(err).splitlines()[0][:200]})
    finally:
        client.close()


def log(line: str) -> None:
    print(f"sharing_load: {line}", file=sys.stderr, flush=True)


def page_run(url: str) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
        page.set_default_timeout(300_000)
        page.goto(url)
        page.wait_for_selector("#kv-run")
        page.wait_for_function("(document.querySelector('#kv-model-status')?.innerText || '').includes('ready')",
                               timeout=300_000)
        page.locator("#kv-run:not([disabled])").wait_for()
        clicked = time.monotonic()
        page.click("#kv-run")
        log("the page pressed Run")
        shown = []
        while time.monotonic() - clicked < 1800:
            status = page.evaluate(STATUS_JS)
            if status.startswith("waiting") and status not in shown:
                shown.append(status.strip())
            if status.startswith(("running", "finished", "summary ready", "✖")):
                break
            time.sleep(0.2)
        started = time.monotonic()
        log(f"the page's run started after {started - clicked:.1f} s")
        browser.close()
    return {"wait_s": round(started - clicked, 1), "clicked": clicked, "status_lines": shown[:3],
            "started_as": status.split("\n")[0][:80]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per column in each API run")
    parser.add_argument("--settle-s", type=float, default=3600.0,
                        help="the page presses Run once every client has had a run (so each has used the model, as "
                             "steady API traffic has), or after this many seconds")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    load_before = os.getloadavg()[0]
    with tempfile.NamedTemporaryFile("w", prefix="kvlab-sharing-", suffix=".log", delete=False) as log:
        app = start_app(port, log)
        stop, runs = threading.Event(), []
        threads = [threading.Thread(target=client_loop, args=(url, i, args.tokens, stop, runs), daemon=True)
                   for i in range(CLIENTS)]
        try:
            for thread in threads:
                thread.start()
            settle_until = time.monotonic() + args.settle_s
            while len({r["client"] for r in runs}) < CLIENTS and time.monotonic() < settle_until:
                time.sleep(1)
            page = page_run(url)
            load_during = os.getloadavg()[0]
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            app.terminate()
            app.wait(timeout=30)
    done = [r for r in runs if "ended" in r]
    durations = [r["ended"] - r["began"] for r in done]
    ends = sorted(r["ended"] for r in done)
    service = [later - earlier for earlier, later in zip(ends, ends[1:])]  # one slot: runs end one after another
    steps_per_run = 6 * args.tokens  # the quickstart's six columns
    step_s = statistics.median(service) / steps_per_run if service else float("nan")
    run_steps = int(os.environ.get("KVLAB_MAX_RUN_STEPS") or DEFAULT_RUN_STEPS)
    print(json.dumps({
        "clients": CLIENTS, "api_runs": len(done), "api_errors": [r["error"] for r in runs if "error" in r],
        "api_run_s": {"median": round(statistics.median(durations), 1), "max": round(max(durations), 1)}
        if durations else None,
        "api_service_s": {"median": round(statistics.median(service), 1), "max": round(max(service), 1)}
        if service else None,
        "page": {k: v for k, v in page.items() if k != "clicked"},
        "bound_s": round(step_s * run_steps, 1), "bound_rule": f"one run of {run_steps} token steps",
        "load_1min": {"before": round(load_before, 2), "during": round(load_during, 2)},
        "cores": os.cpu_count(),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
