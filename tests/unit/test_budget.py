"""Resilient generation on the tiny random Llama: a budget that forces two switches at the predicted tokens,
the text before each switch kept, an injected CUDA out-of-memory error taking the same path, the default
chain, the fidelity of a budgeted run and the budget's input checks."""

import json

import pytest
import torch

from kvlab.accounting import bytes_per_token
from kvlab.budget import MAX_FALLBACKS, Budget, default_chain, format_chain, parse_budget, parse_chain
from kvlab.columns import Column
from kvlab.compare.events import FallbackSwitched, TokenEvent
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings
from kvlab.compare.preset import parse_preset
from kvlab.strategies import StrategyError, make_strategy
from kvlab.strategies.dynamic import Dynamic
from kvlab.strategies.sink import Sink

PROMPT = torch.tensor([[1, 400, 401, 402, 403, 404]])
SETTINGS = GenerationSettings(max_new_tokens=80, stop_at_eos=False)
BUDGET_KIB = 12
CHAIN = [{"strategy": "quantized", "backend": "hqq", "nbits": 4, "residual_length": 4},
         {"strategy": "sink", "window_length": 8, "num_sink_tokens": 2}]


def budgeted(budget_kib=BUDGET_KIB, fallback=CHAIN):
    return {"strategy": "dynamic", "budget_mib": budget_kib / 1024, "fallback": fallback}


@pytest.fixture(scope="module")
def run(tiny):
    events = list(run_compare(tiny, PROMPT, [{"strategy": "dynamic"}, budgeted()], SETTINGS))
    return events, events[-1].results


def test_a_budget_forces_two_switches_at_the_predicted_tokens(tiny, run):
    events, (free, column) = run
    budget = BUDGET_KIB * 1024
    per_token = bytes_per_token(tiny.config, tiny.model.dtype)
    assert column.status == "ok" and len(column.token_ids) == SETTINGS.max_new_tokens
    assert column.budget_bytes == budget
    assert [f["to"] for f in column.fallbacks] == ["quantized hqq int4 r4", "sink 2+6"]
    assert [f["from"] for f in column.fallbacks] == ["dynamic", "quantized hqq int4 r4"]
    # The prediction before step i: the dynamic cache will hold prompt + i tokens (exact); the quantized one
    # what it holds now plus the next token at full precision (its residual).
    steps = range(len(column.cache_bytes))
    first = next(i for i in steps if per_token * (PROMPT.shape[1] + i) > budget)
    second = next(i for i in steps if i > first + 1 and column.cache_bytes[i - 1] + per_token > budget)
    at = [f["at_token"] for f in column.fallbacks]
    assert at == [first, second] and first == 7  # 6 + 7 = 13 tokens of 1 KiB > 12 KiB
    for switch in column.fallbacks:
        assert switch["bytes_before"] == column.cache_bytes[switch["at_token"] - 1]
        assert switch["bytes_after"] == column.cache_bytes[switch["at_token"]] < budget
        assert "> budget 12.0 KiB" in switch["reason"]
    assert max(column.cache_bytes) <= budget
    assert all(size == column.cache_bytes[-1] for size in column.cache_bytes[at[1]:])  # the sink window is full
    switched = [e for e in events if isinstance(e, FallbackSwitched)]
    assert [e.fallback["at_token"] for e in switched] == at and {e.column for e in switched} == {1}
    assert "switched to quantized hqq int4 r4 at token 7" in column.message
    json.dumps(column.to_json())


def test_the_text_before_each_switch_is_kept(run):
    events, (free, column) = run
    first = column.fallbacks[0]["at_token"]
    assert column.token_ids[:first] == free.token_ids[:first]
    streamed = [e.token_id for e in events if isinstance(e, TokenEvent) and e.column == 1]
    assert streamed == column.token_ids
    for switch in column.fallbacks:
        before = [e for e in events if isinstance(e, TokenEvent) and e.column == 1 and e.step < switch["at_token"]]
        assert [e.token_id for e in before] == column.token_ids[:switch["at_token"]]


def test_a_budgeted_run_is_scored_whole_against_the_unbudgeted_column(run):
    _, (free, column) = run
    assert free.is_baseline and not column.is_baseline
    assert column.top1_agreement is not None and column.mean_kl is not None and column.mean_kl > 0
    assert column.fidelity_tokens == SETTINGS.max_new_tokens
    assert column.lossy


