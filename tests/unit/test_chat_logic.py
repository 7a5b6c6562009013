"""Multi-turn cache reuse and prefix-cache copies, on a tiny random Llama (no download).

Checks the prefix check and the crop/rebuild decision, that a cropped dynamic or
static cache continues exactly like a fresh prefill, that a chat session's
tracked ids always match what its cache holds (through undo, regenerate, an
interrupted reply, a strategy switch), that a static cache too small for the
conversation is refused before any compute, that `copy_cache` copies every cache
type whatever the grad mode of the prefill, and the chat/prefix command line's
error handling.
"""

import copy
import dataclasses

import pytest
import torch
from transformers import DynamicCache, QuantizedCache, StaticCache

from kvlab.accounting import cache_bytes
from kvlab.chat.session import (
    ChatCapacityError,
    ChatInputError,
    ChatSession,
    ChatStatus,
    ChatToken,
    ChatTurnDone,
    ChatTurnFailed,
)
from kvlab.chat.reuse import common_prefix_length, generate_reply, held_tokens, plan_reuse, suggested_capacity
from kvlab.cli import main
from kvlab.generation import GenerationSettings
from kvlab.chat.prefix import PrefixCache, answer_from_prefix, clone_tensor, copy_cache, run_prefix_reuse
from kvlab.caches.sink import SinkCache
from kvlab.strategies import StrategyError, make_strategy

NEW_TOKENS = 6
SETTINGS = GenerationSettings(max_new_tokens=NEW_TOKENS, fidelity=False)
GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def drain(events):
    """All events of a turn; returns (events, final stats or None)."""
    events = list(events)
    done = [e.stats for e in events if isinstance(e, ChatTurnDone)]
    return events, (done[0] if done else None)


def session(tiny, name="dynamic", **knobs):
    return ChatSession(tiny, make_strategy({"strategy": name, **knobs}), dataclasses.replace(SETTINGS))


def in_sync(chat: ChatSession) -> bool:
    return held_tokens(chat.cache) == len(chat.cached_ids)


# --- the prefix check and the reuse decision ---------------------------------------------------------


@pytest.mark.parametrize("a, b, expected", [
    ([], [1, 2], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2), ([1, 9, 3], [1, 2, 3], 1), ([5], [6], 0),
])
def test_common_prefix_length(a, b, expected):
    assert common_prefix_length(a, b) == expected


def test_first_turn_prefills_everything():
    plan = plan_reuse([], [1, 2, 3], croppable=True)
    assert (plan.action, plan.reused_tokens, plan.crop_tokens, plan.rebuild) == ("fresh", 0, 0, False)


def test_extension_reuses_every_cached_token():
    plan = plan_reuse([1, 2, 3], [1, 2, 3, 4, 5], croppable=False)
    assert (plan.action, plan.reused_tokens, plan.crop_tokens, plan.rebuild) == ("reuse", 3, 0, False)


def test_divergence_crops_a_croppable_cache_to_the_common_prefix():
    plan = plan_reuse([1, 2, 3, 4, 5], [1, 2, 9, 9], croppable=True, reason="undo")
    assert (plan.action, plan.reused_tokens, plan.crop_tokens) == ("crop", 2, 3)
    assert "undo" in plan.note and "cropped by 3" in plan.note


def test_divergence_rebuilds_a_cache_that_cannot_be_cropped():
    plan = plan_reuse([1, 2, 3, 4], [1, 2, 9], croppable=False)
    assert (plan.action, plan.reused_tokens, plan.rebuild) == ("rebuild", 0, True)
    assert "cannot be cropped" in plan.note


def test_an_input_that_is_a_prefix_of_the_cache_still_feeds_its_last_token():
    plan = plan_reuse([1, 2, 3, 4, 5], [1, 2, 3], croppable=True, reason="regenerate")
    assert (plan.action, plan.reused_tokens, plan.crop_tokens) == ("crop", 2, 3)
    assert "run past the input" in plan.note


def test_a_streaming_cache_feeds_only_the_new_tokens_or_restreams():
    plan = plan_reuse([1, 2, 3], [1, 2, 3, 4], croppable=False, streaming=True)
    assert (plan.action, plan.reused_tokens) == ("stream", 3) and "window" in plan.note
    plan = plan_reuse([1, 2, 3], [1, 9, 3, 4], croppable=False, streaming=True)
    assert plan.action == "rebuild" and plan.rebuild and "sink" in plan.note


