"""What a scored-eviction column holds, counted three ways that must agree on the tiny models: the run itself,
`held_tokens_after` (what a column's budget and Plan predict), and the "view code" snippet run with plain
`generate()`; with target_tokens / target_mib, query-agnostic questions and compress_every."""

import pytest
import torch

from kvlab.accounting import bytes_per_token
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.strategies import make_strategy

PROMPT_TOKENS = 40
NEW_TOKENS = 14
SPECS = [
    {"strategy": "knorm", "compression_ratio": 0.5},
    {"strategy": "knorm", "target_tokens": 1000, "compress_every": 3},
    {"strategy": "knorm", "target_tokens": 12, "compress_every": 5, "query_aware": False, "question_tokens": 7},
    {"strategy": "tova", "compression_ratio": 0.25, "query_aware": False, "question_tokens": 7},
    {"strategy": "tova", "compression_ratio": 0.5, "query_aware": False, "question_tokens": 7, "compress_every": 5},
    {"strategy": "expected_attention", "target_mib": 0.02, "compress_every": 6},
    {"strategy": "pyramidkv", "window_size": 4, "target_tokens": 20, "compress_every": 5},
    {"strategy": "pyramidkv", "window_size": 4, "target_mib": 0.02},
]


def decode(loaded, strategy, new_tokens=NEW_TOKENS):
    ids = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    cache = strategy.build_cache(loaded, PROMPT_TOKENS + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    decoder = Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True)
    return cache, decoder


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: make_strategy(spec).describe())
def test_held_tokens_after_matches_the_run_at_every_step(tiny, spec):
    strategy = make_strategy(spec)
    cache, decoder = decode(tiny, strategy)
    config, dtype = tiny.config, tiny.model.dtype
    for step in decoder:
        fed_after = step.seen_tokens - PROMPT_TOKENS
        expected = [strategy.held_tokens_after(PROMPT_TOKENS, fed_after, i, config, dtype)
                    for i in range(len(cache.layers))]
        assert [layer.keys.shape[2] for layer in cache.layers] == expected, step.index


def test_an_absolute_budget_is_the_target_also_after_a_shorter_prompt(tiny):
    """target_tokens 50 on a 40-token prompt keeps it whole, lets the cache grow to 50 and compresses it back to
    50 (never to the prompt's 40) every 4 tokens."""
    strategy = make_strategy({"strategy": "knorm", "target_tokens": 50, "compress_every": 4})
    cache, decoder = decode(tiny, strategy, new_tokens=30)
    held = []
    for _ in decoder:
        held.append(cache.layers[0].keys.shape[2])
    assert held[:11] == list(range(40, 51))  # the prompt whole, then every token up to the budget
    assert min(held[11:]) == 50 and max(held[11:]) == 53 and held[-1] == 51  # 29 fed: 50 + 29 - 28


@pytest.mark.parametrize("spec", [spec for spec in SPECS[1:] if spec["strategy"] != "pyramidkv"],
                         ids=lambda spec: make_strategy(spec).describe())
def test_plan_counts_what_the_run_holds(tiny, spec):
    from kvlab.plan.planner import PlanRequest, plan

    strategy = make_strategy(spec)
    cache, decoder = decode(tiny, strategy)
    steps = list(decoder)
    context = steps[-1].seen_tokens
    result = plan(PlanRequest(model=tiny.config, contexts=(context,), prefill_tokens=PROMPT_TOKENS, dtype="float32",
                              strategies=(spec,))).to_json()["strategies"][0]
    assert result["status"] == "ok", result["message"]
    assert result["contexts"][0]["cache_bytes"] == steps[-1].cache_bytes


def test_plan_says_it_cannot_measure_per_layer_budgets_without_blaming_the_model():
    from kvlab.plan.planner import PlanRequest, plan

    result = plan(PlanRequest(contexts=(1024,), dtype="float32", strategies=({"strategy": "pyramidkv"},))).to_json()
    message = result["strategies"][0]["message"]
    assert message.startswith("pyramidkv 0.5: Plan measures one layer per group") and "cannot serve" not in message


def test_a_budgeted_eviction_column_is_predicted_from_what_it_keeps(tiny):
    """A knorm column whose budget is below the dense prompt but above what it keeps never switches; with
    compress_every it stays under a budget plain knorm outgrows."""
    from kvlab.compare.runner import run_compare
    from kvlab.protocol import collect

    per_token = bytes_per_token(tiny.config, tiny.model.dtype)
    prompt = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    settings = GenerationSettings(max_new_tokens=30, stop_at_eos=False, fidelity=False)
    budget_mib = 30 * per_token / 2**20  # 40-token dense prompt > 30 > 20 kept + 9
    fallback = [{"strategy": "sink", "window_length": 8, "num_sink_tokens": 2}]
    columns = [{"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 10, "budget_mib": budget_mib,
                "fallback": fallback},
               {"strategy": "knorm", "compression_ratio": 0.5, "budget_mib": budget_mib, "fallback": fallback}]
    every, plain = collect(run_compare(tiny, prompt, columns, settings)).results
    assert every.status == "ok" and not every.fallbacks and max(every.cache_bytes) <= 29 * per_token
    assert [f["at_token"] for f in plain.fallbacks] == [11]  # 20 kept + 10 decoded = 30, the 11th goes over
    assert plain.fallbacks[0]["bytes_before"] == 30 * per_token


