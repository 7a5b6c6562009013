"""App section: the quickstart preset through the running app, its API and a headless browser, against the CLI.

In one bench run, every app run between two CLI fair runs of the preset
(`python -m kvlab compare --preset quickstart --json F`, a fresh process each):
CLI, then `python app.py` launched as a user would (free port,
`KVLAB_READY_FILE`, see `kvlab.models.readiness`) and run through its `/compare` API
with gradio_client (the first run after start), CLI, the API again (a later
run), and with that app stopped, CLI; then a second fresh app run from
headless Chromium (`benchmarks.app_browser`: click Run, read the JSON
export), CLI, the browser again, and with the app and browser stopped, CLI.
Each app run's reference is the mean of the CLI runs just before and just
after it, per column, so a machine whose speed drifts (another tenant's load:
up to 14 % from one CLI run to the next here) moves the reference with the
app run it judges. The CLI run between an app's two runs shares the machine
with that app, and for the browser path with its open page, both idle; the
record says how much of the cores they used meanwhile (`between_cpu`). The
CLI runs' own spread (`cli_repeat_decode_ratio`) is the run's noise floor
(`benchmarks.cpu_share` records who used the cores during each app run: the
app, the browser, the bench, the rest of the machine). Per column and per run it reports app / CLI of decode
tok/s and of TTFT (the summary's figures, as the record's timing policy took them), the
live figures beside them, and rank flips (two columns ordered oppositely by
decode tok/s although both the app and the CLI tell them apart beyond their
noise, `kvlab.compare.summary.within_noise`). The browser runs on this machine, on the
same cores as the app; the record says so. Every child is stopped in
`finally`. This module measures and builds the record; it prints and draws
nothing.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvlab.bench.harness import Context, make_check
from kvlab.bench.startup import _keep_tail, _stop, _wait_for_app, child_env, free_port
from kvlab.compare.summary import within_noise
from kvlab.models.readiness import READY_FILE_ENV

from .cpu_share import CpuShares

PRESET = "quickstart"
RATIO_TARGET = 0.95
"""app / CLI decode tok/s each column must reach, on both paths, first run and later run."""
CLI_TIMEOUT_S = 1800
API_TIMEOUT_S = 1800
RUNS = ("first", "later")
SEQUENCE = tuple((path, run) for path in ("api", "browser") for run in RUNS)
"""The app runs in the order they run; the CLI runs sit before, between and after them."""
BROWSER_HERE = "the browser ran on this machine, sharing its cores with the app (no browser elsewhere was measured)"


def new_tokens_for(ctx: Context) -> int | None:
    """Tokens per column: the preset's own (None) at full size, the size's `new_tokens` otherwise."""
    return None if ctx.size.name == "full" else ctx.size.new_tokens


def cli_run(ctx: Context, folder: Path, label: str) -> dict:
    """One `python -m kvlab compare --preset quickstart --json F` in a fresh process; its JSON record.

    Raises:
        RuntimeError: the command failed (its last stderr lines in the message).
    """
    from kvlab.models.loading import cache_dir

    env, root = child_env(cache_dir())
    out = folder / f"cli-{len(list(folder.glob('cli-*.json')))}.json"
    tokens = new_tokens_for(ctx)
    command = [sys.executable, "-m", "kvlab", "compare", "--preset", PRESET, "--json", str(out)]
    command += ["--max-new-tokens", str(tokens)] if tokens else []
    ctx.say(f"app: CLI fair run ({label})")
    proc = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the CLI run failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(out.read_text())


class RunningApp:
    """`python app.py` on a free port with a ready file, as a context manager: `url` once its page answers and
    its model is ready; stopped (and its folder removed) on exit."""

    def __init__(self, say):
        self.say, self.proc, self.folder, self.tail, self.reader = say, None, None, [], None

    def __enter__(self) -> "RunningApp":
        from kvlab.models.loading import cache_dir

        env, root = child_env(cache_dir())
        port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="kvlab-bench-"))
        env["GRADIO_SERVER_PORT"], env[READY_FILE_ENV] = str(port), str(self.folder / "ready.jsonl")
        env["GRADIO_ANALYTICS_ENABLED"] = "False"
        self.say("app: starting app.py")
        started = time.time()
        try:
            self.proc = subprocess.Popen([sys.executable, "app.py"], env=env, cwd=root, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
            self.reader = threading.Thread(target=_keep_tail, args=(self.proc.stderr, self.tail), daemon=True)
            self.reader.start()
            self.marks = _wait_for_app(self.proc, port, self.folder / "ready.jsonl", started, self.tail)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.url = f"http://127.0.0.1:{port}/"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            _stop(self.proc)
        if self.reader is not None:
            self.reader.join(timeout=5)
        shutil.rmtree(self.folder, ignore_errors=True)


def api_runs(ctx: Context, cpu: CpuShares, between=lambda: None) -> list[dict]:
    """The preset through a fresh app's `/compare` API, twice (first run after start, later run); the records.
    `cpu` counts each run under `api <run>`; `between()` runs between the two, the app up and idle."""
    from gradio_client import Client

    with RunningApp(ctx.say) as app:
        cpu.app_pid = app.proc.pid
        client = Client(app.url, verbose=False)
        records = []
        try:
            for i, run in enumerate(RUNS):
                if i:
                    between()
                ctx.say(f"app: API run ({run} after start)")
                cpu.mark(f"api {run}")
                records.append(client.predict(PRESET, None, new_tokens_for(ctx), api_name="/compare"))
                cpu.mark(None)
        finally:
            cpu.mark(None)
        return records


def browser_runs(ctx: Context, cpu: CpuShares, between=lambda: None) -> list[dict] | str:
    """The preset run twice from headless Chromium on a fresh app; the JSON records it exported, or why the
    browser could not run here or failed (a string). `cpu` counts each run under `browser <run>`; `between()`
    runs between the two, the app up and the page open, both idle."""
    from .app_browser import browser_problem, run_in_browser

    problem = browser_problem()
    if problem:
        return problem
    try:
        with RunningApp(ctx.say) as app:
            cpu.app_pid = app.proc.pid
            try:
                return run_in_browser(app.url, len(RUNS), new_tokens_for(ctx), ctx.say,
                                      mark=lambda i: cpu.mark(None if i is None else f"browser {RUNS[i]}"),
                                      between=between)
            finally:
                cpu.mark(None)
    except Exception as err:  # noqa: BLE001 - the API path's figures stay; the browser's failure is its reason
        return f"the browser path failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"


def figures(record: dict) -> dict[str, dict]:
    """Column name -> its figures (decode tok/s, TTFT in s, the live ones: the same under the `live` timing
    policy, the noise) for the ok columns of a version-3 record."""
    timing = {c["name"]: c.get("timing") or {} for c in record["columns"]}
    return {c["name"]: {"decode_tok_s": c.get("decode_tok_s"), "ttft_s": c.get("ttft_s"),
                        "live_decode_tok_s": (timing[c["name"]].get("live") or c).get("decode_tok_s"),
                        "live_ttft_s": (timing[c["name"]].get("live") or c).get("ttft_s"),
                        "noise": timing[c["name"]].get("noise") or {}}
            for c in record["columns"] if c.get("status") == "ok" and c.get("decode_tok_s")}


def mean_figures(records: list[dict]) -> dict[str, dict]:
    """Per column, the mean of each figure over `records` (the CLI runs), the largest noise."""
    runs = [figures(record) for record in records]
    names = [name for name in runs[0] if all(name in run for run in runs)]
    out = {}
    for name in names:
        values = [run[name] for run in runs]
        out[name] = {key: statistics.mean(v[key] for v in values) if all(v[key] for v in values) else None
                     for key in ("decode_tok_s", "ttft_s", "live_decode_tok_s", "live_ttft_s")}
        out[name]["noise"] = {k: max(v["noise"].get(k, 0.0) for v in values) for k in ("decode_tok_s", "ttft_s")}
    return out


def _ratio(a, b):
    return a / b if a and b else None


def rank_flips(app: dict[str, dict], cli: dict[str, dict]) -> tuple[list[list[str]], list[list[str]]]:
    """(pairs ordered oppositely by decode tok/s, those of them that both sides tell apart beyond noise)."""
    names = [name for name in cli if name in app]
    rows = {side: [{"decode_tok_s": figs[n]["decode_tok_s"], "noise": figs[n]["noise"]} for n in names]
            for side, figs in (("app", app), ("cli", cli))}
    raw, beyond = [], []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a = rows["app"][i]["decode_tok_s"] - rows["app"][j]["decode_tok_s"]
            c = rows["cli"][i]["decode_tok_s"] - rows["cli"][j]["decode_tok_s"]
            if a * c < 0:
                raw.append([names[i], names[j]])
                if not within_noise(rows["app"], "decode_tok_s", i, j) and \
                        not within_noise(rows["cli"], "decode_tok_s", i, j):
                    beyond.append([names[i], names[j]])
    return raw, beyond


def compare_to_cli(record: dict, cli: dict[str, dict]) -> dict:
    """One app run against the CLI reference: per column ratios (decode tok/s, TTFT, live decode), the flips,
    and the app run's own timing record."""
    app = figures(record)
    statuses = {c["name"]: c.get("status") for c in record["columns"]}
    columns = []
    for name, ref in cli.items():
        mine = app.get(name)
        if mine is None:  # the CLI timed it, the app did not: `app_status` marks it, judged a miss (`app_checks`)
            columns.append({"column": name, "app_status": statuses.get(name, "missing"), "decode_ratio": None,
                            "cli_decode_tok_s": ref["decode_tok_s"]})
            continue
        columns.append({"column": name, "app_decode_tok_s": mine["decode_tok_s"], "cli_decode_tok_s": ref["decode_tok_s"],
                        "decode_ratio": _ratio(mine["decode_tok_s"], ref["decode_tok_s"]),
                        "app_ttft_s": mine["ttft_s"], "cli_ttft_s": ref["ttft_s"],
                        "ttft_ratio": _ratio(mine["ttft_s"], ref["ttft_s"]),
                        "app_live_decode_tok_s": mine["live_decode_tok_s"],
                        "live_decode_ratio": _ratio(mine["live_decode_tok_s"], ref["decode_tok_s"]),
                        "live_ttft_ratio": _ratio(mine["live_ttft_s"], ref["ttft_s"])})
    raw, beyond = rank_flips(app, cli)
    return {"columns": columns, "raw_flips": raw, "flips": beyond, "timing": record.get("timing") or {}}


