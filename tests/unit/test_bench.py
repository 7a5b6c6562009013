"""The bench's pieces without the real model: strategies from the registry (`--strategies`), the overhead
section on a tiny random Llama, scaling checks with a replaced strategy set, the app's ready-file polling and
the import-time child. Structure only: no test looks at how long anything took."""

import argparse
import dataclasses
import http.server
import json
import threading
from dataclasses import dataclass

import pytest
import torch

from kvlab.models import readiness
from kvlab.bench import SECTIONS, cli, harness, strategy_sets
from kvlab.bench.harness import SIZES, Context
from kvlab.bench.sides import bare_generate
from kvlab.bench.overhead import bench_overhead
from kvlab.bench.scaling import ScalingFigures, scaling_checks
from kvlab.bench.suite import RUNNERS
from kvlab.bench.text import status_of
from kvlab.strategies import STRATEGIES, register
from kvlab.strategies.dynamic import Dynamic

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404]])
STATS_KEYS = {"median", "min", "max", "n", "values"}
THROWAWAY = "bench_throwaway"


@pytest.fixture
def throwaway():
    """A strategy registered for one test only: dynamic with one extra knob and its own label."""

    @dataclass
    class Throwaway(Dynamic):
        name = THROWAWAY
        summary = "A dynamic cache under another name, registered by a test."
        note: int = 0

        def describe(self) -> str:
            return self.label or f"throwaway {self.note}"

    register(Throwaway)
    try:
        yield Throwaway
    finally:
        STRATEGIES.pop(THROWAWAY, None)


def test_every_section_has_its_runner_in_order():
    assert tuple(RUNNERS) == SECTIONS


def test_strategies_flag_resolves_registered_strategies(throwaway):
    lineup = strategy_sets.parse_strategies(f"{THROWAWAY}:note=3, dynamic ,{THROWAWAY}:note=3,quantized:nbits=2")
    assert list(lineup) == ["throwaway 3", "dynamic", "throwaway 3 #2", "quantized quanto int2 r128"]
    assert lineup["throwaway 3"] == {"strategy": THROWAWAY, "note": 3}
    assert lineup["quantized quanto int2 r128"] == {"strategy": "quantized", "nbits": 2}


@pytest.mark.parametrize("text, message", [
    ("", "--strategies is empty"),
    (" , ", "--strategies is empty"),
    ("nope", "unknown strategy 'nope'; allowed: no_cache"),
    ("dynamic:x", "write key=value"),
    ("quantized:nbits=3", "not supported by the quanto backend"),
])
def test_strategies_flag_refuses_bad_text(text, message):
    with pytest.raises(ValueError, match=message):
        strategy_sets.parse_strategies(text)


def test_bench_command_refuses_an_unknown_strategy_before_measuring(tmp_path, capsys):
    from kvlab.cli import main

    status = main(["bench", "--strategies", "dynamic,nope", "--json", str(tmp_path / "b.json"),
                   "--plots", str(tmp_path / "plots")])
    assert status == 2
    err = capsys.readouterr().err
    assert "kvlab bench: unknown strategy 'nope'" in err and "[bench]" not in err
    assert not (tmp_path / "b.json").exists()


def test_the_recorded_command_carries_the_strategies():
    args = argparse.Namespace(size="smoke", only="overhead", repeats=None, strategies="dynamic,static:compile=true")
    assert cli.command_line(args, ["overhead"]) == (
        "python -m kvlab bench --size smoke --only overhead --strategies dynamic,static:compile=true")


def test_overhead_section_measures_a_registered_strategy(tiny, throwaway, tmp_path):
    lineup = strategy_sets.parse_strategies(f"{THROWAWAY}:note=3,no_cache")
    size = dataclasses.replace(SIZES["smoke"], repeats=2, new_tokens=2)
    said = []
    ctx = Context(tiny, size, PROMPT, said.append, tmp_path, lineup)
    section = bench_overhead(ctx)
    assert [row["strategy"] for row in section["rows"]] == ["throwaway 3", "no_cache"]
    for row in section["rows"]:
        for key in ("bare_tok_s", "kvlab_tok_s", "kvlab_outside_forward_ms_per_token", "ratio"):
            assert set(row[key]) == STATS_KEYS and row[key]["n"] == size.repeats
    assert [check["name"] for check in section["checks"]] == ["throwaway 3: kvlab / bare tok/s",
                                                              "no_cache: kvlab / bare tok/s"]
    for check in section["checks"]:
        assert check["met"] in (True, False) and check["section"] == "overhead"
        assert check["reason"] if check["met"] is False else check["reason"] == ""
    assert section["new_tokens"] == 2 and section["prompt_tokens"] == PROMPT.shape[1]
    assert "skipped_strategies" not in section
    assert any("throwaway 3, repeat 1/2" in line for line in said)


