"""Break-it round 8 (issue 45, round 7's fixes re-attacked as a public Space): each test pins one finding and
fails on the code it was found on. Reproduction scripts against a running app are in breakit/ (see its README).

- the `diverge` API and MCP tool let a strategy that cannot run here (an `engine:openai` column on a public
  server, a backend that is not installed) out as a raw `InspectError`: gradio's generic "has raised an
  exception" to the caller and a traceback in the log, where every other refusal is one line;
- any visitor could load any hub model by typing its id in a Model field (or the APIs' `model`): nothing
  checked its size, so one request for a 70B id downloads ~140 GB and loads it in float32 on a 16 GB Space
  (the hub is reachable there); now a hub model's loaded weights are held to `KVLAB_MAX_MODEL_MB`
  (4,096 MiB by default on a public server), read from the hub before anything is downloaded;
- a needle length of `1e999` (or 400 nines) raised a raw OverflowError in the cost check, and two lengths of
  `1e308` one in the scheduler (a float division of a whole number past any float): gradio's generic error; a
  huge but finite length gave a refusal whose 300-digit count pushed the setting's name past the 400-character
  cut; a needle run's `no_cache` columns were costed as if they had a cache (32 forwards of a 4k sequence
  counted as one prefill: about 30 times the cap, measured 163 s for a 512-token, 32-token grid costed 64 steps);
- a prompt was tokenized whole before its token count was checked: a 20 MB chat message took 58 s of CPU and a
  2 MB system prompt raised the app's memory by 1.9 GiB, each only to be refused (any text field of any tab);
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


@pytest.mark.parametrize("lengths", ["1e999", "9" * 400, "1e308,1e308", "1e308k"])
def test_a_huge_needle_length_is_refused_in_one_line(lengths):
    from kvlab.needle.grid import parse_tokens
    from kvlab.sharing.limits import Limits
    from kvlab.sharing.scheduler import Refused, Scheduler

    cost = AgentTools(pool=None).needle_cost("dynamic", lengths, "0", "0", 1)  # never a raw OverflowError
    try:
        Scheduler(Limits()).admit("someone", cost)
    except Refused as refused:
        assert "KVLAB_MAX_RUN_STEPS" in str(refused)
        assert_one_printable_line(str(refused))
    else:
        with pytest.raises(ValueError) as refused:  # let through as unreadable: the grid's own line
            parse_tokens(lengths)
        assert_one_printable_line(str(refused.value))


def test_a_cost_past_any_float_is_refused_naming_its_setting():
    from kvlab.sharing.cost import RunCost
    from kvlab.sharing.limits import Limits
    from kvlab.sharing.scheduler import Refused, Scheduler

    cost = RunCost(columns=8, new_tokens=32, prompt_tokens=10 ** 320, full_sequence_columns=1)
    with pytest.raises(Refused) as refused:
        Scheduler(Limits()).admit("someone", cost)
    assert "KVLAB_MAX_RUN_STEPS" in str(refused.value) and "about 10^" in str(refused.value)
    assert_one_printable_line(str(refused.value))


def test_a_needle_run_counts_its_no_cache_columns_rereading_their_sequence():
    from kvlab.sharing.cost import RunCost

    tools = AgentTools(pool=None)
    cached = tools.needle_cost("dynamic", "4k", "0", "0", 32)
    uncached = tools.needle_cost("no_cache", "4k", "0", "0", 32)
    assert uncached.steps == RunCost(columns=1, new_tokens=32, prompt_tokens=4096, full_sequence_columns=1).steps
    assert uncached.steps > 20 * cached.steps  # 32 forwards of the whole 4k sequence, not one prefill


class CountingTokenizer:
    """A tokenizer that must not be asked to read anything."""

    chat_template = "{{ messages }}"

    def __call__(self, *args, **kwargs):
        raise AssertionError("the tokenizer read a prompt past the character cap")

    apply_chat_template = __call__


@pytest.mark.parametrize("prompt, system", [
    ("w" * 20_000_000, ""),
    ("hi", "word " * 400_000),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 2_000_000}], ""),
])
def test_a_prompt_past_the_character_cap_is_refused_before_the_tokenizer_reads_it(prompt, system):
    from kvlab.generation import encode_prompt

    with pytest.raises(ValueError) as refused:
        encode_prompt(CountingTokenizer(), prompt, system)
    assert "KVLAB_MAX_PROMPT_TOKENS" in str(refused.value)
    assert_one_printable_line(str(refused.value))


def test_a_prompt_within_the_character_cap_is_read(tiny_tokenizer):
    from kvlab.generation import MAX_PROMPT_TOKENS, encode_prompt

    ids = encode_prompt(tiny_tokenizer, "a b c " * 100, chat=False)
    assert 0 < ids.shape[1] <= MAX_PROMPT_TOKENS


@pytest.mark.parametrize("field", [7, ["a"], {"source": "bundled"}])
def test_a_model_field_that_is_not_text_is_one_line(field):
    """Round 8, left open by the tester and fixed after: a raw API call sending a number or a list as a tab's
    Model value crashed `ModelSpec.from_field` on `.strip` (gradio's generic error)."""
    from kvlab.models.loading import ModelSpec

    with pytest.raises(ValueError, match="must be text") as refused:
        ModelSpec.from_field(field)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="dtype must be one of") as refused:
        ModelSpec("bundled", "x" * 5000)
    assert len(str(refused.value)) < 200


def test_an_inspect_run_is_costed_for_its_three_caches_and_its_heavy_steps():
    """Round 8, left open by the tester and fixed after: an Inspect run was costed as 2 columns of plain decode
    steps, while it prefills three caches (its session and the lockstep pair) and each step (hooks, the pair,
    per-layer diagnostics) took 0.38 s after a 64-token prompt and 0.97 s after 2,048, about 4 and 11 token
    steps; an Inspect run near the prompt cap held the model far past its cost."""
    from kvlab.sharing.cost import PREFILL_TOKENS_PER_STEP, prompt_tokens
    from kvlab.ui.hosting.costs import INSPECT_CACHES, inspect_cost

    assert INSPECT_CACHES == 3
    for words, measured_steps_per_step in ((10, 4.4), (1500, 11)):
        text = " ".join(["word"] * words)
        prompt = prompt_tokens(text)
        one, ten = inspect_cost(1, text).steps, inspect_cost(11, text).steps
        assert (ten - one) / 10 >= measured_steps_per_step  # each step at least what it measured
        assert one >= INSPECT_CACHES * prompt / PREFILL_TOKENS_PER_STEP  # three prefills
