"""Planner input checks, budget search, offloaded placement, huge contexts and the `plan` command line.

Catalog configs only (no weights, no bundled model).
"""

import json
import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from kvlab.plan.catalog import load_catalog
from kvlab.cli import main
from kvlab.plan.planner import GIB, PlanError, PlanRequest, plan
from kvlab.strategies import make_strategy
from kvlab.strategies.base import parse_strategy_list

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
JSON_FIELDS = {"cache_bytes", "cache_bytes_by_layer_type", "weights_bytes", "total_bytes", "fits",
               "max_context_in_budget", "explanation"}


@pytest.mark.parametrize("change,message", [
    ({"contexts": (0,)}, "context must be an integer from 1"),
    ({"contexts": (-4096,)}, "got -4096"),
    ({"contexts": ()}, "give between 1 and"),
    ({"batch": 0}, "batch must be an integer from 1"),
    ({"dtype": "int8"}, "dtype must be one of ['float32', 'bfloat16', 'float16']"),
    ({"budget_bytes": -1}, "budget must be a number of bytes above 0"),
    ({"prefill_tokens": 2048, "contexts": (1024,)}, "prefill must be an integer from 1 to 1,024"),
    ({"strategies": ({"strategy": "paged"},)}, "unknown strategy 'paged'; allowed: no_cache, dynamic"),
    ({"strategies": ({"strategy": "quantized", "nbits": 5},)}, "allowed: [2, 4]"),
    ({"model": "llama-8b"}, "unknown model 'llama-8b'"),
    ({"model": "llama-8b"}, "known: HuggingFaceTB/SmolLM2-1.7B-Instruct"),
    ({"model": ""}, "no model given"),
])
def test_bad_input_gets_a_clear_message(change, message):
    with pytest.raises(PlanError) as err:
        plan(PlanRequest(**{"model": LLAMA, **change}))
    assert message in str(err.value)


def test_a_folder_without_config_json_is_refused(tmp_path):
    with pytest.raises(PlanError, match="is not a model folder: it has no config.json"):
        plan(PlanRequest(model=str(tmp_path)))


def test_an_unknown_hub_id_without_network_says_so(monkeypatch):
    import kvlab.models.loading

    monkeypatch.setattr(kvlab.models.loading, "hub_reachable", lambda timeout_s=0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PlanError) as err:
        plan(PlanRequest(model="nobody/no-such-model"))
    text = str(err.value)
    assert "not in kvlab's catalog" in text and "unreachable" in text and LLAMA in text


def test_unusable_strategies_report_the_reason_compare_gives():
    result = plan(PlanRequest(model="google/gemma-3-27b-it", contexts=(1024,),
                              strategies=({"strategy": "quantized", "q_group_size": 96}, {"strategy": "sink"},
                                          {"strategy": "offloaded"})))
    quantized, sink, offloaded = result.strategies
    stand_in = SimpleNamespace(config=load_catalog()["google/gemma-3-27b-it"].build_config())
    assert quantized.status == "unavailable" and "must divide this model's head_dim (128)" in quantized.message
    assert quantized.message == make_strategy({"strategy": "quantized", "q_group_size": 96}).unavailable_reason(stand_in)
    assert sink.message == make_strategy({"strategy": "sink"}).unavailable_reason(stand_in)
    assert offloaded.status == "ok"  # planned for a CUDA machine, whatever this one has


def test_static_past_its_max_cache_len_is_an_error_in_its_cell_only():
    spec = {"strategy": "static", "max_cache_len": 4096}
    result = plan(PlanRequest(model=LLAMA, contexts=(1024, 8192), strategies=(spec,), budget_bytes=80 * GIB))
    small, large = result.strategies[0].cells
    assert small.cache_bytes == 32 * (2 * 8 * 4096 * 128 * 2 + 8) and large.error.startswith("static cache too small")
    assert result.strategies[0].max_context_in_budget == 4096


@pytest.mark.parametrize("spec", parse_strategy_list("dynamic,static,quantized:backend=quanto:nbits=4,"
                                                     "quantized:backend=fp8,offloaded"))
def test_max_context_in_budget_is_the_last_context_that_fits(spec):
    budget = 24 * GIB
    result = plan(PlanRequest(model=LLAMA, contexts=(1024,), strategies=(spec,), budget_bytes=budget))
    best = result.strategies[0].max_context_in_budget
    assert best and not result.strategies[0].max_context_unbounded
    edge = plan(PlanRequest(model=LLAMA, contexts=(best, best + 1), strategies=(spec,), budget_bytes=budget))
    assert [cell.fits for cell in edge.strategies[0].cells] == [True, False]