def test_bare_generate_builds_the_cache_the_registry_names(tiny, throwaway, monkeypatch):
    seen = []
    generate = tiny.model.generate

    def spy(*args, **kwargs):
        seen.append({k: kwargs[k] for k in ("cache", "use_cache") if k in kwargs})
        return generate(*args, **kwargs)

    monkeypatch.setattr(tiny.model, "generate", spy)
    for spec in ({"strategy": THROWAWAY}, {"strategy": "no_cache"}, {"strategy": "static"}):
        assert isinstance(bare_generate(tiny, PROMPT, spec, 2)(), float)
    assert type(seen[0]["cache"]).__name__ == "DynamicCache" and "use_cache" not in seen[0]
    assert seen[1] == {"use_cache": False}
    assert type(seen[2]["cache"]).__name__ == "StaticCache"


def test_the_bare_side_prunes_an_eviction_strategy_with_its_prefill_hooks(tiny, monkeypatch):
    prompt = torch.tensor([[1, *range(400, 440)]])
    caches = []
    generate = tiny.model.generate

    def spy(*args, **kwargs):
        caches.append(kwargs["cache"])
        return generate(*args, **kwargs)

    monkeypatch.setattr(tiny.model, "generate", spy)
    hooks_before = sum(len(layer.self_attn._forward_hooks) for layer in tiny.model.model.layers)
    for spec in ({"strategy": "knorm", "compression_ratio": 0.5}, {"strategy": "dynamic"}):
        bare_generate(tiny, prompt, spec, 3)()
    pruned, dense = caches
    # 41 prompt tokens pruned to half at prefill, then the 2 tokens fed while decoding; the dense cache keeps all 43
    assert pruned.layers[0].keys.shape[2] == 20 + 2 and dense.layers[0].keys.shape[2] == 41 + 2
    assert sum(len(layer.self_attn._forward_hooks) for layer in tiny.model.model.layers) == hooks_before


@pytest.mark.skipif(torch.cuda.is_available(), reason="offloading runs where there is CUDA")
def test_strategies_that_cannot_run_here_are_skipped_with_their_reason(tiny):
    ctx = Context(tiny, SIZES["smoke"], PROMPT, lambda message: None, None,
                  strategy_sets.parse_strategies("offloaded,dynamic"))
    usable, skipped = strategy_sets.usable_lineup(ctx, strategy_sets.OVERHEAD_STRATEGIES, "overhead")
    assert list(usable) == ["dynamic"]
    assert skipped[0]["strategy"] == "offloaded" and "CUDA" in skipped[0]["reason"]
    ctx.strategies = strategy_sets.parse_strategies("offloaded")
    with pytest.raises(RuntimeError, match="no strategy of this section can run here"):
        strategy_sets.usable_lineup(ctx, strategy_sets.OVERHEAD_STRATEGIES, "overhead")


def fake_figures(lineup, lengths=(256, 512, 1024)):
    def per_length(value):
        return {label: {n: [value(label, n)] * 2 for n in lengths} for label in lineup}

    return ScalingFigures(list(lengths), latency=per_length(lambda label, n: 0.01 * n if label == "no_cache" else 0.01),
                          nbytes=per_length(lambda label, n: 100 * n), ttft=per_length(lambda label, n: 0.1),
                          errors={})


def test_scaling_checks_keep_their_names_on_the_default_set():
    checks = scaling_checks(strategy_sets.SCALING_STRATEGIES, fake_figures(strategy_sets.SCALING_STRATEGIES))
    assert [c["name"] for c in checks] == [
        "no_cache latency 1024/256 tokens", "dynamic growth / no_cache growth", "sink latency 1024/256 tokens",
        "quantized int4 / dynamic bytes at 1024 tokens"]
    assert all(c["value"] is not None for c in checks)


def test_scaling_checks_without_their_strategy_are_not_judged(throwaway):
    lineup = strategy_sets.parse_strategies(f"dynamic,{THROWAWAY}")
    checks = scaling_checks(lineup, fake_figures(lineup))
    assert len(checks) == 4
    for check in checks:
        assert check["value"] is None and check["met"] is None
        assert status_of(check).startswith("n/a (not judged: needs ")
    assert "needs no_cache among the measured strategies" in checks[0]["reason"]
    assert "needs no_cache among" in checks[1]["reason"]
    assert "needs a sink strategy among" in checks[2]["reason"]
    assert "needs a quantized int4 strategy among" in checks[3]["reason"]


def test_scaling_checks_find_strategies_by_kind_not_label():
    lineup = strategy_sets.parse_strategies("no_cache,dynamic,quantized:nbits=4:residual_length=16,"
                                            "sink:window_length=300:num_sink_tokens=8")
    checks = scaling_checks(lineup, fake_figures(lineup, lengths=(256, 512, 1024)))
    assert [c["name"] for c in checks][2:] == ["sink latency 1024/512 tokens",
                                               "quantized int4 / dynamic bytes at 1024 tokens"]
    assert all(c["value"] is not None for c in checks)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


