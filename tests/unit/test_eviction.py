"""Scored eviction at prefill on the tiny model: kept counts per head, exact bytes, true positions after
pruning, hooks removed on errors, budget knobs and validation messages."""

import pytest
import torch

from kvlab.accounting import bytes_per_token, cache_bytes
from kvlab.engine import Decoder
from kvlab.eviction.prefill import prune_at_prefill
from kvlab.eviction.scoring import kept_tokens, pyramid_kept_tokens
from kvlab.generation import GenerationSettings
from kvlab.strategies import STRATEGIES, StrategyError, make_strategy
from kvlab.strategies.scored import ScoredEviction

EVICTING = [name for name, cls in STRATEGIES.items() if issubclass(cls, ScoredEviction)]  # the kvpress presses
SMALL_WINDOW = {"snapkv": {"window_size": 8}, "pyramidkv": {"window_size": 8}}
PROMPT_TOKENS = 60
NEW_TOKENS = 4


def run(tiny, spec, prompt_tokens=PROMPT_TOKENS, new_tokens=NEW_TOKENS, trace=False):
    strategy = make_strategy(spec)
    ids = torch.arange(10, 10 + prompt_tokens)[None]
    cache = strategy.build_cache(tiny, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    decoder = Decoder(tiny, strategy, cache, ids, settings, measure_bytes=True, trace=trace)
    steps = list(decoder)
    return strategy, cache, steps


def test_the_registry_has_the_kvpress_methods():
    assert set(EVICTING) == {"snapkv", "pyramidkv", "tova", "observed_attention", "knorm", "expected_attention",
                             "random"}


@pytest.mark.parametrize("name", EVICTING)
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_each_head_keeps_the_ratio_and_bytes_are_exact(tiny, name, ratio):
    strategy, cache, steps = run(tiny, {"strategy": name, "compression_ratio": ratio, **SMALL_WINDOW.get(name, {})})
    layers = tiny.config.num_hidden_layers
    per_layer_token = bytes_per_token(tiny.config, tiny.model.dtype) // layers
    kept = [strategy.kept_tokens(PROMPT_TOKENS, i, tiny.config, tiny.model.dtype) for i in range(layers)]
    if name != "pyramidkv":
        assert kept == [kept_tokens(PROMPT_TOKENS, ratio)] * layers == [int(PROMPT_TOKENS * (1 - ratio))] * layers
    decoded = NEW_TOKENS - 1
    for i, layer in enumerate(cache.layers):
        assert tuple(layer.keys.shape) == (1, tiny.config.num_key_value_heads, kept[i] + decoded, 64)
        record = cache.eviction.layers[i]
        assert record.kept.shape == (tiny.config.num_key_value_heads, kept[i])
        assert record.scores.shape == (tiny.config.num_key_value_heads, PROMPT_TOKENS)
        assert cache.eviction.kept_mask(i).sum(-1).tolist() == [kept[i]] * tiny.config.num_key_value_heads
    assert steps[-1].cache_bytes == cache_bytes(cache) == per_layer_token * (sum(kept) + decoded * layers)


@pytest.mark.parametrize("name", EVICTING)
def test_decode_runs_at_true_positions_after_pruning(tiny, name):
    _, cache, steps = run(tiny, {"strategy": name, **SMALL_WINDOW.get(name, {})}, trace=True)
    step = steps[1].trace.forwards[0]
    assert step.position_ids == (PROMPT_TOKENS, PROMPT_TOKENS)
    assert step.past_tokens == cache.eviction.layers[0].kept_tokens < PROMPT_TOKENS


def test_ratio_zero_keeps_every_position_and_matches_dynamic(tiny):
    _, _, pruned = run(tiny, {"strategy": "knorm", "compression_ratio": 0.0}, new_tokens=6)
    _, _, dense = run(tiny, {"strategy": "dynamic"}, new_tokens=6)
    assert [s.token_id for s in pruned] == [s.token_id for s in dense]
    assert [s.cache_bytes for s in pruned] == [s.cache_bytes for s in dense]


def test_hooks_are_removed_after_a_scoring_error(tiny):
    attentions = [layer.self_attn for layer in tiny.model.model.layers]
    before = [len(a._forward_hooks) for a in attentions]  # transformers may keep its own output-capture hooks

    def failing(inputs):
        raise RuntimeError("scoring failed")

    with pytest.raises(RuntimeError, match="scoring failed"):
        with prune_at_prefill(tiny.model, failing, lambda seq, layer: seq):
            assert [len(a._forward_hooks) for a in attentions] == [n + 1 for n in before]
            tiny.model(input_ids=torch.arange(5, 25)[None], use_cache=True)
    assert [len(a._forward_hooks) for a in attentions] == before


def test_target_tokens_and_target_mib_set_the_kept_count(tiny):
    _, cache, _ = run(tiny, {"strategy": "knorm", "target_tokens": 17}, new_tokens=1)
    assert [layer.keys.shape[2] for layer in cache.layers] == [17, 17]
    per_token = bytes_per_token(tiny.config, tiny.model.dtype)
    mib = 23 * per_token / (1 << 20)
    _, cache, _ = run(tiny, {"strategy": "random", "target_mib": mib}, new_tokens=1)
    assert cache_bytes(cache) == 23 * per_token


def test_query_agnostic_compresses_the_context_and_feeds_the_question(tiny):
    _, cache, steps = run(tiny, {"strategy": "tova", "query_aware": False, "question_tokens": 10}, new_tokens=1)
    assert cache.eviction.prompt_tokens == PROMPT_TOKENS - 10
    assert [layer.keys.shape[2] for layer in cache.layers] == [(PROMPT_TOKENS - 10) // 2 + 10] * 2


def test_pyramid_budgets_fall_by_layer_and_average_to_the_ratio():
    budgets = [pyramid_kept_tokens(1000, 0.5, i, 30, 64, 20) for i in range(30)]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1]
    assert abs(sum(budgets) / 30 - 500) <= 1
    assert pyramid_kept_tokens(70, 0.5, 3, 30, 64, 20) == 35  # too short for the pyramid: SnapKV's budget


def test_pyramid_feeds_tokens_after_pruning_one_at_a_time(tiny):
    _, cache, steps = run(tiny, {"strategy": "pyramidkv", "window_size": 8, "query_aware": False,
                                 "question_tokens": 5}, new_tokens=3)
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    assert lengths[0] > lengths[1] and len(steps) == 3


@pytest.mark.parametrize("spec, message", [
    ({"strategy": "snapkv", "compression_ratio": 1.0}, r"compression_ratio must be a number in \[0, 1\)"),
    ({"strategy": "snapkv", "kernel_size": 4}, r"kernel_size must be odd \(1, 3, 5, ...\), got 4"),
    ({"strategy": "knorm", "target_tokens": 5, "target_mib": 1.0}, "give target_tokens or target_mib, not both"),
    ({"strategy": "tova", "query_aware": False}, "query_aware: false needs question_tokens >= 1"),
    ({"strategy": "random", "seed": -1}, r"seed must be an integer >= 0, got -1"),
    ({"strategy": "expected_attention", "use_vnorm": "yes"}, "use_vnorm must be true or false"),
    ({"strategy": "pyramidkv", "beta": 0}, r"beta must be an integer >= 1"),
])
def test_bad_knobs_get_a_message_with_the_allowed_values(spec, message):
    with pytest.raises(StrategyError, match=message):
        make_strategy(spec)


def test_a_prompt_shorter_than_the_snapkv_window_is_refused_before_compute():
    with pytest.raises(StrategyError, match="needs a prompt longer than window_size=64 tokens \\(got 40\\)"):
        make_strategy({"strategy": "snapkv"}).check_fits(40, 8)


def test_eviction_strategies_are_not_prefix_copies_but_serve_chat():
    for name in EVICTING:
        strategy = make_strategy({"strategy": name})
        assert strategy.lossy and not strategy.usable_in_prefix and strategy.usable_in_chat
        assert not strategy.keeps_everything and not strategy.is_croppable


def test_inspect_shows_kept_and_evicted_positions_per_head_with_scores(tiny):
    from kvlab.inspect.inspector import InspectSession
    from kvlab.ui.inspect.view import strip_html

    settings = GenerationSettings(max_new_tokens=2, stop_at_eos=False, fidelity=False)
    session = InspectSession(tiny, make_strategy({"strategy": "snapkv", "window_size": 8}),
                             torch.arange(10, 10 + PROMPT_TOKENS)[None], settings)
    record = session.step()
    row = record.layers[0]
    assert len(row.head_strips) == tiny.config.num_key_value_heads
    runs = row.head_strips[0]
    held = sum(stop - start for state, start, stop in runs if state == "held")
    evicted = sum(stop - start for state, start, stop in runs if state == "evicted")
    assert (held, evicted) == (PROMPT_TOKENS // 2, PROMPT_TOKENS // 2)
    assert runs[-1] == ("held", runs[-1][1], PROMPT_TOKENS)  # the observation window is always kept
    assert len(row.head_scores[0]) == PROMPT_TOKENS
    page = strip_html(record)
    assert 'data-layers="0-0/0"' in page and "score " in page


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "knorm"])
def test_view_code_reproduces_the_column_with_generate(tiny, name):
    """The snippet's `with prune_at_prefill(...)` line, evaluated as written around plain `generate()`, gives the
    column's tokens."""
    from transformers import DynamicCache

    from kvlab.ui.shared.code import code_snippet

    strategy = make_strategy({"strategy": name, **SMALL_WINDOW.get(name, {})})
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)
    snippet = code_snippet(strategy, settings, "hello", chat=False)
    compile(snippet, name, "exec")
    imports, call = strategy.prune_code()
    assert f"with {call}:" in snippet
    namespace = {"model": tiny.model}
    exec("\n".join(imports), namespace)
    ids = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    cache = DynamicCache(config=tiny.model.config)
    with eval(call, namespace):
        out = tiny.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache,
                                  max_new_tokens=6, min_new_tokens=6, do_sample=False)
    _, _, steps = run(tiny, {"strategy": name, **SMALL_WINDOW.get(name, {})}, new_tokens=6)
    assert out[0, PROMPT_TOKENS:].tolist() == [s.token_id for s in steps]


