"""Compression while decoding (`compress_every`, kvpress's DecodingPress) on the tiny model: each layer returns to
its prefill budget every N tokens fed, the positions a layer says it holds follow every prune, Inspect and the
divergence forensics read them, Plan counts them, and bad knobs get a message."""

import pytest
import torch

from kvlab.accounting import bytes_per_token, cache_bytes
from kvlab.engine import Decoder
from kvlab.generation import GenerationSettings
from kvlab.inspect.held import held_kv, held_positions
from kvlab.inspect.inspector import layer_rows
from kvlab.strategies import STRATEGIES, StrategyError, make_strategy
from kvlab.strategies.scored import ScoredEviction

EVICTING = [name for name, cls in STRATEGIES.items() if issubclass(cls, ScoredEviction)]  # the kvpress presses
SMALL_WINDOW = {"snapkv": {"window_size": 8}, "pyramidkv": {"window_size": 8}, "expected_attention": {}}
PROMPT_TOKENS = 40
EVERY = 10
NEW_TOKENS = 26


def run(tiny, spec, new_tokens=NEW_TOKENS, prompt_tokens=PROMPT_TOKENS):
    strategy = make_strategy(spec)
    ids = torch.arange(10, 10 + prompt_tokens)[None]
    cache = strategy.build_cache(tiny, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    steps = list(Decoder(tiny, strategy, cache, ids, settings, measure_bytes=True))
    return strategy, cache, steps


def budgets(tiny, strategy, prompt_tokens=PROMPT_TOKENS):
    return [strategy.kept_tokens(prompt_tokens, i, tiny.config, tiny.model.dtype)
            for i in range(tiny.config.num_hidden_layers)]


@pytest.mark.parametrize("name", EVICTING)
def test_each_layer_returns_to_its_budget_every_n_tokens(tiny, name):
    spec = {"strategy": name, "compression_ratio": 0.5, "compress_every": EVERY, **SMALL_WINDOW.get(name, {})}
    strategy, cache, steps = run(tiny, spec)
    fed = NEW_TOKENS - 1  # the last token generated is never fed
    kept = budgets(tiny, strategy)
    per_layer_token = bytes_per_token(tiny.config, tiny.model.dtype) // tiny.config.num_hidden_layers
    for i, layer in enumerate(cache.layers):
        assert layer.keys.shape[2] == kept[i] + fed % EVERY
        assert cache.eviction.layers[i].compressions == fed // EVERY
    assert steps[-1].cache_bytes == cache_bytes(cache) == per_layer_token * sum(k + fed % EVERY for k in kept)
    # without compress_every the same run keeps every decoded token
    _, dense_decode, _ = run(tiny, {key: value for key, value in spec.items() if key != "compress_every"})
    assert dense_decode.layers[0].keys.shape[2] == kept[0] + fed


@pytest.mark.parametrize("name", ["knorm", "tova", "snapkv"])
def test_held_positions_follow_every_prune(tiny, name):
    """Layer 0's keys depend only on the token and its position, so the pruned cache's layer-0 keys must equal a
    dense cache's at exactly the positions the layer says it holds, after prefill pruning and three compressions."""
    spec = {"strategy": name, "compression_ratio": 0.5, "compress_every": EVERY, **SMALL_WINDOW.get(name, {})}
    _, cache, steps = run(tiny, spec)
    fed_ids = torch.tensor([[*range(10, 10 + PROMPT_TOKENS), *[step.token_id for step in steps[:-1]]]])
    dense = make_strategy({"strategy": "dynamic"})
    dense_cache = dense.build_cache(tiny, fed_ids.shape[1])
    with torch.no_grad():
        tiny.model(input_ids=fed_ids, cache=dense_cache, use_cache=True)
    layer = cache.layers[0]
    positions = layer.held_positions()
    seen = fed_ids.shape[1]
    assert layer.seen == seen
    assert positions.shape == layer.keys.shape[1:3]
    assert all(len(set(row)) == len(row) for row in positions.tolist())
    assert positions.max() < seen and positions.max() >= PROMPT_TOKENS  # decoded tokens are held too
    expected = dense_cache.layers[0].keys[0].gather(1, positions[..., None].expand(-1, -1, layer.keys.shape[-1]))
    torch.testing.assert_close(layer.keys[0], expected, rtol=1e-5, atol=1e-5)
    # the divergence forensics read the same positions (and keys) from the layer
    found, reason = held_positions(layer, seen, positions.shape[0])
    assert reason == "" and torch.equal(found, positions)
    held, reason = held_kv(layer, seen)
    assert reason == "" and torch.equal(held.positions, positions)


def test_tova_every_step_keeps_the_cache_at_its_budget(tiny):
    """compress_every 1 is TOVA as its paper runs it: one position out per token in."""
    strategy, cache, steps = run(tiny, {"strategy": "tova", "compression_ratio": 0.5, "compress_every": 1})
    kept = budgets(tiny, strategy)
    sizes = {step.cache_bytes for step in steps[1:]}
    assert len(sizes) == 1
    assert [layer.keys.shape[2] for layer in cache.layers] == kept


def test_inspect_shows_decoded_positions_evicted_after_a_compression(tiny):
    strategy, cache, steps = run(tiny, {"strategy": "knorm", "compression_ratio": 0.5, "compress_every": EVERY})
    seen = PROMPT_TOKENS + NEW_TOKENS - 1
    rows = layer_rows(cache, tiny.config, seen)
    for row in rows:
        layer = cache.layers[row.layers[0]]
        for head, runs in enumerate(row.head_strips):
            assert runs[-1][2] == seen
            held = sum(stop - start for state, start, stop in runs if state == "held")
            assert held == layer.keys.shape[2]
            held_set = {p for state, start, stop in runs if state == "held" for p in range(start, stop)}
            assert held_set == set(layer.held_positions()[head].tolist())
        scores = row.head_scores[0]
        assert len(scores) == PROMPT_TOKENS + (NEW_TOKENS - 1) // EVERY * EVERY  # scored at the last compression
        assert any(value is None for value in scores)  # positions already gone at that compression
    evicted_late = [start for state, start, _ in rows[0].head_strips[0] if state == "evicted" and start >= PROMPT_TOKENS]
    assert evicted_late, "some decoded positions were evicted by a compression while decoding"


def test_plan_counts_the_budget_plus_the_tokens_since_the_last_compression():
    from kvlab.plan.planner import PlanRequest, plan

    strategies = ({"strategy": "dynamic"}, {"strategy": "knorm", "compression_ratio": 0.5},
                  {"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 100})
    result = plan(PlanRequest(contexts=(1250,), prefill_tokens=1000, dtype="float32", strategies=strategies))
    dense, kept_all, every = [s["contexts"][0]["cache_bytes"] for s in result.to_json()["strategies"]]
    per_token = dense // 1250
    assert kept_all == per_token * (500 + 250)
    assert every == per_token * (500 + 250 % 100)


@pytest.mark.parametrize("spec, message", [
    ({"strategy": "snapkv", "compress_every": 64}, "more than window_size=64"),
    ({"strategy": "pyramidkv", "window_size": 8, "compress_every": 8}, "more than window_size=8"),
    ({"strategy": "expected_attention", "compress_every": 3}, "more than n_sink=4"),
    ({"strategy": "knorm", "compress_every": -1}, "compress_every must be an integer >= 0"),
    ({"strategy": "tova", "compress_every": 1.5}, "compress_every must be an integer >= 0"),
])
def test_bad_compress_every_gets_a_message(spec, message):
    with pytest.raises(StrategyError, match=message):
        make_strategy(spec)


def test_title_and_caveat_say_it_compresses_while_decoding():
    strategy = make_strategy({"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 32})
    assert strategy.title() == "knorm 0.5 every 32"
    assert "every 32 tokens fed after the prompt" in strategy.caveat()
    assert "decoded tokens are all kept" in make_strategy({"strategy": "knorm"}).caveat()


def test_a_pruned_cache_refuses_a_crop_with_the_reason(tiny):
    _, cache, _ = run(tiny, {"strategy": "knorm", "compression_ratio": 0.5}, new_tokens=2)
    with pytest.raises(NotImplementedError, match="cannot be cropped"):
        cache.layers[0].crop(1)


def test_the_caveat_says_when_the_budget_prunes_nothing(tiny):
    from kvlab.columns import Column
    from kvlab.compare.runner import new_result

    big = make_strategy({"strategy": "knorm", "target_tokens": 500})
    assert "nothing was pruned: target_tokens=500 keeps all 60" in big.caveat_for(60)
    assert big.caveat_for(600) == big.caveat() and "pruned per layer" in big.caveat()
    agnostic = make_strategy({"strategy": "knorm", "target_tokens": 55, "query_aware": False, "question_tokens": 10})
    assert "keeps all 50" in agnostic.caveat_for(60)
    assert "removes none" in make_strategy({"strategy": "tova", "compression_ratio": 0}).caveat_for(60)
    assert "nothing was pruned" not in make_strategy({"strategy": "tova", "compression_ratio": 0.01}).caveat_for(60)
    result = new_result(0, Column(strategy=big), 60)
    assert result.caveat == big.caveat_for(60)


def test_an_eviction_strategy_is_a_fallback_that_stays_in_the_budget(tiny):
    """A dynamic column over its budget falls back to knorm (every id so far re-prefilled and pruned); compressing
    every 4 tokens keeps it under the budget for the rest of the run, where plain knorm outgrows it again."""
    from kvlab.compare.runner import run_compare
    from kvlab.protocol import collect

    prompt = torch.tensor([[1, 400, 401, 402, 403, 404]])
    settings = GenerationSettings(max_new_tokens=60, stop_at_eos=False, fidelity=False)
    budget_kib = 20
    per_token = bytes_per_token(tiny.config, tiny.model.dtype)
    assert per_token == 1024

    def column(fallback):
        return {"strategy": "dynamic", "budget_mib": budget_kib / 1024, "fallback": fallback}

    every = {"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 4}
    plain = {"strategy": "knorm", "compression_ratio": 0.5}
    done = collect(run_compare(tiny, prompt, [column([every]), column([plain])], settings))
    kept, grown = done.results
    assert kept.status == "ok" and len(kept.token_ids) == 60
    assert [f["to"] for f in kept.fallbacks] == ["knorm 0.5 every 4"] and kept.fallbacks[0]["at_token"] == 15
    assert max(kept.cache_bytes) <= budget_kib * 1024
    assert kept.fallbacks[0]["bytes_after"] == per_token * (21 // 2)  # 6 + 15 ids re-prefilled, half kept
    assert [f["at_token"] for f in grown.fallbacks] == [15]
    assert "over budget from token 26" in grown.message and "no smaller cache is left" in grown.message
    assert grown.cache_bytes[-1] > budget_kib * 1024


def test_a_chat_with_compress_every_stays_near_its_budget_over_turns(tiny):
    """Every token a later turn feeds (the user's message, the reply) counts towards the next compression; a message
    fed in one forward that brings the count to 5 or more is compressed at its end, so the cache stays within 5
    positions of its budget."""
    import dataclasses

    from kvlab.chat.session import ChatSession, ChatTurnDone

    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)
    strategy = make_strategy({"strategy": "knorm", "compression_ratio": 0.5, "compress_every": 5})
    chat = ChatSession(tiny, strategy, dataclasses.replace(settings))
    text = "Tell me about the rain in the mountains and the rivers that run to the sea, please."
    for message in (text, "And then?", "Why is that so?"):
        stats = next(e.stats for e in chat.send(message, baseline=False) if isinstance(e, ChatTurnDone))
        assert stats.reply_ids
    record = chat.cache.eviction
    fed_after = len(chat.cached_ids) - record.prompt_tokens
    assert fed_after > 5
    budget = strategy.kept_tokens(record.prompt_tokens, 0, tiny.config, tiny.model.dtype)
    for index, layer in enumerate(chat.cache.layers):
        assert budget <= layer.keys.shape[2] < budget + 5
        assert layer.seen == len(chat.cached_ids)
        assert record.layers[index].compressions >= 3
    chat.cache.reset()
    assert chat.cache.eviction is None and chat.cache.decode_buffer is None and chat.cache.layers[0].seen == 0


def test_position_tracking_allocates_nothing_for_meta_tensors(tiny):
    """Plan measures caches by feeding meta tensors of up to 2**33 tokens; the positions a pruned layer tracks
    follow them onto the meta device instead of allocating 64 GiB on the host."""
    from kvlab.eviction.cache import PrunedCache

    cache = PrunedCache(tiny.config)
    keys = torch.empty(1, 1, 2**33, 64, device="meta")
    cache.update(keys, keys, 0)
    layer = cache.layers[0]
    assert layer.positions.is_meta and layer.seen == 2**33