def bench_app(ctx: Context) -> dict:
    """The app section's record: the CLI runs, each app run against the CLI runs around it, the checks."""
    folder = Path(tempfile.mkdtemp(prefix="kvlab-bench-"))
    cli_records: list[dict] = []

    def cli(label: str, cpu: CpuShares | None = None, share: str | None = None) -> None:
        if cpu is not None:
            cpu.mark(share)
        try:
            cli_records.append(cli_run(ctx, folder, label))
        finally:
            if cpu is not None:
                cpu.mark(None)

    try:
        with CpuShares() as cpu:
            cli("before the API runs")
            api = api_runs(ctx, cpu, between=lambda: cli("between the two API runs", cpu, "cli between api"))
            cli("between the API and browser runs")
            before_browser = len(cli_records)
            browser = browser_runs(ctx, cpu, between=lambda: cli("between the two browser runs", cpu,
                                                                  "cli between browser"))
            if isinstance(browser, str):  # a skipped or failed browser path needs no reference of its own
                del cli_records[before_browser:]
            else:
                cli("after the browser runs")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return app_section(ctx, cli_records, api, browser, cpu.shares)


def references(cli_records: list[dict], runs: int) -> list[dict[str, dict]]:
    """The CLI reference of each of the first `runs` app runs of SEQUENCE: app run k ran between CLI runs k
    and k + 1, so its reference is their mean; when there are not that many CLI runs (a record built from
    fewer), every app run's reference is the mean of all of them."""
    if len(cli_records) >= runs + 1:
        return [mean_figures(cli_records[k:k + 2]) for k in range(runs)]
    return [mean_figures(cli_records)] * runs