def test_empty_input_is_refused():
    with pytest.raises(ValueError, match="empty"):
        plan_reuse([1], [], croppable=True)


def test_suggested_capacity_has_room_and_is_rounded():
    assert suggested_capacity(300) == 768 and suggested_capacity(1) == 256


# --- crop semantics on real transformers caches ------------------------------------------------------


def _logits(model, ids, cache):
    with torch.inference_mode():
        return model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_cropped_cache_continues_like_a_fresh_prefill(tiny, kind):
    def new():
        return DynamicCache() if kind == "dynamic" else StaticCache(config=tiny.config, max_cache_len=64)

    torch.manual_seed(1)
    a, b, c = (torch.randint(5, 1000, (1, n)) for n in (7, 5, 4))
    cache = new()
    _logits(tiny.model, torch.cat([a, b], 1), cache)
    cache.crop(-b.shape[1])
    assert held_tokens(cache) == a.shape[1]
    reused = _logits(tiny.model, c, cache)
    fresh = _logits(tiny.model, torch.cat([a, c], 1), new())
    torch.testing.assert_close(reused, fresh, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec, croppable, streaming, capacity", [
    ({"strategy": "dynamic"}, True, False, None),
    ({"strategy": "static", "max_cache_len": 40}, True, False, 40),
    ({"strategy": "quantized", "backend": "quanto", "q_group_size": 16, "residual_length": 8}, False, False, None),
    ({"strategy": "quantized", "backend": "hqq", "q_group_size": 16, "residual_length": 8}, False, False, None),
    ({"strategy": "quantized", "backend": "fp8"}, False, False, None),
    ({"strategy": "sink", "window_length": 16}, False, True, None),
])
def test_strategy_capabilities_match_the_caches_they_build(tiny, spec, croppable, streaming, capacity):
    strategy = make_strategy(spec)
    cache = strategy.build_cache(tiny, 64)
    assert strategy.is_croppable is croppable is all(layer.is_croppable for layer in cache.layers)
    assert strategy.is_streaming is streaming and strategy.capacity(64) == capacity
    assert strategy.usable_in_chat and strategy.usable_in_prefix is not streaming


# --- a chat session keeps its ids in step with its cache ---------------------------------------------


@pytest.mark.parametrize("name, knobs", [("dynamic", {}), ("static", {"max_cache_len": 512})])
def test_every_reply_with_reuse_equals_the_reply_without(tiny, name, knobs):
    chat = session(tiny, name, **knobs)
    for turn, text in enumerate(["Hello there", "Tell me more", "Tell me more", "Bye"], 1):
        _, stats = drain(chat.send(text, verify=True))
        assert stats.turn == turn and stats.match is True
        assert stats.prefilled_tokens == stats.input_tokens - stats.reused_tokens
        assert in_sync(chat)
        if turn > 1:
            assert stats.reused_tokens > 0 and stats.action in ("reuse", "crop")
    assert [t.turn for t in chat.turns] == [1, 2, 3, 4] and len(chat.history) == 8


def test_cached_ids_are_the_input_plus_all_reply_tokens_but_the_last(tiny):
    chat = session(tiny)
    _, stats = drain(chat.send("Hello"))
    first_input = chat.input_ids(chat.history[:1])
    assert chat.cached_ids == first_input + stats.reply_ids[:-1]
    assert held_tokens(chat.cache) == len(first_input) + stats.generated_tokens - 1


def test_events_stream_tokens_then_status_then_done(tiny):
    chat = session(tiny)
    events, stats = drain(chat.send("Hi", baseline=True))
    kinds = [type(e) for e in events]
    assert kinds[:NEW_TOKENS] == [ChatToken] * stats.generated_tokens
    assert kinds[-2:] == [ChatStatus, ChatTurnDone]
    assert "".join(e.text for e in events if isinstance(e, ChatToken)) == stats.reply


def test_undo_then_the_next_turn_crops_to_what_is_left(tiny):
    chat = session(tiny)
    drain(chat.send("One"))
    kept = list(chat.history)
    drain(chat.send("Two"))
    assert chat.undo() and chat.history == kept and len(chat.turns) == 1
    _, stats = drain(chat.send("Three", verify=True))
    assert stats.action == "crop" and stats.cropped_tokens > 0 and "undo" in stats.note
    assert stats.match and in_sync(chat) and stats.turn == 2
    assert chat.undo() and chat.undo() and not chat.undo() and chat.history == []


