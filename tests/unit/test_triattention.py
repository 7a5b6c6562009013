"""TriAttention (TensorRT-LLM's `TriAttentionKvCacheCompressionConfig`): the score against a hand computation of the
paper's trigonometric series, the three keep sets, eviction every `beta` tokens down to the prompt + `budget`, the
knob messages, Inspect's strip, the snippet and the serving row. The calibration's cache is
tests/unit/test_triattention_calibration.py."""

import cmath
import math

import pytest
import torch

from kvlab.accounting import bytes_per_token, cache_bytes
from kvlab.engine import Decoder
from kvlab.eviction.decoding import held_after
from kvlab.eviction.scoring import rotate_half
from kvlab.eviction.triattention import LayerCentres, geometric_offsets, key_scores, select_keep, z_normalize
from kvlab.generation import GenerationSettings
from kvlab.strategies import StrategyError, make_strategy

PROMPT_TOKENS = 20
BUDGET = 6
BETA = 4


@pytest.fixture(scope="module")
def gqa(tiny):
    """A 2-layer random Llama with 2 KV heads of 2 query heads each (head_dim 16), on the tiny tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.models.loading import LoadedModel, ModelSpec

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tiny.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(ModelSpec(source="tiny-gqa-llama", device="cpu"), model, tiny.tokenizer,
                       torch.device("cpu"), 0.0, "tiny-gqa-llama")


def rope(x: torch.Tensor, positions: torch.Tensor, omega: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """transformers' RoPE (half split) of (n, d) vectors at `positions`, cos/sin scaled by `scale`."""
    angle = positions.double()[:, None] * omega.double()[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1) * scale, torch.cat([angle.sin()] * 2, -1) * scale
    return x * cos + rotate_half(x) * sin


def by_hand(q_mean, q_abs_mean, key, position, omega, round_start, offsets) -> float:
    """The paper's score of one pre-RoPE key: mean over offsets of sum_f |q_f||k_f| cos(w_f (t - p + o) + arg q_f -
    arg k_f), plus sum_f (E|q_f| - |q_f|) |k_f|, in plain Python."""
    freqs = len(omega)
    pairs = [complex(key[f], key[f + freqs]) for f in range(freqs)]
    trig = sum(abs(q_mean[f]) * abs(pairs[f]) * math.cos(omega[f] * (round_start - position + o)
                                                         + cmath.phase(q_mean[f]) - cmath.phase(pairs[f]))
               for o in offsets for f in range(freqs)) / len(offsets)
    return trig + sum((q_abs_mean[f] - abs(q_mean[f])) * abs(pairs[f]) for f in range(freqs))


def test_the_score_is_the_papers_trigonometric_series_by_hand():
    torch.manual_seed(0)
    omega = torch.tensor([1.0, 0.3, 0.05], dtype=torch.float64)
    q_mean = torch.complex(torch.randn(2, 3), torch.randn(2, 3)).to(torch.complex128)
    q_abs_mean = q_mean.abs() + torch.rand(2, 3, dtype=torch.float64)
    centres = LayerCentres(q_mean, q_abs_mean, omega, torch.ones(3, dtype=torch.float64))
    positions = torch.tensor([0, 3, 7, 8])
    pre_rope = torch.randn(4, 6, dtype=torch.float64)
    cached = rope(pre_rope, positions, omega)[None].float()  # (1 KV head, 4 keys, head_dim 6), as the cache holds
    offsets = geometric_offsets(8)
    assert offsets.tolist() == [1.0, 2.0, 4.0, 8.0]
    scores = key_scores(cached, centres, round_start=10, offsets=offsets)
    assert scores.shape == (2, 4)
    for head in range(2):
        for slot in range(4):
            expected = by_hand(q_mean[head].tolist(), q_abs_mean[head].tolist(), pre_rope[slot].tolist(),
                               int(positions[slot]), omega.tolist(), 10, offsets.tolist())
            assert scores[head, slot].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_a_scaled_rope_scores_s_times_the_references_scaled_score():
    """With RoPE's attention_scaling s, TensorRT-LLM's post-RoPE score (kvlab's) is s times the reference's, which
    inverts RoPE and weighs by s^2: one constant per model, so both keep the same positions."""
    torch.manual_seed(1)
    omega, s = torch.tensor([0.7, 0.02], dtype=torch.float64), 1.3
    q_mean = torch.complex(torch.randn(1, 2), torch.randn(1, 2)).to(torch.complex128)
    centres = LayerCentres(q_mean, q_mean.abs() + 0.5, omega, torch.full((2,), s * s, dtype=torch.float64))
    positions, pre_rope = torch.tensor([2, 5, 9]), torch.randn(3, 4, dtype=torch.float64)
    scores = key_scores(rope(pre_rope, positions, omega, s)[None], centres, 12, geometric_offsets(4))
    reference = [s * s * by_hand(q_mean[0].tolist(), (q_mean.abs() + 0.5)[0].tolist(), pre_rope[i].tolist(),
                                 int(positions[i]), omega.tolist(), 12, [1.0, 2.0, 4.0]) for i in range(3)]
    assert scores[0].tolist() == pytest.approx([s * r for r in reference], rel=1e-5)


