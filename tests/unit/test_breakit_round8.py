"""Break-it round 8 (issue 45, round 7's fixes re-attacked as a public Space): each test pins one finding and
fails on the code it was found on. Reproduction scripts against a running app are in breakit/ (see its README).

- the `diverge` API and MCP tool let a strategy that cannot run here (an `engine:openai` column on a public
  server, a backend that is not installed) out as a raw `InspectError`: gradio's generic "has raised an
  exception" to the caller and a traceback in the log, where every other refusal is one line;
- any visitor could load any hub model by typing its id in a Model field (or the APIs' `model`): nothing
  checked its size, so one request for a 70B id downloads ~140 GB and loads it in float32 on a 16 GB Space
  (the hub is reachable there); now a hub model's loaded weights are held to `KVLAB_MAX_MODEL_MB`
  (4,096 MiB by default on a public server), read from the hub before anything is downloaded;
"""

import types

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


class FakeHub:
    """Stands in for huggingface_hub's `model_info` and transformers' loaders: records what was asked."""

    def __init__(self, parameters: int | None, files: dict[str, int] | None = None):
        self.parameters, self.files, self.loaded = parameters, files or {}, []

    def model_info(self, repo_id, **kwargs):
        safetensors = None if self.parameters is None else types.SimpleNamespace(total=self.parameters)
        siblings = [types.SimpleNamespace(rfilename=name, size=size) for name, size in self.files.items()]
        return types.SimpleNamespace(safetensors=safetensors, siblings=siblings)

    def from_pretrained(self, source, **kwargs):
        self.loaded.append(source)
        raise OSError("stopped here: the test loads nothing")


def fake_hub(monkeypatch, parameters, files=None) -> FakeHub:
    import huggingface_hub
    import transformers

    from kvlab.models import loading

    hub = FakeHub(parameters, files)
    monkeypatch.setenv("KVLAB_PUBLIC", "1")
    monkeypatch.delenv("KVLAB_MAX_MODEL_MB", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda *args, **kwargs: True)
    monkeypatch.setattr(huggingface_hub, "model_info", hub.model_info)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub.from_pretrained)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", hub.from_pretrained)
    return hub


@pytest.mark.parametrize("parameters, files", [
    (70_000_000_000, None),                                   # the hub counts its parameters
    (None, {"pytorch_model.bin": 3 * 2**30, "README.md": 10}),  # only its files' sizes (maybe half precision)
    (None, {}),                                               # the hub says nothing of its size
])
def test_a_hub_model_too_big_for_a_public_server_is_refused_before_any_download(monkeypatch, parameters, files):
    from kvlab.models.loading import ModelLoadError, ModelSpec, load_model

    hub = fake_hub(monkeypatch, parameters, files)
    with pytest.raises(ModelLoadError) as refused:
        load_model(ModelSpec("someone/huge-model"))
    assert "KVLAB_MAX_MODEL_MB" in str(refused.value) and hub.loaded == []
    assert_one_printable_line(str(refused.value))


def test_a_hub_model_within_the_cap_loads_and_the_cap_is_a_setting(monkeypatch):
    from kvlab.models.loading import ModelLoadError, ModelSpec, load_model
    from kvlab.models.sources import max_model_mb

    hub = fake_hub(monkeypatch, 135_000_000)
    with pytest.raises(ModelLoadError):  # the fake loader's OSError, after the size passed
        load_model(ModelSpec("someone/small-model"))
    assert hub.loaded == ["someone/small-model"]
    monkeypatch.setenv("KVLAB_MAX_MODEL_MB", "0")
    hub = fake_hub(monkeypatch, 70_000_000_000)
    monkeypatch.setenv("KVLAB_MAX_MODEL_MB", "0")
    with pytest.raises(ModelLoadError):
        load_model(ModelSpec("someone/huge-model"))
    assert hub.loaded == ["someone/huge-model"]  # 0: no cap, as off a public server
    monkeypatch.setenv("KVLAB_MAX_MODEL_MB", "lots")
    with pytest.raises(ValueError, match="KVLAB_MAX_MODEL_MB must be a whole number >= 0"):
        max_model_mb()