def test_max_context_under_decoding_counts_the_residual_peak():
    spec = {"strategy": "quantized", "backend": "quanto", "nbits": 4, "residual_length": 64}
    budget = 20 * GIB
    result = plan(PlanRequest(model=LLAMA, contexts=(2048,), strategies=(spec,), budget_bytes=budget,
                              prefill_tokens=1000))
    best = result.strategies[0].max_context_in_budget
    window = plan(PlanRequest(model=LLAMA, contexts=tuple(range(best - 62, best + 2)), strategies=(spec,),
                              budget_bytes=budget, prefill_tokens=1000))
    fits = [cell.fits for cell in window.strategies[0].cells]
    assert all(fits[:-1]) and not fits[-1]


def test_flat_caches_are_unbounded_and_weights_alone_can_exhaust_the_budget():
    specs = ({"strategy": "sink", "window_length": 1024}, {"strategy": "no_cache"}, {"strategy": "dynamic"})
    roomy = plan(PlanRequest(model=LLAMA, contexts=(1024,), strategies=specs, budget_bytes=24 * GIB)).strategies
    assert roomy[0].max_context_unbounded and roomy[1].max_context_unbounded and not roomy[2].max_context_unbounded
    tight = plan(PlanRequest(model=LLAMA, contexts=(1024,), strategies=specs, budget_bytes=8 * GIB)).strategies
    assert [s.max_context_in_budget for s in tight] == [0, 0, 0] and tight[0].cells[0].fits is False


def test_offloaded_keeps_two_layers_on_the_gpu_and_the_rest_in_host_memory():
    result = plan(PlanRequest(model=LLAMA, contexts=(131072,), strategies=parse_strategy_list("dynamic,offloaded")))
    dynamic, offloaded = (strategy.cells[0] for strategy in result.strategies)
    assert offloaded.cache_bytes == dynamic.cache_bytes == 16 * GIB
    assert offloaded.cache_bytes_on_device == 2 * dynamic.cache_bytes // 32
    assert any("host RAM" in note for note in result.strategies[1].notes)


def test_ten_million_tokens_are_numbers_not_memory():
    process = psutil.Process()
    before = process.memory_info().rss
    result = plan(PlanRequest(model="meta-llama/Llama-3.3-70B-Instruct", contexts=(10**7,), batch=8,
                              strategies=parse_strategy_list("dynamic,static,quantized:backend=quanto:nbits=2")))
    assert process.memory_info().rss - before < 512 << 20
    assert result.strategies[0].cells[0].cache_bytes == 8 * 10**7 * 2 * 80 * 8 * 128 * 2


def test_json_has_the_promised_fields_per_strategy_and_context():
    result = plan(PlanRequest(model=LLAMA, contexts=(1024, 32768), budget_bytes=24 * GIB,
                              strategies=parse_strategy_list("dynamic,sink:window_length=1024")))
    record = json.loads(json.dumps(result.to_json()))
    for strategy in record["strategies"]:
        assert len(strategy["contexts"]) == 2
        for cell in strategy["contexts"]:
            assert JSON_FIELDS <= set(cell)
            assert cell["total_bytes"] == cell["cache_bytes"] + cell["weights_bytes"]


def test_cli_prints_the_plan_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", "--model", LLAMA, "--context", "1024,32768,131072", "--batch", "1", "--dtype", "bfloat16",
                 "--strategies", "dynamic,quantized:backend=quanto:nbits=4,sink:window_length=1024",
                 "--budget-gib", "24", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "quantized quanto int4 r128" in printed and "unbounded" in printed
    record = json.loads(out.read_text())
    assert [s["name"] for s in record["strategies"]] == ["dynamic", "quantized quanto int4 r128", "sink 4+1020"]
    assert record["strategies"][0]["contexts"][2]["cache_bytes"] == 16 * GIB


@pytest.mark.parametrize("args,message", [
    (["--context", "0"], "context must be an integer from 1"),
    (["--context", "1.5k"], "--context: context lengths are whole numbers"),
    (["--batch", "0"], "batch must be an integer from 1"),
    (["--budget-gib", "-3"], "--budget-gib must be a finite number of GiB above 0"),
    (["--strategies", "dynamic:window"], "write key=value"),
    (["--model", "nosuchmodel"], "known: "),
])
def test_cli_bad_input_exits_2_with_the_reason_on_stderr(args, message, capsys):
    code = main(["plan", "--model", LLAMA, *args])
    assert code == 2 and message in capsys.readouterr().err


def test_cli_lists_the_catalog():
    done = subprocess.run([sys.executable, "-m", "kvlab", "plan", "--list-models"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and LLAMA in done.stdout.split()


def test_a_config_object_plans_like_its_catalog_entry():
    config = load_catalog()[LLAMA].build_config()
    direct = plan(PlanRequest(model=config, contexts=(4096,)))
    by_id = plan(PlanRequest(model=LLAMA, contexts=(4096,)))
    assert direct.model["origin"] == "config"
    assert direct.strategies[0].cells[0].cache_bytes == by_id.strategies[0].cells[0].cache_bytes
    assert direct.model["parameters"] == by_id.model["parameters"]
