"""Issue-level identities of the compare runner on the real bundled model (fp32, CPU)."""

import json
import subprocess
import sys

import pytest

from kvlab.columns import Column
from kvlab.compare.events import StepMetrics
from kvlab.protocol import RunDone
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.compare.preset import load_preset
from kvlab.strategies import make_strategy


@pytest.fixture(scope="module")
def quickstart(bundled):
    preset = load_preset("quickstart")
    prompt = encode_prompt(bundled.tokenizer, preset.prompt.text, preset.prompt.system)
    # 32 of the preset's 64 tokens, live timing: these tests check tokens, bytes and fidelity, not timing.
    settings = preset.settings().with_overrides({"max_new_tokens": 32})
    events = list(run_compare(bundled, prompt, preset.build_columns(), settings, preset.mode))
    return {result.strategy + (f"/{result.knobs.get('backend')}" if result.strategy == "quantized" else ""): result
            for result in events[-1].results}, events


def test_quickstart_finishes_and_exact_strategies_agree(quickstart):
    results, _ = quickstart
    assert results["no_cache"].status == results["dynamic"].status == results["static"].status == "ok"
    assert results["dynamic"].token_ids == results["static"].token_ids
    no_cache = results["no_cache"].token_ids  # the preset gives it fewer tokens: compared on what it made
    assert 0 < len(no_cache) < len(results["dynamic"].token_ids) and results["dynamic"].token_ids[:len(no_cache)] == no_cache
    assert results["no_cache"].agreement == 1.0 and results["no_cache"].first_divergence is None
    assert len(results["dynamic"].token_ids) > 10
    assert results["dynamic"].is_baseline
    assert results["static"].agreement == 1.0 and results["static"].first_divergence is None


def test_every_quickstart_column_runs_on_a_cpu_and_sink_holds_its_window(quickstart):
    results, _ = quickstart
    assert all(result.status == "ok" for result in results.values()), {k: r.status for k, r in results.items()}
    sink, dynamic = results["sink"], results["dynamic"]
    assert 0 < sink.peak_cache_bytes < dynamic.peak_cache_bytes  # 32 tokens held of the prompt + 32


def test_quantized_columns_keep_their_backend_and_save_bytes(quickstart):
    results, _ = quickstart
    dynamic = results["dynamic"].peak_cache_bytes
    for backend in ("quanto", "hqq"):
        column = results[f"quantized/{backend}"]
        assert column.status == "ok"
        assert backend in column.name and column.knobs["backend"] == backend
        assert 0 < column.peak_cache_bytes < dynamic
        assert "residual_length=16" in column.caveat
        assert column.top1_agreement is not None and column.mean_kl is not None and column.mean_kl >= 0


def test_dynamic_bytes_equal_the_prediction_at_every_step(quickstart):
    results, events = quickstart
    dynamic_index = results["dynamic"].index
    steps = [e for e in events if isinstance(e, StepMetrics) and e.column == dynamic_index]
    assert len(steps) == len(results["dynamic"].token_ids)
    assert all(e.cache_bytes == e.predicted_cache_bytes for e in steps)
    assert results["dynamic"].cache_bytes == results["dynamic"].predicted_cache_bytes


def test_static_too_small_is_reported_in_its_column_while_others_finish(bundled):
    prompt = encode_prompt(bundled.tokenizer, "Name three colours.")
    settings = GenerationSettings(max_new_tokens=8)
    done = collect(run_compare(bundled, prompt, [{"strategy": "static", "max_cache_len": 10}, {"strategy": "dynamic"}], settings))
    small, dynamic = done.results
    assert small.status == "error" and small.ttft_s is None
    needed = prompt.shape[1] + 8
    assert f"max_cache_len=10" in small.message and f"({prompt.shape[1]})" in small.message and str(needed) in small.message
    assert dynamic.status == "ok"


def test_quanto_and_hqq_keep_their_own_backend_over_two_runs(bundled):
    prompt = encode_prompt(bundled.tokenizer, "Say hello.")
    columns = [Column(make_strategy({"strategy": "quantized", "backend": "quanto", "residual_length": 4})),
               Column(make_strategy({"strategy": "quantized", "backend": "hqq", "residual_length": 4}))]
    seen = []
    for _ in range(2):
        for column in columns:
            cache = column.strategy.build_cache(bundled, 32)
            seen.append(type(cache.layers[0]).__name__)
        done = collect(run_compare(bundled, prompt, columns, GenerationSettings(max_new_tokens=6, fidelity=False)))
        assert [r.knobs["backend"] for r in done.results] == ["quanto", "hqq"]
        assert all(r.status == "ok" for r in done.results)
    assert seen == ["QuantoQuantizedLayer", "HQQQuantizedLayer"] * 2


def test_cli_json_has_the_promised_fields_and_exit_codes(tmp_path):
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "kvlab", "compare", "--prompt", "Say hi.", "--strategies",
           "dynamic,static,quantized:backend=fp8", "--max-new-tokens", "5", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["model"]["name"] == "SmolLM2-135M-Instruct"
    for column in record["columns"]:
        for key in ("name", "status", "message", "text", "token_ids", "ttft_s", "prefill_s", "decode_tok_s", "per_token_s",
                    "cache_bytes", "peak_cache_bytes", "predicted_cache_bytes", "agreement", "first_divergence",
                    "top1_agreement", "mean_kl"):
            assert key in column
    assert "dynamic" in proc.stdout and "quantized fp8" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--preset", str(tmp_path / "missing.yaml")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "preset file not found" in bad.stderr
    nbits = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--prompt", "x", "--strategies",
                            "quantized:backend=quanto:nbits=3"], capture_output=True, text=True, timeout=300)
    assert nbits.returncode != 0 and "allowed: [2, 4]" in nbits.stderr
    missing_model = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--prompt", "x", "--strategies",
                                    "dynamic", "--model", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert missing_model.returncode != 0 and "not a model" in missing_model.stderr


def test_stop_during_a_2000_token_run_returns_to_idle(bundled):
    import threading

    from kvlab.compare.events import TokenEvent

    prompt = encode_prompt(bundled.tokenizer, "Count from one to ten thousand.")
    stop = threading.Event()
    settings = GenerationSettings(max_new_tokens=2000, stop_at_eos=False, fidelity=False)
    done = None
    for event in run_compare(bundled, prompt, [{"strategy": "dynamic"}, {"strategy": "static"}, {"strategy": "no_cache"}],
                             settings, "fair", stop):
        if isinstance(event, TokenEvent) and event.step >= 8:
            stop.set()
        if isinstance(event, RunDone):
            done = event
    assert done.stopped and all(r.stopped for r in done.results)
    assert max(len(r.token_ids) for r in done.results) < 20
    assert not [t for t in threading.enumerate() if t.name.startswith("kvlab-") and not t.name.startswith("kvlab-compute")]
