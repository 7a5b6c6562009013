"""The bench's app section from synthetic run records: ratios per column, the CLI reference, rank flips
beyond noise, the checks and the report lines (no app, browser or model is started here)."""

from benchmarks.app_section import RUNS, app_section, rank_flips
from benchmarks.app_text import app_lines
from kvlab.bench.harness import SIZES, Context
from kvlab.bench.text import status_of


def record(rates: dict, noise: float = 0.01, busy: bool = False) -> dict:
    """A run record with one ok column per name (decode tok/s given, TTFT 0.1 s, live at 80 %: re-timed)."""
    columns = [{"name": name, "status": "ok", "decode_tok_s": rate, "ttft_s": 0.1,
                "timing": {"policy": "quiet", "live": {"decode_tok_s": 0.8 * rate, "ttft_s": 0.12},
                           "noise": {"decode_tok_s": noise}}} for name, rate in rates.items()]
    columns.append({"name": "offloaded", "status": "unavailable", "decode_tok_s": None})
    timing = {"load_average": 1.0, "busy": busy, "note": "⚠ busy" if busy else ""}
    return {"columns": columns, "timing": timing}


CLI = {"dynamic": 25.0, "static": 24.8, "no_cache": 10.0}


def section(api_rates, browser):
    ctx = Context(None, SIZES["smoke"], None, lambda message: None, None)
    return app_section(ctx, [record(CLI), record(CLI)], [record(api_rates), record(api_rates)], browser)


def test_ratios_against_the_cli_and_checks_met():
    s = section({"dynamic": 24.5, "static": 24.9, "no_cache": 9.9}, [record(CLI), record(CLI)])
    first = s["paths"]["api"]["first"]
    by_name = {c["column"]: c for c in first["columns"]}
    assert set(by_name) == {"dynamic", "static", "no_cache"}
    assert by_name["dynamic"]["decode_ratio"] == 24.5 / 25.0 and by_name["dynamic"]["ttft_ratio"] == 1.0
    assert by_name["dynamic"]["live_decode_ratio"] == 0.8 * 24.5 / 25.0
    assert first["raw_flips"] == [["dynamic", "static"]] and first["flips"] == []  # within noise: no flip
    assert [c["met"] for c in s["checks"]] == [True] * (2 * len(RUNS)) + [True]
    assert "on this machine" in s["browser_here"]
    text = "\n".join(app_lines(s))
    assert "api, first run after start" in text and "rank flips: dynamic vs static (0 beyond noise)" in text


def test_a_slow_column_misses_its_target_and_a_flip_within_the_clis_noise_is_not_counted():
    s = section({"dynamic": 20.0, "static": 24.8, "no_cache": 10.0}, [record(CLI), record(CLI)])
    checks = {c["name"]: c for c in s["checks"]}
    api_first = checks["api, first run after start: app / CLI decode tok/s (lowest column)"]
    assert api_first["met"] is False and api_first["value"] == 0.8 and "dynamic: 0.80" in api_first["reason"]
    assert s["paths"]["api"]["first"]["raw_flips"] == [["dynamic", "static"]]  # the CLI cannot tell them apart
    assert checks["rank flips beyond noise (decode tok/s, every app run)"]["value"] == 0


def test_a_missing_browser_is_not_judged():
    s = section(CLI, "Playwright is not installed")
    browser = [c for c in s["checks"] if c["name"].startswith("browser")]
    assert len(browser) == len(RUNS) and all(status_of(c) == "n/a (Playwright is not installed)" for c in browser)
    assert "browser: skipped: Playwright is not installed" in "\n".join(app_lines(s))


def test_each_app_run_is_judged_against_the_cli_runs_just_before_and_after_it():
    ctx = Context(None, SIZES["smoke"], None, lambda message: None, None)

    def at(speed):  # the machine's speed when a run ran: every column scales with it
        return {name: rate * speed for name, rate in CLI.items()}

    # CLI, API first, CLI, API later, CLI, browser first, CLI, browser later, CLI: the machine slows down as
    # it goes, and each app run ran at the speed between its two CLI runs
    cli = [record(at(speed)) for speed in (1.0, 1.0, 0.8, 0.8, 0.6)]
    s = app_section(ctx, cli, [record(at(1.0)), record(at(0.9))], [record(at(0.8)), record(at(0.7))])
    for path, run, speed in (("api", "first", 1.0), ("api", "later", 0.9), ("browser", "first", 0.8),
                             ("browser", "later", 0.7)):
        dynamic = {c["column"]: c for c in s["paths"][path][run]["columns"]}["dynamic"]
        assert round(dynamic["cli_decode_tok_s"], 6) == round(25.0 * speed, 6), (path, run)
        assert round(dynamic["decode_ratio"], 6) == 1.0, (path, run)
        assert round(s["cli"][path][run]["dynamic"]["decode_tok_s"], 6) == round(25.0 * speed, 6)
    assert all(c["met"] for c in s["checks"]) and s["cli_runs"] == 5
    assert sorted(round(r, 2) for r in s["cli_repeat_decode_ratio"]) == [0.75] * 3 + [0.8] * 3 + [1.0] * 6
    assert "the mean of the CLI runs just before and just after each app run" in "\n".join(app_lines(s))


def test_without_the_browser_the_api_runs_take_the_three_cli_runs_in_order():
    ctx = Context(None, SIZES["smoke"], None, lambda message: None, None)
    slower = {name: rate * 0.8 for name, rate in CLI.items()}
    s = app_section(ctx, [record(CLI), record(CLI), record(slower)], [record(CLI), record(slower)],
                    "Playwright is not installed")
    first = {c["column"]: c for c in s["paths"]["api"]["first"]["columns"]}["dynamic"]
    later = {c["column"]: c for c in s["paths"]["api"]["later"]["columns"]}["dynamic"]
    assert first["decode_ratio"] == 1.0 and later["cli_decode_tok_s"] == 0.9 * 25.0
    assert set(s["cli"]) == {"api"} and s["paths"]["browser"] == {"skipped": "Playwright is not installed"}


