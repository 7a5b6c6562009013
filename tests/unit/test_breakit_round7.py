"""Break-it round 7 (issue 45, round 6's fixes re-attacked as a public Space): each test pins one finding and
fails on the code it was found on.

- an API or MCP refusal echoed what it was given: a prompt or preset name with newlines, escape sequences or a
  lone surrogate came back as several lines, a terminal escape, or a reply gradio could not encode, and the
  page's `compare` API refusals arrived quoted (`gr.Error`'s repr);
- a knob value was any YAML: `label=2024-01-01` made the column's label a date, `nbits=[4]` a list,
  `max_cache_len=1e999` infinity and `n_sink=99999999999999999999` past int64, each failing later as a raw
  Python error instead of one line naming the knob;
- `static:max_cache_len=10000000000` allocated its cache in the warm-up (a preallocating cache takes all of its
  memory at once): one anonymous request can take the machine's memory;
- `expected_attention:n_future_positions=...` had no cap, and its averaged rotary matrix stacked one
  (head_dim, head_dim) matrix per future position (16 KiB each): 10**6 positions are 16 GiB;
- the client's address was the first X-Forwarded-For hop on a Space, which the client writes itself: a new
  one per run made one client many (per-client caps and the fair order bypassed) (tests/unit/test_turns.py);
- the Report tab read every saved record picked at once, however many.
"""

import types

import pytest

gr = pytest.importorskip("gradio")
torch = pytest.importorskip("torch")

from kvlab.eviction import scoring  # noqa: E402
from kvlab.strategies import make_strategy  # noqa: E402
from kvlab.strategies.base import StrategyError, parse_strategy_item  # noqa: E402
from kvlab.strategies.knob_yaml import MESSAGE_CHARS, brief  # noqa: E402
from kvlab.strategies.static import MAX_CACHE_LEN  # noqa: E402
from kvlab.ui.hosting.tools import AgentTools  # noqa: E402
from kvlab.ui.hosting.turns import ToolError  # noqa: E402
from kvlab.ui.report.view import MAX_SAVED_RECORDS, rows_from_files  # noqa: E402

pytestmark = pytest.mark.unit

HOSTILE = "line one\nline two\x1b[2J\x00\ud800" + "x" * 5000


def assert_one_printable_line(text: str) -> None:
    assert len(text) <= MESSAGE_CHARS, len(text)
    assert text.isprintable(), repr(text[:200])
    text.encode("utf-8")  # no lone surrogate: gradio and an MCP client must be able to encode it


def test_a_refusal_is_one_printable_line_unquoted():
    error = ToolError(f"unknown preset {HOSTILE}")
    assert_one_printable_line(str(error))
    assert str(error).startswith("unknown preset line one line two\\x1b[2J\\x00\\ud800")
    assert brief("plain words") == "plain words"


@pytest.mark.parametrize("call", [
    lambda tools: tools.compare_cost("dynamic", HOSTILE, max_new_tokens=HOSTILE),
    lambda tools: tools.compare_strategies(HOSTILE, "hi"),
    lambda tools: tools.plan(model="bundled", contexts="1k", strategies=f"sink:window_length={HOSTILE[:900]}"),
    lambda tools: tools.diverge_cost("dynamic", "hi", steps=HOSTILE),
])
def test_every_tool_refusal_is_one_printable_line(call):
    with pytest.raises(gr.Error) as refused:
        call(AgentTools(pool=None))
    assert_one_printable_line(str(refused.value))
    assert not str(refused.value).startswith("'")


def test_the_compare_api_refuses_an_unknown_preset_unquoted():
    from kvlab.ui.compare.extras import CompareApi

    api = CompareApi.__new__(CompareApi)
    api.presets = {"quickstart": None}
    with pytest.raises(gr.Error) as refused:
        api.cost(HOSTILE)
    assert_one_printable_line(str(refused.value))
    assert str(refused.value).startswith("unknown preset 'line one")


