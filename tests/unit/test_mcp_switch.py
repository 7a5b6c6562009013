"""The MCP switch (`app.py --mcp` / `--no-mcp`, KVLAB_MCP, on by default on a Space) and the tools' refusals of
bad input that need no model: one line saying what to change."""

import gradio as gr
import pytest

from app import mcp_flag
from kvlab.ui.hosting.tools import AgentTools, mcp_enabled

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("env, flag, expected", [
    ({}, None, False), ({"SPACE_ID": "user/kvlab"}, None, True), ({"SPACE_ID": "u/k", "KVLAB_MCP": "0"}, None, False),
    ({"KVLAB_MCP": "1"}, None, True), ({"KVLAB_MCP": "1"}, False, False), ({}, True, True),
])
def test_the_switch(monkeypatch, env, flag, expected):
    for name in ("SPACE_ID", "KVLAB_MCP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert mcp_enabled(flag) is expected


def test_a_bad_setting_names_itself(monkeypatch):
    monkeypatch.setenv("KVLAB_MCP", "maybe")
    with pytest.raises(ValueError, match="KVLAB_MCP must be 1 or 0, got 'maybe'"):
        mcp_enabled()


def test_command_line_flags():
    assert mcp_flag([]) is None and mcp_flag(["--mcp"]) is True and mcp_flag(["--mcp", "--no-mcp"]) is False


@pytest.mark.parametrize("call, message", [
    (lambda t: t.compare_strategies("", "hi"), "strategies is empty"),
    (lambda t: t.compare_strategies("dynamic", "  "), "the prompt is empty"),
    (lambda t: t.compare_strategies("dynamic", "hi", 0), "max_new_tokens must be between 1"),
    (lambda t: t.plan(batch=0), "batch must be between 1 and"),
    (lambda t: t.plan(contexts="lots"), "lots"),
    (lambda t: t.diverge("quantized:backend=quanto:nbits=2", "hi", reference="sink"), "reference must be an exact"),
    (lambda t: t.diverge("dynamic", "hi", steps=0), "steps must be from 1"),
    (lambda t: t.needle(strategies=" "), "strategies is empty"),
])
def test_bad_input_is_one_line_before_any_model_loads(call, message):
    with pytest.raises(gr.Error, match=message) as raised:
        call(AgentTools(pool=None))  # no pool: a model load would fail differently
    assert "\n" not in str(raised.value)