@pytest.mark.parametrize("spec", [
    {"strategy": "knorm", "target_mib": 0.01},
    {"strategy": "knorm", "target_mib": 0.02, "compress_every": 4},
    {"strategy": "pyramidkv", "window_size": 4, "target_tokens": 20},
    {"strategy": "pyramidkv", "window_size": 4, "target_mib": 0.02, "compress_every": 5},
    {"strategy": "tova", "target_tokens": 60, "compress_every": 3},
    {"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 10},
    {"strategy": "expected_attention", "compression_ratio": 0.5, "compress_every": 10},
    {"strategy": "snapkv", "window_size": 8, "compression_ratio": 0.5, "compress_every": 10},
], ids=lambda spec: make_strategy(spec).describe())
@pytest.mark.parametrize("model", ["tiny", "tiny_hybrid"])
def test_view_code_runs_and_reproduces_budgeted_columns(request, spec, model):
    """The snippet's cache line and `with prune_at_prefill(...)` (with compress_every / compress_to where set)
    around plain `generate()` give the column's tokens and per-layer sizes."""
    from kvlab.ui.shared.code import code_snippet

    loaded = request.getfixturevalue(model)
    strategy = make_strategy(spec)
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    snippet = code_snippet(strategy, settings, "hello", chat=False)
    compile(snippet, "snippet", "exec")
    imports, call = strategy.prune_code()
    cache_imports, cache_line = strategy.cache_code()
    assert f"with {call}:" in snippet and cache_line.split("  #")[0] in snippet
    namespace = {"model": loaded.model}
    exec("\n".join([*imports, *cache_imports, cache_line]), namespace)
    ids = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    with eval(call, namespace):
        out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=namespace["cache"],
                                    max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    cache, decoder = decode(loaded, strategy)
    assert out[0, PROMPT_TOKENS:].tolist() == [step.token_id for step in decoder]
    assert [layer.keys.shape[2] for layer in namespace["cache"].layers] == [layer.keys.shape[2]
                                                                           for layer in cache.layers]


def test_the_caveat_with_compress_every_says_the_cache_is_compressed_while_decoding():
    strategy = make_strategy({"strategy": "tova", "target_tokens": 1000, "compress_every": 2})
    caveat = strategy.caveat_for(14)
    assert caveat.startswith("nothing was pruned at prefill: target_tokens=1000 keeps all 14")
    assert "every 2 tokens fed after the prompt" in caveat and "dynamic's" not in caveat


def test_a_needle_column_that_cannot_take_the_prompt_says_why_in_its_own_words(tiny):
    from kvlab.needle.grid import parse_grid
    from kvlab.needle.runner import run_needle

    grid = parse_grid(["160"], [0.5], [0], 2)
    specs = [{"strategy": "dynamic"}, {"strategy": "tova", "query_aware": False, "question_tokens": 1000},
             {"strategy": "snapkv", "window_size": 300}]
    done = list(run_needle(tiny, specs, grid))[-1]
    messages = [column["message"] for column in done.record["columns"]]
    assert messages[1].startswith("question_tokens (1000) must be less than the prompt's")
    assert messages[2].startswith("snapkv needs a prompt longer than window_size=300")
    assert messages[0] == ""


def test_inspect_loop_code_annotates_the_true_positions_a_pruned_cache_is_fed():
    from kvlab.ui.shared.code import loop_snippet

    strategy = make_strategy({"strategy": "knorm", "compress_every": 4})
    settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False, fidelity=False)
    code = loop_snippet(strategy, settings, "hello", values={"position_ids": "[[54]]", "past": "27"})
    compile(code, "loop", "exec")
    assert "position_ids = cache_position[None]" not in code
    annotated = [line for line in code.splitlines() if "# ← [[54]]" in line]
    assert len(annotated) == 1 and "torch.arange(sequence.shape[1] - input_ids.shape[1]" in annotated[0]
    dynamic = loop_snippet(make_strategy({"strategy": "dynamic"}), settings, "hello", values={"position_ids": "[[5]]"})
    assert "position_ids = cache_position[None]  # ← [[5]]" in dynamic
