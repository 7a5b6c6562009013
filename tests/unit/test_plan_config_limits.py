"""A model config someone supplies to Plan, treated as hostile: its config.json is size-capped before it is read
and shape-capped before anything is built (999,999 layers refused at once), wrong types, NaN and negative values
get one line naming the field and its limit, local folders follow the public-server rules (one line for every
refused source, a hub id naming a folder here reads like a missing one, uploads never planned), and a plan stops
between two steps when its generator is closed (the Plan tab's Stop, a closed page)."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.compute import compute_iter
from kvlab.models import loading
from kvlab.models.bundled import MODELS
from kvlab.plan import planner
from kvlab.plan.catalog import load_catalog
from kvlab.plan.config_limits import CONFIG_LIMITS, MAX_CONFIG_BYTES
from kvlab.plan.planner import PlanError, PlanRequest, plan
from kvlab.models.sources import UPLOAD_REFUSAL, local_refusal

REPO = Path(__file__).resolve().parents[2]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CHILD_MEMORY_BYTES = 6 << 30
"""Address space the child planning 999,999 layers may take: a planner without the cap dies here, not the host."""
REFUSE_WITHIN_S = 1.0
"""A security bound: the refusal of a hostile config, imports already paid (measured: about 0.02 s)."""


def llama_config(**changes) -> dict:
    """Llama 3.1 8B's config.json fields (the catalog's), with `changes`."""
    return {**load_catalog()[LLAMA].config, **changes}


def folder_with(tmp_path: Path, config, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, (str, bytes)) else json.dumps(config)
    (folder / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


@pytest.fixture
def local(monkeypatch):
    for name in ("SPACE_ID", "KVLAB_PUBLIC", "KVLAB_ALLOW_HUB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KVLAB_ALLOW_LOCAL", "1")
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout_s=0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return monkeypatch


@pytest.fixture
def space(local):
    local.delenv("KVLAB_ALLOW_LOCAL")
    local.setenv("SPACE_ID", "someone/kvlab")
    return local


def refusal(model) -> str:
    with pytest.raises(PlanError) as refused:
        plan(PlanRequest(model=str(model), contexts=(1024,)))
    assert "\n" not in str(refused.value)
    return str(refused.value)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


CHILD = """
import sys, time
from kvlab.cli import main
main(["plan", "--list-models"])  # imports and the catalog paid before the clock starts
started = time.perf_counter()
code = main(["plan", "--model", sys.argv[1]])
print("RESULT", code, time.perf_counter() - started)
"""


def test_999999_layers_are_refused_at_once_in_one_line(tmp_path):
    folder = folder_with(tmp_path, llama_config(num_hidden_layers=999_999))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "KVLAB_ALLOW_LOCAL": "1", "HF_HUB_OFFLINE": "1",
           "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180, preexec_fn=_limit_memory)
    result = [line.split() for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert result, done.stderr[-2000:]
    _, code, elapsed = result[0]
    lines = [line for line in done.stderr.splitlines() if line.startswith("kvlab plan: ")]
    assert code == "2" and len(lines) == 1 and "Traceback" not in done.stderr
    assert "num_hidden_layers" in lines[0] and "1,024" in lines[0] and "999,999" in lines[0]
    assert float(elapsed) < REFUSE_WITHIN_S


@pytest.mark.parametrize("changes,message", [
    ({"num_hidden_layers": "32"}, "num_hidden_layers must be a whole number from 1 to 1,024"),
    ({"num_hidden_layers": 32.5}, "got 32.5"),
    ({"num_hidden_layers": True}, "got True"),
    ({"num_key_value_heads": -8}, "num_key_value_heads must be a whole number from 1 to 1,024"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a whole number from 1"),
    ({"head_dim": 1 << 20}, "head_dim must be a whole number from 1 to 4,096"),
    ({"hidden_size": [4096]}, "hidden_size must be a whole number from 1 to 131,072 (the planner's limit"),
    ({"hidden_size": {"width": 4096}}, "far above any public model), got a dict"),
    ({"vocab_size": 10 ** 12}, "vocab_size must be a whole number from 1 to 2,097,152"),
    ({"max_position_embeddings": 1 << 40}, "max_position_embeddings must be a whole number from 1 to 134,217,728"),
    ({"text_config": {"num_hidden_layers": 5000}}, "num_hidden_layers must be a whole number from 1 to 1,024"),
    ({"n_layer": 100_000}, "config n_layer must be a whole number from 1 to 1,024"),
    ({"rope_theta": {"__float__": "NaN"}}, "only +/-Infinity may be tagged, and no number may be NaN"),
])
def test_a_config_field_of_the_wrong_type_or_size_gets_one_line(local, tmp_path, changes, message):
    assert message in refusal(folder_with(tmp_path, llama_config(**changes)))


@pytest.mark.parametrize("text,message", [
    (json.dumps(llama_config()).replace("500000.0", "NaN"), "config.json holds NaN"),
    (json.dumps(llama_config()).replace("500000.0", "-Infinity"), "config.json holds -Infinity"),
    (json.dumps(llama_config()).replace("500000.0", "1e999"), "too large for a float"),
    (json.dumps(llama_config()).replace("32,", "1" + "0" * 5000 + ","), "config.json is not valid JSON"),
    ('{"model_type": "llama", "x": ' + "[" * 100 + "]" * 100 + "}", "nests deeper than 32 levels"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than 32 levels"),
    (json.dumps(llama_config(notes="x" * MAX_CONFIG_BYTES)), "larger than 1,048,576 bytes"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ('{"num_hidden_layers": 2}', "has no model_type"),
    ('{"model_type": "no-such-type"}', "transformers does not know model_type 'no-such-type'"),
])
def test_a_config_json_that_is_not_a_sane_object_gets_one_line(local, tmp_path, text, message):
    assert message in refusal(folder_with(tmp_path, text))


def test_a_real_config_json_in_a_folder_still_plans(local, tmp_path):
    result = plan(PlanRequest(model=str(folder_with(tmp_path, llama_config())), contexts=(1024,)))
    assert result.model["layers"] == 32 and result.model["origin"] == "folder"


def test_every_catalog_model_is_far_inside_the_limits():
    for entry in load_catalog().values():
        for key, (_, high) in CONFIG_LIMITS.items():
            value = entry.config.get(key)
            assert value is None or value <= high // 4, (entry.hub_id, key, value)


def test_a_config_object_over_a_limit_is_refused_before_it_is_probed(monkeypatch):
    config = load_catalog()[LLAMA].build_config()
    config.num_hidden_layers = 999_999
    monkeypatch.setattr(planner, "describe_architecture", lambda *args: pytest.fail("probed a hostile config"))
    with pytest.raises(PlanError, match="num_hidden_layers must be a whole number from 1 to 1,024"):
        plan(PlanRequest(model=config))


@pytest.mark.parametrize("source", ["/etc", "/etc/passwd", "/no/such/folder", "~", "..", "../presets",
                                    "file:///etc", "/tmp/gradio/0123abcd", "presets/models/../models", "C:\\x"])
def test_on_a_space_a_local_source_gets_one_line_whether_or_not_it_exists(space, source):
    assert refusal(source) == f"{local_refusal(MODELS)}; the catalog: {', '.join(load_catalog())}"


def test_on_a_space_a_hub_id_naming_a_folder_here_reads_like_a_missing_hub_id(space, tmp_path):
    space.chdir(tmp_path)
    folder_with(tmp_path, llama_config(), "acme/model")
    here, absent = refusal("acme/model"), refusal("acme/absent")
    assert here.replace("acme/model", "acme/absent") == absent
    assert "not in kvlab's catalog" in absent and str(tmp_path) not in absent


def test_an_upload_is_never_planned_even_with_local_sources_on(local, tmp_path):
    local.setenv("GRADIO_TEMP_DIR", str(tmp_path / "uploads"))
    upload = folder_with(tmp_path / "uploads", llama_config(), "0123abcd")
    assert refusal(upload) == UPLOAD_REFUSAL


def test_a_closed_plan_measures_nothing_more(monkeypatch):
    from kvlab.plan.planner import PlanProgress, plan_steps

    planned = []
    real = planner._plan_strategy
    monkeypatch.setattr(planner, "_plan_strategy", lambda *args: planned.append(args[1].name) or real(*args))
    specs = tuple({"strategy": name} for name in ("dynamic", "static", "sliding_window"))
    steps = compute_iter(plan_steps(PlanRequest(model=LLAMA, contexts=(1024,), strategies=specs)))
    first = next(steps)
    assert isinstance(first, PlanProgress) and (first.done, first.total) == (0, 3)
    assert isinstance(next(steps), PlanProgress) and planned == ["dynamic"]
    steps.close()
    assert planned == ["dynamic"]
    *_, result = plan_steps(PlanRequest(model=LLAMA, contexts=(1024,), strategies=specs))
    assert [s.name for s in result.strategies] == ["dynamic", "static", "sliding_window"]


@pytest.mark.parametrize("arguments,message", [
    ({"budget_gib": float("inf")}, "budget_gib must be 0 \\(no budget\\) or a finite number"),
    ({"budget_gib": float("nan")}, "budget_gib must be 0 \\(no budget\\) or a finite number"),
    ({"model": "/etc/passwd"}, "local files and folders are off"),
    ({"model": "file:///etc"}, "local files and folders are off"),
])
def test_the_mcp_plan_tool_gives_one_line(space, arguments, message):
    gr = pytest.importorskip("gradio")
    from kvlab.ui.hosting.tools import AgentTools

    with pytest.raises(gr.Error, match=message) as raised:
        AgentTools(pool=None).plan(**arguments)
    assert "\n" not in str(raised.value)