def test_a_column_the_app_did_not_time_is_a_miss_and_each_path_keeps_its_own_reference():
    ctx = Context(None, SIZES["smoke"], None, lambda message: None, None)
    failed = record({"dynamic": 25.0, "no_cache": 10.0})
    failed["columns"].insert(1, {"name": "static", "status": "error", "decode_tok_s": None})
    s = app_section(ctx, [record(CLI)] * 3, [failed, record(CLI)], [record(CLI)] * 2)
    checks = {c["name"]: c for c in s["checks"]}
    first = checks["api, first run after start: app / CLI decode tok/s (lowest column)"]
    assert first["met"] is False and first["value"] == 0.0
    assert "static: no figures in the app run (error)" in first["reason"]
    assert checks["api, later run after start: app / CLI decode tok/s (lowest column)"]["met"] is True
    assert set(s["cli"]) == {"api", "browser"} and s["cli"]["api"]["first"]["static"]["decode_tok_s"] == 24.8
    assert "static                       no figures in the app run (error)" in "\n".join(app_lines(s))


def test_rank_flips_need_both_sides_beyond_noise():
    def figs(rates, noise):
        return {name: {"decode_tok_s": rate, "noise": {"decode_tok_s": noise}} for name, rate in rates.items()}

    raw, beyond = rank_flips(figs({"a": 20.0, "b": 25.0}, 0.01), figs({"a": 25.0, "b": 20.0}, 0.01))
    assert raw == beyond == [["a", "b"]]
    raw, beyond = rank_flips(figs({"a": 20.0, "b": 25.0}, 0.2), figs({"a": 25.0, "b": 20.0}, 0.01))
    assert raw == [["a", "b"]] and beyond == []


def test_each_run_carries_who_used_the_cores_and_the_report_says_it():
    ctx = Context(None, SIZES["smoke"], None, lambda message: None, None)
    cpu = {"api first": {"app": 1.9, "browser": 0.0, "bench": 0.01, "rest": 0.02, "wall_s": 30.0},
           "browser later": {"app": 1.8, "browser": 0.05, "bench": 0.01, "rest": 0.1, "wall_s": 31.0},
           "cli between browser": {"app": 0.02, "browser": 0.003, "bench": 1.9, "rest": 0.01, "wall_s": 20.0}}
    s = app_section(ctx, [record(CLI)] * 5, [record(CLI)] * 2, [record(CLI)] * 2, cpu)
    assert s["paths"]["api"]["first"]["cpu"] == cpu["api first"]
    assert s["paths"]["browser"]["later"]["cpu"] == cpu["browser later"]
    assert "cpu" not in s["paths"]["api"]["later"]  # not sampled: nothing made up
    assert s["between_cpu"] == {"browser": cpu["cli between browser"]}
    text = "\n".join(app_lines(s))
    assert "cores used during the run (31 s): app 1.8, browser 0.05, bench 0.01, rest of the machine 0.1" in text
    assert "the CLI run between the two (20 s) shared the cores with the idle app 0.02 and browser 0.003" in text


def test_cpu_shares_count_the_app_tree_under_the_current_label_only():
    import subprocess
    import sys
    import time

    from benchmarks.cpu_share import KINDS, CpuShares

    spin = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
    with CpuShares(sample_s=0.1) as cpu:
        app = subprocess.Popen([sys.executable, "-c", spin])
        cpu.app_pid = app.pid
        cpu.mark("api first")
        app.wait()
        time.sleep(0.3)  # a sample after the spin ended
        cpu.mark(None)
        idle = subprocess.Popen([sys.executable, "-c", spin])  # counted under no label
        idle.wait()
    shares = cpu.shares
    assert set(shares) == {"api first"}
    first = shares["api first"]
    assert set(first) == {*KINDS, "wall_s"} and first["wall_s"] > 0
    # the spinning child used about 0.6 s of CPU; a process that ends between samples loses at most its last one
    assert first["app"] * first["wall_s"] > 0.3 and first["browser"] == 0.0
    assert first["app"] > first["bench"]


def test_warm_section_reports_first_over_second_run_and_what_the_first_paid(monkeypatch):
    import gradio_client

    from benchmarks import warm_section

    summaries = iter([10.0, 8.0, 9.0, 9.0])
    warm_ups = iter([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])

    class FakeApp:
        url = "http://127.0.0.1:1/"

        def __init__(self, say):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    class FakeClient:
        def __init__(self, url, verbose=False):
            pass

        def predict(self, preset, prompt, tokens, api_name):
            assert (preset, api_name) == ("quickstart", "/compare")
            return {"summary_s": next(summaries),
                    "columns": [{"timing": {"warm_up_s": s}} for s in next(warm_ups)]}

    monkeypatch.setattr(warm_section, "RunningApp", FakeApp)
    monkeypatch.setattr(gradio_client, "Client", FakeClient)
    ctx = Context(None, SIZES["small"], None, lambda message: None, None)
    s = warm_section.bench_warm(ctx)
    assert [app["summary_ratio"] for app in s["apps"]] == [1.25, 1.0]
    check = s["checks"][0]
    assert check["value"] == 1.125 and check["met"] is False
    assert check["reason"] == "the first Runs paid 2.0 s of one-time set-up"
    text = "\n".join(warm_section.warm_lines(s))
    assert "Run -> summary 10 s / 8 s = 1.25" in text and "first Run's warm-up 2 s" in text
