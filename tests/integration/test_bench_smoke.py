"""`python -m kvlab bench --size smoke` on the real bundled model: the record's shape and the plots (the
tests of the smoke run's record are long checks, left to `make test-slow`; the refusals and SIGTERM run in CI).

Times are never asserted (the machine is shared); only that every section ran,
every figure carries median/min/max and every check carries its target and verdict.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.bench import SECTIONS, format_markdown, format_report, make_check, parse_only, status_of

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 1800
SMOKE_SECTIONS = [name for name in SECTIONS if name != "app"]
"""Every section but `app` (two app launches, a browser and five CLI runs: minutes, not plumbing; its logic has
unit tests in tests/unit/test_bench_app.py)."""
EXPECTED_PLOTS = {"overhead.png", "fair.png", "parallel.png", "scaling_latency.png", "scaling_bytes.png",
                  "startup.png", "roofline.png", "plan.png"}
CHECK_KEYS = {"section", "name", "value", "min", "max", "unit", "target", "met", "reason"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", "--size", "smoke", "--only", ",".join(SMOKE_SECTIONS),
         "--json", str(out / "b.json"),
         "--plots", str(out / "plots"), "--markdown", str(out / "bench.md")],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"record": json.loads((out / "b.json").read_text()), "stdout": proc.stdout, "out": out}


def assert_stats(stats):
    assert {"median", "min", "max", "n", "values"} <= set(stats)
    assert stats["min"] <= stats["median"] <= stats["max"]
    assert stats["n"] == len(stats["values"]) >= 1


@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_every_section_ran_with_checks(smoke):
    record = smoke["record"]
    assert record["kvlab_bench"] == 1 and record["size"]["name"] == "smoke"
    assert {"cpu", "cores_available", "torch", "transformers"} <= set(record["machine"])
    assert set(record["sections"]) == set(SMOKE_SECTIONS)
    for name, section in record["sections"].items():
        assert "error" not in section, f"{name}: {section.get('error')}"
        assert section["checks"], name
        for check in section["checks"]:
            assert set(check) == CHECK_KEYS
            assert check["section"] == name and check["target"]
            assert check["met"] in (True, False, None)
            if check["met"] is False:
                assert check["reason"], check["name"]
    assert len(record["checks"]) == sum(len(s["checks"]) for s in record["sections"].values())


@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_figures_carry_median_min_max(smoke):
    sections = smoke["record"]["sections"]
    for row in sections["overhead"]["rows"]:
        for key in ("bare_tok_s", "kvlab_tok_s", "kvlab_outside_forward_ms_per_token", "ratio"):
            assert_stats(row[key])
    assert len(sections["fair"]["rows"]) == 4
    for row in sections["fair"]["rows"]:
        for key in ("together_ms", "alone_ms", "ratio"):
            assert_stats(row[key])
    assert_stats(sections["parallel"]["ratio"])
    assert_stats(sections["parallel"]["lever_ratio"])
    assert len(sections["parallel"]["lever"]) == 2
    assert {r["mode"] for r in sections["parallel"]["rows"]} == {"parallel", "sequential"}
    scaling = sections["scaling"]
    assert set(scaling["series"]) == {"no_cache", "dynamic", "static", "quantized int4", "quantized int2", "sink 4+252"}
    for series in scaling["series"].values():
        assert len(series["latency_ms"]) == len(series["cache_bytes"]) == len(scaling["lengths"])
        for stats in series["latency_ms"] + series["cache_bytes"]:
            assert_stats(stats)
    assert scaling["series"]["no_cache"]["cache_bytes"][-1]["median"] == 0
    assert_stats(sections["startup"]["second"]["ready_s"])
    assert "skipped" in sections["startup"]["first"]
    for key in ("served_s", "ready_s"):
        assert_stats(sections["startup"]["app_second"][key])
    assert_stats(sections["startup"]["gradio_import_s"])
    assert [c["name"] for c in sections["startup"]["checks"]] == [
        "second launch: process start to model ready", "app.py second launch: start to model ready"]
    roofline = sections["roofline"]
    assert roofline["bandwidth_gb_s"] > 0
    one_thread = [v for v in roofline["variants"] if v["name"] == "dynamic fp32, 1 thread"]
    assert one_thread and one_thread[0]["compute_threads"] == [1]
    for variant in roofline["variants"]:
        assert_stats(variant["tok_s"])
        assert_stats(variant["fraction"])
        assert variant["bound_tok_s"] > 0 and variant["weight_bytes"] > 0
    planning = sections["plan"]
    assert_stats(planning["plan_s"])
    assert planning["first_plan_s"] == planning["plan_s"]["values"][0] and planning["warm_up_s"] > 0
    assert (len(planning["strategies"]), len(planning["contexts"])) == (6, 5)
    assert [c["unit"] for c in planning["checks"]] == ["s", "s", "s", "s", "MB"]
    assert planning["rss_peak_extra_bytes"] >= 0


@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_plots_and_text(smoke):
    plots = smoke["out"] / "plots"
    assert {p.name for p in plots.glob("*.png")} >= EXPECTED_PLOTS
    for name in EXPECTED_PLOTS:
        assert (plots / name).stat().st_size > 1000
    assert "median [min–max]" in smoke["stdout"] and "target" in smoke["stdout"]
    assert smoke["stdout"].strip() == format_report(smoke["record"]).strip()
    markdown = (smoke["out"] / "bench.md").read_text()
    assert markdown == format_markdown(smoke["record"])
    command = f"python -m kvlab bench --size smoke --only {','.join(SMOKE_SECTIONS)}"
    assert smoke["record"]["command"] == command
    assert f"with `{command}` on" in markdown
    assert markdown.count("\n| ") == len(smoke["record"]["checks"]) + 1


def test_only_lists_allowed_sections():
    assert parse_only("roofline,overhead") == ["overhead", "roofline"]
    assert parse_only(None) == list(SECTIONS)
    with pytest.raises(ValueError, match="allowed: overhead,fair"):
        parse_only("overhead,speed")
    with pytest.raises(ValueError, match="allowed: overhead,fair"):
        parse_only("")


def test_check_verdicts():
    met = make_check("s", "n", [0.99, 1.0, 1.02], "≥ 0.98", lambda v: v >= 0.98, "why")
    assert (met["value"], met["min"], met["max"], met["met"], met["reason"]) == (1.0, 0.99, 1.02, True, "")
    assert status_of(met) == "met"
    missed = make_check("s", "n", [0.5, 0.9], "≥ 0.98", lambda v: v >= 0.98, "runner work")
    assert missed["met"] is False and status_of(missed) == "MISSED (runner work)"
    assert status_of(make_check("s", "n", [0.3], "report", None, "r")) == "reported"
    assert status_of(make_check("s", "n", [], "flat", None, "needs longer runs")) == "n/a (needs longer runs)"


def test_bandwidth_floor_joins_a_missed_parallel_check():
    from kvlab.bench import add_bandwidth_floor

    def sections(parallel_ratio):
        check = make_check("parallel", "p", [parallel_ratio], "≤ 0.7", lambda v: v <= 0.7, "cores busy")
        roofline = {"variants": [{"fraction": {"median": 0.8}}], "checks": []}
        return {"parallel": {"checks": [check]}, "roofline": roofline}

    missed = sections(0.95)
    add_bandwidth_floor(missed)
    assert missed["parallel"]["bandwidth_floor"] == 0.8
    assert missed["parallel"]["checks"][0]["reason"].startswith("cores busy. One column alone already decodes at 0.80")
    met = sections(0.6)
    add_bandwidth_floor(met)
    assert "bandwidth_floor" not in met["parallel"] and met["parallel"]["checks"][0]["reason"] == ""
    alone = {"parallel": sections(0.95)["parallel"]}
    add_bandwidth_floor(alone)
    assert "bandwidth_floor" not in alone["parallel"]


def test_unwritable_outputs_are_refused_before_measuring(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for extra in (["--json", str(blocker / "b.json")], ["--plots", str(blocker)], ["--markdown", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "kvlab", "bench", "--size", "smoke", "--only", "overhead",
                               "--json", str(tmp_path / "ok.json"), "--plots", str(tmp_path / "plots"), *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, extra
        assert "cannot write the results where asked" in proc.stderr and "nothing was measured" in proc.stderr
        assert "[bench]" not in proc.stderr
    assert not (tmp_path / "ok.json").exists()


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_sigterm_stops_the_app_child_and_removes_temp_folders(tmp_path):
    import os
    import signal
    import time

    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "bench", "--size", "smoke", "--only", "startup",
                             "--json", str(tmp_path / "b.json"), "--plots", str(tmp_path / "plots")],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "app.py second launch" in line:
                break
        time.sleep(2)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children, "the bench should be running app.py now"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        for pid in children:
            deadline = time.time() + 20
            while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
                time.sleep(0.2)
            assert not os.path.exists(f"/proc/{pid}"), f"app.py child {pid} still running"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not list(tmp_path.glob("kvlab-bench-*"))