def test_plan_counts_the_kept_prompt_and_refuses_per_layer_budgets():
    from kvlab.plan.planner import PlanRequest, plan

    strategies = ({"strategy": "dynamic"}, {"strategy": "knorm", "compression_ratio": 0.75},
                  {"strategy": "snapkv", "target_tokens": 256}, {"strategy": "pyramidkv"})
    result = plan(PlanRequest(contexts=(1000, 4000), dtype="float32", strategies=strategies)).to_json()
    cells = [[cell["cache_bytes"] for cell in s["contexts"]] for s in result["strategies"]]
    assert cells[1] == [dense // 4 for dense in cells[0]]
    assert cells[2] == [cells[0][0] * 256 // 1000] * 2
    assert result["strategies"][3]["status"] == "error"


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "knorm"])
def test_chat_serves_a_growing_conversation(tiny, name):
    """A turn that reuses the cache appends its tokens whole to the pruned cache; a turn that rebuilds it (the
    template re-tokenized the reply) prunes the whole conversation as its prompt. Either way the cache holds the
    pruned prompt plus every token fed after it."""
    import dataclasses

    from kvlab.chat.session import ChatSession, ChatTurnDone

    settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False, fidelity=False)
    knobs = {"window_size": 4} if "kv" in name else {}
    chat = ChatSession(tiny, make_strategy({"strategy": name, **knobs}), dataclasses.replace(settings))
    text = "Tell me about the rain in the mountains and the rivers that run to the sea, please."
    stats = [next(e.stats for e in chat.send(message, baseline=False) if isinstance(e, ChatTurnDone))
             for message in (text, "And then?")]
    assert stats[1].action in ("reuse", "rebuild") and stats[1].reply_ids
    pruned = stats[0].input_tokens if stats[1].action == "reuse" else stats[1].input_tokens
    record = chat.cache.eviction
    assert record.prompt_tokens == pruned
    last = len(chat.cache.layers) - 1
    held = chat.cache.layers[last].keys.shape[2]
    assert held == record.layers[last].kept_tokens + len(chat.cached_ids) - pruned < len(chat.cached_ids)