def test_regenerate_replaces_the_last_reply_and_greedy_gives_it_again(tiny):
    chat = session(tiny)
    drain(chat.send("One"))
    _, before = drain(chat.send("Two"))
    _, again = drain(chat.regenerate(verify=True))
    assert again.turn == 2 and again.reply_ids == before.reply_ids and again.match
    assert again.action == "crop" and again.prefilled_tokens == 1 and "regenerate" in again.note
    assert len(chat.turns) == 2 and len(chat.history) == 4 and in_sync(chat)


def test_regenerate_with_sampling_draws_again(tiny):
    chat = ChatSession(tiny, make_strategy({"strategy": "dynamic"}),
                       GenerationSettings(max_new_tokens=NEW_TOKENS, do_sample=True, top_k=50, seed=3, fidelity=False))
    _, first = drain(chat.send("One"))
    _, second = drain(chat.regenerate(verify=True))
    assert second.reply_ids != first.reply_ids and second.match


def test_input_errors_change_nothing(tiny):
    chat = session(tiny)
    for empty in ("", "   \n"):
        with pytest.raises(ChatInputError, match="empty"):
            chat.send(empty)
    with pytest.raises(ChatInputError, match="regenerate"):
        chat.regenerate()
    assert chat.history == [] and chat.cache is None and chat.generations == 0


def test_a_static_cache_too_small_is_refused_before_any_compute_and_can_grow(tiny):
    chat = session(tiny, "static", max_cache_len=64)
    drain(chat.send("Hi"))
    state = (list(chat.history), list(chat.cached_ids), held_tokens(chat.cache))
    with pytest.raises(ChatCapacityError) as refused:
        chat.send("a long message " * 10)
    err = refused.value
    assert err.capacity == 64 and err.needed > 64 and "max_cache_len" in str(err) and "dynamic" in str(err)
    assert (list(chat.history), list(chat.cached_ids), held_tokens(chat.cache)) == state
    capacity = chat.grow_cache()
    assert capacity >= err.needed and chat.strategy.max_cache_len == capacity
    _, stats = drain(chat.send("a long message " * 10, verify=True))
    assert stats.action == "rebuild" and "max_cache_len" in stats.note and stats.match


def test_switching_strategy_keeps_the_conversation_and_rebuilds(tiny):
    chat = session(tiny, "static", max_cache_len=64)
    drain(chat.send("Hi"))
    chat.set_strategy(make_strategy({"strategy": "dynamic"}))
    _, stats = drain(chat.send("Again", verify=True))
    assert stats.action == "rebuild" and stats.reused_tokens == 0 and "dynamic" in stats.note
    assert stats.match and len(chat.history) == 4 and isinstance(chat.cache, DynamicCache)
    with pytest.raises(StrategyError, match="no cache"):
        chat.set_strategy(make_strategy({"strategy": "no_cache"}))


def test_quantized_rebuilds_when_the_history_changes(tiny):
    chat = session(tiny, "quantized", residual_length=4, q_group_size=16)
    drain(chat.send("One"))
    _, extended = drain(chat.send("Two"))
    assert extended.action in ("reuse", "rebuild")
    _, regenerated = drain(chat.regenerate())
    assert regenerated.action == "rebuild" and "cannot be cropped" in regenerated.note


def test_sink_streams_the_history_through_its_window(tiny):
    chat = session(tiny, "sink", window_length=24, num_sink_tokens=4)
    for text in ("One two three", "Four five", "Six"):
        _, stats = drain(chat.send(text))
    assert stats.action == "stream" and stats.reused_tokens > 0 and "window" in stats.note
    assert stats.cache_tokens <= 24 < len(chat.cached_ids)
    _, regenerated = drain(chat.regenerate())
    assert regenerated.action == "rebuild" and "sink" in regenerated.note


def test_an_interrupted_reply_leaves_ids_and_cache_in_step(tiny):
    chat = session(tiny)
    drain(chat.send("One"))
    events = chat.send("Two")
    next(events)
    events.close()
    assert in_sync(chat) and len(chat.history) == 2
    _, stats = drain(chat.send("Two", verify=True))
    assert stats.match and "interrupted" in stats.note and in_sync(chat)