def test_z_normalization_is_per_row_and_survives_a_constant_row():
    rows = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    normalized = z_normalize(rows)
    assert normalized[0].mean().item() == pytest.approx(0, abs=1e-6)
    assert normalized[0].std(unbiased=False).item() == pytest.approx(1, rel=1e-6)
    assert normalized[1].tolist() == [0.0] * 4


def test_each_eviction_mode_keeps_the_set_tensorrt_llm_keeps():
    """2 layers, 2 KV heads of 2 query heads, 5 decoded positions, budget 2 (scores already normalized)."""
    layer0 = torch.tensor([[9., 1., 1., 1., 8.], [1., 1., 7., 1., 1.],   # KV head 0: group max 9 1 7 1 8
                           [0., 6., 0., 5., 0.], [0., 0., 0., 0., 4.]])  # KV head 1: group max 0 6 0 5 4
    layer1 = torch.tensor([[1., 1., 1., 1., 1.], [1., 2., 3., 1., 1.],   # KV head 0: 1 2 3 1 1
                           [9., 0., 0., 0., 0.], [0., 0., 0., 3., 0.]])  # KV head 1: 9 0 0 3 0
    scores = {3: layer0, 7: layer1}
    per_layer = select_keep("per_layer_perhead", scores, 2, 2)
    assert per_layer[3][0].tolist() == [[0, 4], [1, 3]] and per_layer[7][0].tolist() == [[1, 2], [0, 3]]
    per_head = select_keep("per_head", scores, 2, 2)  # means: head 0 5 1.5 5 1 4.5; head 1 4.5 3 0 4 2
    assert per_head[3][0].tolist() == per_head[7][0].tolist() == [[0, 2], [0, 3]]
    union = select_keep("union", scores, 2, 2)  # max over all 8 rows: 9 6 7 5 8
    assert union[3][0].tolist() == union[7][0].tolist() == [[0, 4], [0, 4]]
    ties = select_keep("union", {0: torch.ones(2, 5)}, 1, 3)  # a tie goes to the earlier position
    assert ties[0][0].tolist() == [[0, 1, 2]]


def test_union_keeps_what_the_references_union_of_each_heads_top_b_keeps():
    """The authors' `_select_union_based`: each head's top-B, their union, re-ranked by the maximum over heads."""
    torch.manual_seed(2)
    for _ in range(20):
        rows = torch.randn(6, 40)
        combined = rows.max(0).values
        union = torch.zeros(40, dtype=torch.bool)
        for row in rows:
            union[row.topk(8).indices] = True
        candidates = union.nonzero().view(-1)
        expected = sorted(candidates[combined[candidates].topk(8).indices].tolist())
        assert select_keep("union", {0: rows[:3], 1: rows[3:]}, 1, 8)[0][0][0].tolist() == expected


def run(loaded, spec, new_tokens, prompt_tokens=PROMPT_TOKENS):
    strategy = make_strategy(spec)
    ids = torch.arange(10, 10 + prompt_tokens)[None]
    cache = strategy.build_cache(loaded, prompt_tokens + new_tokens)
    settings = GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)
    return strategy, cache, list(Decoder(loaded, strategy, cache, ids, settings, measure_bytes=True))