@pytest.mark.parametrize("text, said", [
    ("sink:window_length=[64]", "a list"),
    ("sink:window_length={a}", "a dict"),
    ("sink:window_length=2024-01-01", "a date"),
    ("sink:window_length=.inf", "not a finite number"),
    ("sink:window_length=.nan", "not a finite number"),
    ("sink:window_length=99999999999999999999", "largest whole number"),
])
def test_a_knob_value_of_a_kind_no_knob_takes_is_one_line_naming_it(text, said):
    with pytest.raises(StrategyError) as refused:
        make_strategy(parse_strategy_item(text))
    assert said in str(refused.value) and "window_length" in str(refused.value)
    assert_one_printable_line(str(refused.value))


def test_a_label_is_the_text_written_and_only_text():
    strategy = make_strategy(parse_strategy_item("dynamic:label=2024-01-01"))
    assert strategy.label == "2024-01-01" and strategy.describe() == "2024-01-01"
    with pytest.raises(StrategyError, match="label"):
        make_strategy({"strategy": "dynamic", "label": ["<b>x</b>"]})  # a preset's or record's label


def test_a_static_cache_past_the_cap_is_refused_before_anything_is_allocated():
    assert MAX_CACHE_LEN >= 2 * (8192 + 4096)
    make_strategy({"strategy": "static", "max_cache_len": MAX_CACHE_LEN})
    for name in ("static", "offloaded_static"):
        with pytest.raises(StrategyError, match="KVLAB_MAX_PROMPT_TOKENS") as refused:
            make_strategy({"strategy": name, "max_cache_len": 10_000_000_000})
        assert_one_printable_line(str(refused.value))


def test_expected_attention_caps_its_future_positions():
    make_strategy({"strategy": "expected_attention", "n_future_positions": 65_536})
    with pytest.raises(StrategyError, match="n_future_positions"):
        make_strategy({"strategy": "expected_attention", "n_future_positions": 65_537})


def stacked_average(rotary, head_dim: int, seq: int, count: int) -> torch.Tensor:
    """kvpress's averaged rotation: one (head_dim, head_dim) matrix per future position, stacked, then averaged."""
    positions = torch.arange(seq, seq + count)[None]
    cos, sin = rotary(torch.zeros(1, 1, head_dim), positions)
    cos, sin = cos[0], sin[0]
    eye = torch.eye(head_dim)
    swap = torch.zeros_like(eye)
    half = head_dim // 2
    swap[half:, :half], swap[:half, half:] = torch.eye(half), -torch.eye(half)
    return (cos.unsqueeze(1) * eye + sin.unsqueeze(1) * swap).mean(dim=0)


def test_the_averaged_rotation_is_kvpress_figure_without_stacking_matrices(monkeypatch):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, rope_theta=100000.0)
    rotary = LlamaRotaryEmbedding(config)
    inputs = types.SimpleNamespace(attention=types.SimpleNamespace(head_dim=64),
                                   hidden_states=torch.zeros(1, 3, 576), rotary=rotary)
    for seq, count in ((3, 1), (100, 512), (4000, 4096)):
        ours = scoring._averaged_rotation(inputs, seq, count)
        torch.testing.assert_close(ours, stacked_average(rotary, 64, seq, count), rtol=0, atol=1e-6)
    big = torch.zeros(0)
    real_mean = torch.Tensor.mean

    def watched_mean(self, *args, **kwargs):
        nonlocal big
        big = self if self.numel() > big.numel() else big
        return real_mean(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "mean", watched_mean)
    scoring._averaged_rotation(inputs, 10, 65_536)
    assert big.numel() <= 65_536 * 64  # the rotary table itself, not 65,536 matrices of 64 x 64


def test_the_report_refuses_more_saved_records_than_one_load_merges(tmp_path):
    paths = [str(tmp_path / f"r{i}.json") for i in range(MAX_SAVED_RECORDS + 1)]
    rows, problems = rows_from_files(paths)  # the files do not even exist: nothing is read
    assert rows == [] and len(problems) == 1
    assert "MAX_SAVED_RECORDS" in problems[0] and str(MAX_SAVED_RECORDS + 1) in problems[0]
    rows, problems = rows_from_files(paths[:2])
    assert len(problems) == 2  # under the cap each file is read (and these say they are missing)