def app_section(ctx: Context, cli_records: list[dict], api: list[dict], browser: list[dict] | str,
                cpu: dict[str, dict] | None = None) -> dict:
    """The record from the runs' JSON records (a string for `browser`: why it did not run). `cli_records`: the
    CLI runs in the order they ran, one before, between and after the app runs of SEQUENCE (5, or 3 without
    the browser path): each app run is judged against the mean of the two around it (`references`). The
    record's `cli` holds each run's reference (`cli[path][run]`). `cpu` (`CpuShares.shares`, labels
    `<path> <run>` and `cli between <path>`) goes to each run's `cpu` (who used the cores while it ran) and to
    `between_cpu[path]` (while the CLI ran between that path's two runs)."""
    records = {("api", run): record for run, record in zip(RUNS, api)}
    if not isinstance(browser, str):
        records.update({("browser", run): record for run, record in zip(RUNS, browser)})
    order = [key for key in SEQUENCE if key in records]
    refs = dict(zip(order, references(cli_records, len(order))))
    repeat = [_ratio(b[name]["decode_tok_s"], a[name]["decode_tok_s"])
              for a, b in zip(map(figures, cli_records), map(figures, cli_records[1:])) for name in a if name in b]
    paths: dict[str, dict] = {"api": {}, "browser": {"skipped": browser} if isinstance(browser, str) else {}}
    for path, run in order:
        comparison = compare_to_cli(records[path, run], refs[path, run])
        if (cpu or {}).get(f"{path} {run}"):
            comparison["cpu"] = cpu[f"{path} {run}"]
        paths[path][run] = comparison
    cli: dict[str, dict] = {}
    for (path, run), ref in refs.items():
        cli.setdefault(path, {})[run] = {name: {k: v for k, v in figs.items() if k != "noise"}
                                         for name, figs in ref.items()}
    between = {path: (cpu or {})[f"cli between {path}"] for path in ("api", "browser")
               if (cpu or {}).get(f"cli between {path}")}
    return {"preset": PRESET, "new_tokens": new_tokens_for(ctx), "browser_here": BROWSER_HERE,
            "cli": cli, "cli_runs": len(cli_records), "between_cpu": between,
            "cli_repeat_decode_ratio": [r for r in repeat if r is not None],
            "cli_timing": [record.get("timing") or {} for record in cli_records],
            "paths": paths, "checks": app_checks(paths)}