@pytest.mark.parametrize("mode", ["union", "per_head", "per_layer_perhead"])
def test_every_beta_tokens_each_layer_goes_back_to_the_prompt_plus_budget(gqa, mode):
    spec = {"strategy": "triattention", "budget": BUDGET, "beta": BETA, "eviction_mode": mode}
    strategy, cache, steps = run(gqa, spec, new_tokens=24)
    per_layer_token = bytes_per_token(gqa.config, gqa.model.dtype) // gqa.config.num_hidden_layers
    for step in steps:  # fed = tokens fed after the prompt when this step's logits were read
        fed = step.seen_tokens - PROMPT_TOKENS
        held = held_after(PROMPT_TOKENS, fed, BETA, PROMPT_TOKENS + BUDGET)
        assert held == strategy.held_tokens_after(PROMPT_TOKENS, fed, 0, gqa.config, gqa.model.dtype)
        assert step.cache_bytes == per_layer_token * held * gqa.config.num_hidden_layers
    fed = 23
    assert held_after(PROMPT_TOKENS, fed, BETA, PROMPT_TOKENS + BUDGET) == PROMPT_TOKENS + BUDGET + fed % BETA
    assert cache_bytes(cache) == steps[-1].cache_bytes
    # decoded 8 > 6 at the 8th token fed: evictions at 8, 12, 16, 20 (at 4 only 4 decoded: nothing to evict)
    assert [cache.eviction.layers[i].compressions for i in range(2)] == [4, 4]
    positions = [layer.held_positions() for layer in cache.layers]
    for held in positions:
        assert held[:, :PROMPT_TOKENS].tolist() == [list(range(PROMPT_TOKENS))] * 2  # the prompt is pinned
        assert held[:, -(fed % BETA):].tolist() == [list(range(40, 43))] * 2  # tokens fed since the last round
        assert all(row == sorted(row) for row in held.tolist())  # compacted in position order, as TensorRT-LLM
    if mode == "union":
        assert torch.equal(positions[0], positions[1]) and torch.equal(positions[0][0], positions[0][1])
    elif mode == "per_head":
        assert torch.equal(positions[0], positions[1])


def test_nothing_is_evicted_before_budget_tokens_are_decoded(gqa):
    _, cache, steps = run(gqa, {"strategy": "triattention", "budget": 16, "beta": 4}, new_tokens=17)
    dense = bytes_per_token(gqa.config, gqa.model.dtype)
    assert [s.cache_bytes for s in steps] == [dense * (PROMPT_TOKENS + i) for i in range(17)]
    assert cache.eviction.layers[0].compressions == 0


def test_the_prompt_is_never_scored_and_inspect_shows_each_heads_kept_positions(gqa):
    from kvlab.inspect.inspector import InspectSession
    from kvlab.ui.inspect.view import strip_html

    settings = GenerationSettings(max_new_tokens=14, stop_at_eos=False, fidelity=False)
    strategy = make_strategy({"strategy": "triattention", "budget": BUDGET, "beta": BETA,
                              "eviction_mode": "per_layer_perhead"})
    session = InspectSession(gqa, strategy, torch.arange(10, 10 + PROMPT_TOKENS)[None], settings)
    for _ in range(10):  # prefill + 9 tokens: 8 fed, one eviction (8 decoded > 6)
        record = session.step()
    row = record.layers[1]
    assert len(row.head_strips) == gqa.config.num_key_value_heads == 2
    for head, runs in enumerate(row.head_strips):
        assert runs[0][:2] == ("held", 0) and runs[0][2] >= PROMPT_TOKENS  # the prompt (and maybe what follows)
        evicted = sum(stop - start for state, start, stop in runs if state == "evicted")
        assert evicted == 2  # 8 decoded, 6 kept
        scores = row.head_scores[head]
        assert all(value is None for value in scores[:PROMPT_TOKENS])  # the prompt is pinned, not scored
        assert all(value is not None for value in scores[PROMPT_TOKENS:PROMPT_TOKENS + 8])
    assert 'data-layers="1-1/1"' in strip_html(record)


@pytest.mark.parametrize("spec, message", [
    ({"budget": 0}, "budget must be an integer >= 1, got 0"),
    ({"beta": -1}, "beta must be an integer >= 1, got -1"),
    ({"eviction_mode": "global"}, "eviction_mode must be one of union, per_head, per_layer_perhead, got 'global'"),
    ({"normalize_scores": "yes"}, "normalize_scores must be true or false, got 'yes'"),
    ({"normalize_scores": False}, "normalize_scores: false needs eviction_mode per_head or per_layer_perhead"),
    ({"compression_ratio": 0.5}, "compression_ratio"),
])
def test_bad_knobs_get_a_message_with_the_allowed_values(spec, message):
    with pytest.raises(StrategyError, match=message):
        make_strategy({"strategy": "triattention", **spec})


