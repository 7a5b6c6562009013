"""Break-it round 8 (issue 45, round 7's fixes re-attacked as a public Space): each test pins one finding and
fails on the code it was found on. Reproduction scripts against a running app are in breakit/ (see its README).

- the `diverge` API and MCP tool let a strategy that cannot run here (an `engine:openai` column on a public
  server, a backend that is not installed) out as a raw `InspectError`: gradio's generic "has raised an
  exception" to the caller and a traceback in the log, where every other refusal is one line;
"""

import pytest

gr = pytest.importorskip("gradio")

from kvlab.strategies.knob_yaml import MESSAGE_CHARS  # noqa: E402
from kvlab.ui.hosting.tools import AgentTools  # noqa: E402

pytestmark = pytest.mark.unit


def assert_one_printable_line(text: str) -> None:
    assert len(text) <= MESSAGE_CHARS, len(text)
    assert text.isprintable(), repr(text[:200])


def test_diverge_refuses_a_strategy_that_cannot_run_here_in_one_line(tiny_pool, monkeypatch):
    monkeypatch.setenv("KVLAB_PUBLIC", "1")
    monkeypatch.delenv("KVLAB_ALLOW_ENDPOINTS", raising=False)
    tools = AgentTools(tiny_pool)
    with pytest.raises(gr.Error) as refused:
        tools.diverge("engine:openai:base_url=http://127.0.0.1:22/v1", "hi", steps=1)
    assert "KVLAB_ALLOW_ENDPOINTS" in str(refused.value)
    assert_one_printable_line(str(refused.value))