def test_a_failing_turn_is_an_event_and_leaves_the_conversation_as_it_was(tiny, monkeypatch):
    chat = session(tiny)
    drain(chat.send("One"))
    history = list(chat.history)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tiny.model, "forward", broken)
    events, stats = drain(chat.send("Two"))
    assert stats is None and isinstance(events[-1], ChatTurnFailed) and "boom" in events[-1].message
    assert chat.history == history and chat.cache is None and len(chat.turns) == 1
    monkeypatch.undo()
    _, stats = drain(chat.send("Two", verify=True))
    assert stats.action == "rebuild" and "failed" in stats.note and stats.match


def test_the_stop_flag_ends_the_reply_early(tiny):
    import threading

    stop = threading.Event()
    stop.set()
    chat = ChatSession(tiny, make_strategy({"strategy": "dynamic"}),
                       GenerationSettings(max_new_tokens=20, stop_at_eos=False, fidelity=False))
    _, stats = drain(chat.send("One", stop=stop))
    assert stats.stop_reason == "stopped" and stats.generated_tokens == 1 and in_sync(chat)


def test_clear_and_system_prompt(tiny):
    chat = session(tiny)
    drain(chat.send("One"))
    chat.set_system("Answer in French.")
    _, stats = drain(chat.send("Two", verify=True))
    assert stats.action == "crop" and "system prompt" in stats.note and stats.match
    chat.clear()
    assert chat.history == [] and chat.turns == [] and chat.cache is None and chat.system == "Answer in French."
    _, stats = drain(chat.send("Three"))
    assert stats.action == "fresh" and stats.turn == 1


# --- prefix caches: deep copies whatever the grad mode ------------------------------------------------


def _cache(tiny, kind):
    config = tiny.config
    return {
        "dynamic": lambda: DynamicCache(),
        "static": lambda: StaticCache(config=config, max_cache_len=64),
        "quanto": lambda: QuantizedCache(backend="quanto", config=config, nbits=4, q_group_size=16, residual_length=4),
        "hqq": lambda: QuantizedCache(backend="hqq", config=config, nbits=4, q_group_size=16, residual_length=4),
        "fp8": lambda: QuantizedCache(backend="fp8", config=config),
    }[kind]()


def _state(cache):
    return held_tokens(cache), cache_bytes(cache), [
        clone_tensor(t) for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)
    ]


@pytest.mark.parametrize("mode", list(GRAD_MODES))
@pytest.mark.parametrize("kind", ["dynamic", "static", "quanto", "hqq", "fp8"])
def test_copy_cache_works_whatever_the_grad_mode_of_the_prefill(tiny, kind, mode):
    torch.manual_seed(2)
    prefix, suffix = torch.randint(5, 1000, (1, 12)), torch.randint(5, 1000, (1, 3))
    shared = _cache(tiny, kind)
    with GRAD_MODES[mode]():
        tiny.model(input_ids=prefix, cache=shared, use_cache=True)
    if mode == "grad" and kind in ("dynamic", "static"):
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(shared)
    before = _state(shared)
    first, second = copy_cache(shared), copy_cache(shared)
    with torch.no_grad():
        a = tiny.model(input_ids=suffix, cache=first, use_cache=True).logits[:, -1]
    b = _logits(tiny.model, suffix, second)
    torch.testing.assert_close(a, b)
    after = _state(shared)
    assert after[:2] == before[:2] and held_tokens(first) == held_tokens(shared) + suffix.shape[1]
    for old, new in zip(before[2], after[2]):
        assert torch.equal(old, new)


def test_copy_cache_of_none_is_none():
    assert copy_cache(None) is None


@pytest.mark.parametrize("name, knobs", [("dynamic", {}), ("static", {}), ("quantized", {"residual_length": 4,
                                                                                         "q_group_size": 16})])
def test_prefix_reuse_answers_each_prompt_and_leaves_the_prefix_cache_alone(tiny, name, knobs):
    strategy = make_strategy({"strategy": name, **knobs})
    report = run_prefix_reuse(tiny, strategy, "You know a lot about gardens.", ["Hello", "What now?"], SETTINGS)
    assert len(report.results) == 2 and report.prefix_cache_tokens == report.prefix_tokens
    for result in report.results:
        assert result.reused_tokens == report.prefix_tokens
        assert result.prefilled_tokens == result.input_tokens - report.prefix_tokens
        assert result.match or strategy.lossy
        assert result.saved_s == pytest.approx(result.without_reuse_s - result.with_reuse_s)
    assert report.total_saved_s == pytest.approx(report.total_without_s - report.total_with_s)