class RunningProcess:
    def poll(self):
        return None


@pytest.fixture
def page():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_app_counts_as_ready_when_its_ready_file_says_so(page, tmp_path, monkeypatch):
    from kvlab.bench.startup import _wait_for_app

    ready_file = tmp_path / "ready.jsonl"
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(ready_file))
    readiness.announce(readiness.READY, name="m", load_s=1.0)
    announced = readiness.read_announcements(ready_file)[0]["time"]
    marks = _wait_for_app(RunningProcess(), page, ready_file, announced - 2.0, [])
    assert set(marks) == {"served_s", "ready_s"} and marks["ready_s"] == pytest.approx(2.0)


def test_an_app_load_error_in_the_ready_file_stops_the_wait(page, tmp_path):
    import time

    ready_file = tmp_path / "ready.jsonl"
    ready_file.write_text(json.dumps({"state": "error", "name": "bundled", "load_s": None,
                                      "message": "no config.json in /x", "time": time.time()}) + "\n")
    from kvlab.bench.startup import _wait_for_app

    with pytest.raises(RuntimeError, match="app.py could not load its model: no config.json in /x"):
        _wait_for_app(RunningProcess(), page, ready_file, time.time(), ["last line"])


def test_import_time_child_prints_seconds(capsys):
    from kvlab.bench import import_time_child

    assert import_time_child.main(["json"]) == 0
    assert float(capsys.readouterr().out.strip()) >= 0
    assert import_time_child.main([]) == 2


def test_harness_orders_alternate_and_rotate():
    assert harness.interleaved(0, ("a", "b")) == ["a", "b"]
    assert harness.interleaved(1, ("a", "b")) == ["b", "a"]
    assert harness.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_plan_section_times_each_repeat_and_reads_the_peak_rss(tiny):
    from kvlab.bench.planning import PLAN_CONTEXTS, PLAN_MODELS, PLAN_STRATEGIES, bench_planning
    from kvlab.bench.text import plan_lines

    said = []
    section = bench_planning(Context(tiny, SIZES["smoke"], PROMPT, said.append, None))
    assert len(PLAN_STRATEGIES) == 6 and len(PLAN_CONTEXTS) == 5
    assert section["plan_s"]["n"] == SIZES["smoke"].repeats
    assert section["first_plan_s"] == section["plan_s"]["values"][0]
    assert [c["name"].split(": ")[-1] for c in section["checks"]] == [
        "first plan after warm-up", "later plans", "slowest", "slowest", "peak extra RSS, warm-up and plans (MB)"]
    assert [c["unit"] for c in section["checks"]] == ["s", "s", "s", "s", "MB"]
    assert set(section["models"]) == set(PLAN_MODELS) and len(PLAN_MODELS) == 4
    assert all(set(times) == {"first_s", "other_contexts_s", "again_s"} for times in section["models"].values())
    assert section["checks"][2]["value"] == max(times["first_s"] for times in section["models"].values())
    assert section["checks"][3]["value"] == max(max(times["other_contexts_s"], times["again_s"])
                                                for times in section["models"].values())
    assert all(c["met"] in (True, False) for c in section["checks"])
    assert section["rss_peak_extra_bytes"] >= section["rss_peak_extra_plans_only_bytes"] >= 0
    assert said[0] == "plan: warming the planner up"
    text = "\n".join(plan_lines(section))
    assert "peak extra RSS" in text and all(model.split("/")[-1] in text for model in PLAN_MODELS)


def test_plan_section_memory_check_is_not_judged_without_proc(tiny, monkeypatch, tmp_path):
    from kvlab.bench import planning

    monkeypatch.setattr(planning, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    section = planning.bench_planning(Context(tiny, dataclasses.replace(SIZES["smoke"], repeats=1), PROMPT,
                                              lambda message: None, None))
    assert [c["name"].split(": ")[-1] for c in section["checks"]] == [
        "first plan after warm-up", "slowest", "slowest", "peak extra RSS, warm-up and plans (MB)"]
    memory = section["checks"][-1]
    assert status_of(memory).startswith("n/a (the kernel's peak RSS cannot be read and reset here")
    assert section["rss_before_bytes"] is None


def test_the_bench_times_one_generation_per_column():
    """A re-timing policy would run every column a second time inside the kvlab run the overhead section times
    (halving its tok/s against bare generate) and, in fair mode, replace the together figures with alone ones."""
    from kvlab.bench.sides import settings_for

    settings = settings_for(12)
    assert settings.max_new_tokens == 12 and not settings.stop_at_eos
    assert settings.timing_policy == "live" and settings.fidelity is False