class OutOfMemoryAt(Dynamic):
    """A dynamic cache whose forward raises CUDA's out-of-memory error at one step, as a GPU would."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def forward(self, loaded, cache, sequence, new_tokens):
        self.calls += 1
        if self.calls == self.fail_at + 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return super().forward(loaded, cache, sequence, new_tokens)


def test_an_injected_cuda_out_of_memory_error_falls_back_and_goes_on(tiny):
    settings = GenerationSettings(max_new_tokens=12, stop_at_eos=False)
    chain = (make_strategy(CHAIN[0]),)
    columns = [{"strategy": "dynamic"}, Column(OutOfMemoryAt(5), budget=Budget(None, chain))]
    done = collect(run_compare(tiny, PROMPT, columns, settings))
    free, column = done.results
    assert column.status == "ok" and len(column.token_ids) == 12
    (switch,) = column.fallbacks
    assert switch["at_token"] == 5 and switch["to"] == "quantized hqq int4 r4"
    assert switch["reason"].startswith("out of memory during the step (CUDA out of memory")
    assert switch["bytes_before"] > 0 and switch["bytes_after"] == column.cache_bytes[5]
    assert column.token_ids[:5] == free.token_ids[:5]
    assert column.name == "dynamic · OOM fallback"


class SinkOutOfMemory(Sink):
    """A sink strategy whose every forward runs out of CUDA memory."""

    def forward(self, loaded, cache, sequence, new_tokens):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")


def test_out_of_memory_with_no_chain_left_ends_the_column_with_the_error(tiny):
    settings = GenerationSettings(max_new_tokens=8, stop_at_eos=False)
    column = Column(OutOfMemoryAt(2), budget=Budget(None, (SinkOutOfMemory(),)))
    done = collect(run_compare(tiny, PROMPT, [column, {"strategy": "dynamic"}], settings))
    assert done.results[0].status == "error" and "CUDA out of memory" in done.results[0].message
    assert done.results[0].token_ids == done.results[1].token_ids[:2]
    assert done.results[1].status == "ok"


def test_over_budget_with_nothing_left_says_so_and_finishes(tiny):
    done = collect(run_compare(tiny, PROMPT, [{"strategy": "sink", "window_length": 16, "budget_mib": 4 / 1024}],
                               GenerationSettings(max_new_tokens=6, stop_at_eos=False)))
    (column,) = done.results
    assert column.status == "ok" and column.fallbacks == []
    assert "no smaller cache is left in the fallback chain" in column.message


def test_the_default_chain_follows_the_column_and_fits_the_budget(tiny):
    per_token = bytes_per_token(tiny.config, tiny.model.dtype)
    chain = default_chain(tiny, make_strategy({"strategy": "dynamic"}), 64 * per_token)
    assert [s.name for s in chain] == ["quantized", "sink"]  # offloaded only on CUDA
    assert chain[0].backend == "hqq" and chain[0].nbits == 4 and chain[0].residual_length == 16
    assert chain[1].window_length == 32
    assert [s.name for s in default_chain(tiny, make_strategy({"strategy": "quantized"}), None)] == ["sink"]
    assert default_chain(tiny, make_strategy({"strategy": "sink"}), None) == []
    assert [s.name for s in default_chain(tiny, make_strategy({"strategy": "static"}), None)] == ["quantized", "sink"]


def test_a_budget_without_a_chain_uses_the_default_one(tiny):
    done = collect(run_compare(tiny, PROMPT, [budgeted(budget_kib=10, fallback=None)], SETTINGS))
    (column,) = done.results
    assert column.status == "ok"
    assert [f["to"].split()[0] for f in column.fallbacks][:1] == ["quantized"]


@pytest.mark.parametrize("budget_mib,fallback,message", [
    (0, None, "budget_mib must be a number of MiB in (0,"),
    (-1, None, "budget_mib must be a number"),
    ("four", None, "got 'four'"),
    (True, None, "got True"),
    (4, [], "fallback must list at least one strategy"),
    (4, "no_cache", "no_cache keeps no cache"),
    (4, "quantized:nbits=3", "nbits=3 is not supported"),
    (4, "mystery", "unknown strategy 'mystery'"),
    (4, " > ".join(["sink"] * (MAX_FALLBACKS + 1)), f"at most {MAX_FALLBACKS}"),
])
def test_bad_budgets_and_chains_say_what_to_fix(budget_mib, fallback, message):
    with pytest.raises(StrategyError, match=message.replace("(", r"\(")):
        parse_budget(budget_mib, fallback)


def test_chains_read_the_command_line_syntax_and_print_it_back():
    chain = parse_chain("quantized:backend=hqq:residual_length=32 > sink:window_length=64")
    assert [(s.name, s.describe()) for s in chain] == [("quantized", "quantized hqq int4 r32"),
                                                       ("sink", "sink 4+60")]
    assert format_chain(chain) == "quantized:backend=hqq:residual_length=32 > sink:window_length=64"
    assert parse_chain(format_chain(chain)) == chain
    assert parse_budget() is None
    assert parse_budget(2.5).budget_bytes == int(2.5 * 1024 * 1024)


def test_column_specs_presets_and_no_cache(tiny):
    column = Column.from_spec(budgeted())
    assert column.budget.budget_bytes == BUDGET_KIB * 1024 and column.describe() == "dynamic · budget 12.0 KiB"
    assert Column.from_spec({**budgeted(), "generation": {"max_new_tokens": 4}}).overrides == {"max_new_tokens": 4}
    with pytest.raises(StrategyError, match="no_cache keeps no cache, so a budget"):
        Column.from_spec({"strategy": "no_cache", "budget_mib": 4})
    with pytest.raises(StrategyError, match="a column also takes generation, budget_mib, fallback"):
        Column.from_spec({"strategy": "dynamic", "budget": 4})
    preset = parse_preset({"name": "p", "prompt": {"text": "hi"}, "columns": [budgeted()]})
    assert preset.build_columns()[0].budget == column.budget


def test_a_chat_under_a_budget_switches_mid_reply_and_keeps_the_smaller_cache(tiny):
    from kvlab.chat.session import ChatSession, ChatTurnDone
    from kvlab.ui.chat.view import ChatForm, ready_session

    form = ChatForm(strategy_name="dynamic", max_new_tokens=24, measure=False, budget_text=str(40 / 1024),
                    fallback_text="quantized:backend=hqq:residual_length=4 > sink:window_length=32")
    state = ready_session(None, tiny, form)
    session: ChatSession = state.session
    first = [e for e in session.send("Tell me about the sea.", baseline=False) if isinstance(e, ChatTurnDone)][0]
    (switch,) = first.stats.fallbacks
    assert switch["from"] == "dynamic" and switch["to"] == "quantized hqq int4 r4"
    assert "switched to quantized hqq int4 r4 at token" in first.stats.note
    assert session.strategy.name == "quantized" and session.picked.name == "dynamic"
    assert [s.name for s in session.budget.fallback] == ["sink"]
    assert first.stats.cache_tokens == len(session.cached_ids)
    ready_session(state, tiny, form)  # the same form again: the switched cache and what is left of the chain stay
    assert session.strategy.name == "quantized" and [s.name for s in session.budget.fallback] == ["sink"]
    second = [e for e in session.send("And the mountains?", baseline=False) if isinstance(e, ChatTurnDone)][0]
    assert second.stats.action == "rebuild" or second.stats.reused_tokens > 0
    assert session.strategy.name in ("quantized", "sink")


def test_the_chat_command_reads_a_budget_from_its_strategy():
    from kvlab.cli.chat import CliInputError, parse_chat_strategy

    strategy, budget = parse_chat_strategy("dynamic:budget_mib=4", "quantized:backend=hqq>sink")
    assert strategy.name == "dynamic" and budget.budget_bytes == 4 << 20
    assert [s.name for s in budget.fallback] == ["quantized", "sink"]
    assert parse_chat_strategy("sink:window_length=64") == (make_strategy({"strategy": "sink", "window_length": 64}),
                                                            None)
    with pytest.raises(CliInputError, match="--fallback needs a budget"):
        parse_chat_strategy("dynamic", "sink")
    with pytest.raises(StrategyError, match="budget_mib must be a number"):
        parse_chat_strategy("dynamic:budget_mib=0")