def test_a_prefix_cache_filled_with_grad_enabled_serves_prompts(tiny):
    prefix_ids = tiny.tokenizer("A shared prefix about gardens and compost.")["input_ids"]
    full = prefix_ids + tiny.tokenizer(" What goes in the bin?", add_special_tokens=False)["input_ids"]
    for mode in GRAD_MODES.values():
        cache = DynamicCache()
        with mode():
            tiny.model(input_ids=torch.tensor([prefix_ids]), cache=cache, use_cache=True)
        shared = PrefixCache(cache, prefix_ids)
        dynamic = make_strategy({"strategy": "dynamic"})
        reply, _, reused, note = answer_from_prefix(tiny, dynamic, shared, full, SETTINGS)
        assert reused == len(prefix_ids) and note == "" and held_tokens(cache) == len(prefix_ids)
        fresh = generate_reply(tiny, dynamic, DynamicCache(), full, 0, SETTINGS)
        assert reply.token_ids == fresh.token_ids


def test_prefix_reuse_refuses_what_cannot_work(tiny):
    dynamic = make_strategy({"strategy": "dynamic"})
    with pytest.raises(ValueError, match="no prompts"):
        run_prefix_reuse(tiny, dynamic, "prefix", [], SETTINGS)
    with pytest.raises(ValueError, match="empty"):
        run_prefix_reuse(tiny, dynamic, "  ", ["hi"], SETTINGS)
    with pytest.raises(StrategyError, match="no cache"):
        run_prefix_reuse(tiny, make_strategy({"strategy": "no_cache"}), "prefix", ["hi"], SETTINGS)
    with pytest.raises(StrategyError, match="max_cache_len"):
        run_prefix_reuse(tiny, make_strategy({"strategy": "static", "max_cache_len": 8}), "prefix", ["hi"], SETTINGS)
    with pytest.raises(StrategyError, match="window"):
        run_prefix_reuse(tiny, make_strategy({"strategy": "sink", "window_length": 64}), "prefix", ["hi"], SETTINGS)


# --- the command line's error handling (no model is loaded) -------------------------------------------


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"), ("a: b\n", "non-empty YAML list"), ("- ok\n- ''\n", "item 2"),
    ("[unclosed", "not valid YAML"),
])
def test_chat_cli_rejects_bad_turn_files(tmp_path, capsys, content, message):
    path = tmp_path / "turns.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["chat", "--turns", str(path)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("strategy, message", [
    ("bogus", "unknown strategy"), ("quantized:nbits=5", "nbits"), ("dynamic,static", "exactly one"),
    ("no_cache", "no cache"), ("static:max_cache_len", "key=value"),
])
def test_chat_cli_rejects_bad_strategies(tmp_path, capsys, strategy, message):
    path = tmp_path / "turns.yaml"
    path.write_text("- Hello\n")
    assert main(["chat", "--turns", str(path), "--strategy", strategy]) == 2
    assert message in capsys.readouterr().err


def test_prefix_cli_rejects_missing_and_empty_files(tmp_path, capsys):
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("- Hello\n")
    assert main(["prefix", "--prefix", str(tmp_path / "missing.txt"), "--prompts", str(prompts)]) == 2
    assert "cannot read prefix file" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(["prefix", "--prefix", str(empty), "--prompts", str(prompts)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_compiled_static_chat_matches_eager_and_compiles_once(tiny, monkeypatch):
    import kvlab.caches.compiled

    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False, fidelity=False)
    eager = ChatSession(tiny, make_strategy({"strategy": "static", "max_cache_len": 256}), settings)
    compiled = ChatSession(tiny, make_strategy({"strategy": "static", "max_cache_len": 256, "compile": True}),
                           dataclasses.replace(settings))
    assert compiled.strategy.is_compileable and not eager.strategy.is_compileable
    compiled_steps = []
    real_step = kvlab.caches.compiled.decode_step
    monkeypatch.setattr(kvlab.caches.compiled, "decode_step", lambda *args: compiled_steps.append(1) or real_step(*args))
    for turn, text in enumerate(["Hello there", "Tell me more", "Bye"]):
        _, expected = drain(eager.send(text, baseline=False))
        with torch._dynamo.config.patch(error_on_recompile=turn > 0):
            _, got = drain(compiled.send(text, baseline=False))
        assert got.reply_ids == expected.reply_ids and in_sync(compiled)
    # Every decode step after each turn's first token ran the compiled forward: 3 turns x 4 steps.
    assert len(compiled_steps) == 12