def test_the_column_names_its_knobs_and_serves_chat_but_not_prefix_copies():
    strategy = make_strategy({"strategy": "triattention", "budget": 512, "beta": 128, "eviction_mode": "per_head",
                              "normalize_scores": False})
    assert strategy.describe() == "triattention 512 tok every 128 per_head normalize_scores=false"
    assert make_strategy({"strategy": "triattention"}).describe() == "triattention 2048 tok every 128"
    assert strategy.is_evicting and strategy.lossy and strategy.usable_in_chat and not strategy.usable_in_prefix
    assert "every 128 tokens fed after it" in strategy.caveat_for(100)


def test_the_serving_row_names_tensorrt_llms_config_with_the_knobs():
    settings = make_strategy({"strategy": "triattention", "budget": 512, "beta": 128}).serving_settings()
    trt = next(s for s in settings if s.engine == "TensorRT-LLM")
    assert trt.setting.startswith('TriAttentionKvCacheCompressionConfig(budget=512, beta=128, eviction_mode="union"')
    assert trt.version == "1.3.0rc27" and "TriAttentionKvCacheCompressionConfig.html" in trt.source
    assert all(s.setting is None and "TriAttention" in s.note for s in settings if s.engine != "TensorRT-LLM")


def test_view_code_reproduces_the_column_with_generate(gqa):
    """The snippet's `with triattention_hooks(...)` line, evaluated as written around plain `generate()` with the
    snippet's `PrunedCache`, gives the column's tokens (two evictions inside the generation)."""
    from kvlab.ui.shared.code import code_snippet

    strategy = make_strategy({"strategy": "triattention", "budget": BUDGET, "beta": BETA})
    settings = GenerationSettings(max_new_tokens=14, stop_at_eos=False, fidelity=False)
    snippet = code_snippet(strategy, settings, "hello", chat=False)
    compile(snippet, "triattention", "exec")
    imports, line = strategy.generate_context_code()
    namespace = {"model": gqa.model, "tokenizer": gqa.tokenizer}
    exec("\n".join(imports + strategy.cache_code()[0]), namespace)
    exec(strategy.cache_code()[1], namespace)
    call = line.removeprefix("with ").split(":  #")[0]
    ids = torch.arange(10, 10 + PROMPT_TOKENS)[None]
    with eval(call, namespace):
        out = gqa.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=namespace["cache"],
                                 max_new_tokens=14, min_new_tokens=14, do_sample=False)
    _, cache, steps = run(gqa, {"strategy": "triattention", "budget": BUDGET, "beta": BETA}, new_tokens=14)
    assert out[0, PROMPT_TOKENS:].tolist() == [s.token_id for s in steps]
    assert namespace["cache"].layers[0].held_positions().tolist() == cache.layers[0].held_positions().tolist()


def test_plan_counts_the_whole_prompt_then_the_budget():
    from kvlab.plan.planner import PlanRequest, plan

    strategies = ({"strategy": "dynamic"}, {"strategy": "triattention", "budget": 512, "beta": 128})
    result = plan(PlanRequest(contexts=(1000, 4000), dtype="float32", strategies=strategies)).to_json()
    cells = [[cell["cache_bytes"] for cell in s["contexts"]] for s in result["strategies"]]
    assert result["strategies"][1]["status"] != "error"
    assert cells[1] == cells[0]  # a context is a prompt here, and TriAttention keeps the prompt whole
    assert "keep the whole prompt" in str(result["strategies"][1])


def test_chat_pins_the_first_prompt_and_counts_later_turns_as_decoded(gqa):
    """A turn that reuses the cache feeds its tokens one by one, so they count toward the next round; a turn that
    rebuilds the cache pins the whole conversation as its prompt."""
    import dataclasses

    from kvlab.chat.session import ChatSession, ChatTurnDone

    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)
    chat = ChatSession(gqa, make_strategy({"strategy": "triattention", "budget": 4, "beta": 3}),
                       dataclasses.replace(settings))
    stats = [next(e.stats for e in chat.send(message, baseline=False) if isinstance(e, ChatTurnDone))
             for message in ("Tell me about the rain in the mountains, please.", "And then, what of the rivers?")]
    pinned = stats[0].input_tokens if stats[1].action == "reuse" else stats[1].input_tokens
    record = chat.cache.eviction
    assert record.prompt_tokens == pinned
    fed = len(chat.cached_ids) - pinned
    held = held_after(pinned, fed, 3, pinned + 4)
    assert [layer.keys.shape[2] for layer in chat.cache.layers] == [held, held]
    assert stats[1].action != "reuse" or held < len(chat.cached_ids)