def app_checks(paths: dict) -> list[dict]:
    """Per path and run: the lowest column's app / CLI decode tok/s against RATIO_TARGET (a column the CLI timed
    but the app run has no figures for counts as 0: a miss); then rank flips."""
    checks, flips = [], 0
    for path, runs in paths.items():
        for run in RUNS:
            name = f"{path}, {run} run after start: app / CLI decode tok/s (lowest column)"
            if "skipped" in runs:
                checks.append(make_check("app", name, [], f"≥ {RATIO_TARGET}", None, runs["skipped"]))
                continue
            comparison = runs[run]
            ratios = [c["decode_ratio"] for c in comparison["columns"] if c["decode_ratio"] is not None]
            flips += len(comparison["flips"])
            missing = [c for c in comparison["columns"] if "app_status" in c]
            if missing:
                reason = "; ".join(f"{c['column']}: no figures in the app run ({c['app_status']})" for c in missing)
            else:
                lowest = min(comparison["columns"], key=lambda c: c["decode_ratio"], default=None)
                reason = f"{lowest['column']}: {lowest['decode_ratio']:.2f}" if lowest else "no column to compare"
            reason += f"; {comparison['timing']['note']}" if comparison["timing"].get("note") else ""
            value = 0.0 if missing else (min(ratios) if ratios else None)
            checks.append(make_check("app", name, ratios, f"≥ {RATIO_TARGET}", lambda v: v >= RATIO_TARGET,
                                     reason, value=value))
    checks.append(make_check("app", "rank flips beyond noise (decode tok/s, every app run)", [], "0",
                             lambda v: v == 0, "columns ordered against the CLI", unit="count", value=flips))
    return checks
