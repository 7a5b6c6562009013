"""The `diverge` agent tool and `python -m kvlab diverge --json` take one path through the Inspect wing
(`kvlab.inspect.diverge_run`): on the same model and input they give the same record."""

import json
import threading

import pytest

from kvlab.cli import main
from kvlab.ui.hosting.tools import AgentTools

pytestmark = pytest.mark.unit


class OnePool:
    """A model pool that holds one loaded model."""

    def __init__(self, loaded):
        self.loaded = loaded

    def get(self, spec):
        return self.loaded


def test_the_tool_returns_the_record_the_command_writes(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr("kvlab.models.loading.load_model", lambda spec, progress=None: tiny)
    out = tmp_path / "diverge.json"
    argv = ["diverge", "--strategy", "loop:full_sequence", "--prompt", "hello there", "--steps", "3", "--json", str(out)]
    assert main(argv) == 0
    written = json.loads(out.read_text())
    returned = json.loads(AgentTools(OnePool(tiny)).diverge("loop:full_sequence", "hello there", steps=3))
    assert len(returned["steps"]) == 3 and returned["reference"] == "dynamic"
    assert returned == written


def test_a_stopped_tool_run_keeps_the_steps_it_took(tiny):
    stop = threading.Event()
    stop.set()
    record = json.loads(AgentTools(OnePool(tiny)).diverge("dynamic", "hello", steps=3, stop=stop))
    assert len(record["steps"]) == 1 and record["first_divergence"] is None
