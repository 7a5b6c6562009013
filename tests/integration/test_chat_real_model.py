"""Multi-turn cache reuse and prefix reuse on the real bundled model (SmolLM2-135M-Instruct, fp32, greedy).

What must hold: with one cache kept across a scripted 4-turn chat, every reply
equals the reply generated with the whole history re-prefilled from scratch,
and from turn 2 on only the new message and the chat template's glue are
prefilled. A shared prefix cache serves each prompt from a deep copy: every
reply equals a fresh `generate()` on prefix + prompt, the shared cache keeps
its length and bytes, whatever the grad mode of the prefill. The `chat` and
`prefix` commands write the promised JSON fields.
"""

import json

import pytest
import torch
import yaml
from transformers import DynamicCache

from kvlab.accounting import cache_bytes
from kvlab.chat.session import ChatSession, ChatTurnDone
from kvlab.chat.reuse import held_tokens
from kvlab.cli import main
from kvlab.generation import GenerationSettings
from kvlab.presets import PRESETS_DIR
from kvlab.chat.prefix import PrefixCache, answer_from_prefix, prefix_and_prompt_ids, prefill_prefix, run_prefix_reuse
from kvlab.strategies import make_strategy

NEW_TOKENS = 24
TURNS = yaml.safe_load((PRESETS_DIR / "chat_turns.yaml").read_text())
DOCUMENT = (PRESETS_DIR / "prefix_document.txt").read_text()
SHORT_DOCUMENT = " ".join(DOCUMENT.split()[:60])
PROMPTS = yaml.safe_load((PRESETS_DIR / "prefix_prompts.yaml").read_text())[:2]
SHORT_TOKENS = 8


def run_chat(loaded, strategy: dict, turns=TURNS, verify=True, new_tokens=NEW_TOKENS):
    chat = ChatSession(loaded, make_strategy(strategy), GenerationSettings(max_new_tokens=new_tokens, fidelity=False))
    stats = []
    for text in turns:
        stats += [e.stats for e in chat.send(text, baseline=verify, verify=verify) if isinstance(e, ChatTurnDone)]
    assert len(stats) == len(turns)
    return chat, stats


def template_glue(tokenizer) -> int:
    """Tokens the chat template adds around one more exchange, besides the two messages' own tokens.

    Rendered from the template itself: [user Q] + generation prompt, versus
    [user Q, assistant A, user B] + generation prompt, minus the tokens of A and B.
    """
    def render(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])

    one = [{"role": "user", "content": "Q"}]
    two = one + [{"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]
    own = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in ("A", "B"))
    return render(two) - render(one) - own


@pytest.fixture(scope="module")
def dynamic_chat(bundled):
    return run_chat(bundled, {"strategy": "dynamic"})


def test_four_turns_every_reply_with_reuse_equals_the_reply_without(dynamic_chat):
    _, stats = dynamic_chat
    for turn in stats:
        assert turn.match is True, (turn.turn, turn.reply, turn.verify_reply)
        assert turn.reply.strip()


def test_from_turn_two_only_the_new_message_and_template_glue_are_prefilled(bundled, dynamic_chat):
    chat, stats = dynamic_chat
    glue = template_glue(bundled.tokenizer)
    assert 0 < glue <= 16
    for previous, turn in zip(stats, stats[1:]):
        own = len(bundled.tokenizer(turn.user, add_special_tokens=False)["input_ids"])
        # The previous reply's last token was chosen but never fed, unless it was the end-of-turn token,
        # which the template's glue already counts.
        unfed = 0 if previous.stop_reason == "eos" else 1
        assert turn.action == "reuse" and turn.cropped_tokens == 0
        assert turn.reused_tokens == previous.input_tokens + previous.generated_tokens - 1 > 0
        assert turn.prefilled_tokens == own + glue + unfed
    assert held_tokens(chat.cache) == len(chat.cached_ids)


def test_static_cache_replies_match_too(bundled):
    _, stats = run_chat(bundled, {"strategy": "static", "max_cache_len": 512}, TURNS[:2])
    assert all(turn.match for turn in stats)
    assert [turn.action for turn in stats] == ["fresh", "reuse"]
    assert len({turn.cache_bytes for turn in stats}) == 1


def test_sink_within_its_window_is_exact_and_streams_beyond(bundled):
    _, wide = run_chat(bundled, {"strategy": "sink", "window_length": 256}, TURNS[:2], new_tokens=SHORT_TOKENS)
    assert all(turn.match for turn in wide) and wide[1].action == "stream"
    _, narrow = run_chat(bundled, {"strategy": "sink", "window_length": 48, "num_sink_tokens": 4}, TURNS[:3],
                         verify=False, new_tokens=SHORT_TOKENS)
    assert [turn.action for turn in narrow] == ["fresh", "stream", "stream"]
    assert all(turn.cache_tokens <= 48 for turn in narrow) and "window" in narrow[-1].note


def test_resend_regenerate_and_undo_on_the_real_model(bundled):
    chat = ChatSession(bundled, make_strategy({"strategy": "dynamic"}),
                       GenerationSettings(max_new_tokens=SHORT_TOKENS, fidelity=False))

    def send(events):
        return [e.stats for e in events if isinstance(e, ChatTurnDone)][0]

    first = send(chat.send(TURNS[0], baseline=False))
    again = send(chat.send(TURNS[0], verify=True))
    assert again.match and again.action == "reuse"
    regenerated = send(chat.regenerate(verify=True))
    assert regenerated.reply_ids == again.reply_ids and regenerated.match and regenerated.action == "crop"
    assert chat.undo() and len(chat.history) == 2
    redo = send(chat.send(TURNS[0], verify=True))
    assert redo.reply_ids == again.reply_ids and redo.match and redo.action == "crop"
    assert first.turn == 1 and redo.turn == 2


def reference_reply(bundled, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy `generate()` on a fresh cache: the new token ids (padded after an end-of-turn token)."""
    with torch.inference_mode():
        out = bundled.model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                     cache=DynamicCache(), pad_token_id=bundled.tokenizer.eos_token_id)
    return out[0, len(ids):].tolist()


def test_prefix_reuse_matches_a_fresh_generate_and_leaves_the_prefix_cache_alone(bundled):
    strategy = make_strategy({"strategy": "dynamic"})
    encoded = [prefix_and_prompt_ids(bundled.tokenizer, DOCUMENT, prompt) for prompt in PROMPTS]
    prefix_ids = encoded[0][0]
    shared = prefill_prefix(bundled, strategy, prefix_ids, 1024)
    length, size = held_tokens(shared.cache), cache_bytes(shared.cache)
    settings = GenerationSettings(max_new_tokens=SHORT_TOKENS * 2, fidelity=False)
    for _, full in encoded:
        assert full[: len(prefix_ids)] == prefix_ids
        reply, _, reused, note = answer_from_prefix(bundled, strategy, shared, full, settings)
        assert reused == len(prefix_ids) and note == ""
        assert reply.token_ids == reference_reply(bundled, full, SHORT_TOKENS * 2)[: len(reply.token_ids)]
        assert (held_tokens(shared.cache), cache_bytes(shared.cache)) == (length, size)


@pytest.mark.parametrize("mode", [torch.enable_grad, torch.no_grad, torch.inference_mode])
def test_prefix_copies_work_whatever_the_grad_mode_of_the_prefill(bundled, mode):
    prefix_ids, full = prefix_and_prompt_ids(bundled.tokenizer, SHORT_DOCUMENT, PROMPTS[0])
    cache = DynamicCache()
    with mode():
        bundled.model(input_ids=torch.tensor([prefix_ids]), cache=cache, use_cache=True, logits_to_keep=1)
    length, size = held_tokens(cache), cache_bytes(cache)
    reply, _, _, _ = answer_from_prefix(bundled, make_strategy({"strategy": "dynamic"}), PrefixCache(cache, prefix_ids),
                                        full, GenerationSettings(max_new_tokens=SHORT_TOKENS, fidelity=False))
    assert reply.token_ids == reference_reply(bundled, full, SHORT_TOKENS)[: len(reply.token_ids)]
    assert (held_tokens(cache), cache_bytes(cache)) == (length, size)


@pytest.mark.parametrize("strategy", [{"strategy": "static"}, {"strategy": "quantized", "residual_length": 16}])
def test_prefix_reuse_runs_for_static_and_quantized(bundled, strategy):
    chosen = make_strategy(strategy)
    report = run_prefix_reuse(bundled, chosen, SHORT_DOCUMENT, PROMPTS[:1],
                              GenerationSettings(max_new_tokens=SHORT_TOKENS, fidelity=False))
    result = report.results[0]
    assert result.reused_tokens == report.prefix_tokens == report.prefix_cache_tokens
    assert result.match or chosen.lossy
    assert result.reply.strip()


def test_chat_and_prefix_commands_write_the_promised_fields(tmp_path):
    turns = tmp_path / "turns.yaml"
    turns.write_text(yaml.safe_dump(TURNS[:2]))
    out = tmp_path / "chat.json"
    assert main(["chat", "--turns", str(turns), "--strategy", "quantized:backend=quanto:nbits=4", "--verify",
                 "--max-new-tokens", "8", "--device", "cpu", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["knobs"]["backend"] == "quanto" and len(record["turns"]) == 2
    for turn in record["turns"]:
        assert {"reused_tokens", "prefilled_tokens", "ttft_s", "reply", "verify_reply", "match"} <= set(turn)
    assert record["turns"][1]["reused_tokens"] > 0
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(yaml.safe_dump(PROMPTS[:1]))
    out = tmp_path / "prefix.json"
    assert main(["prefix", "--prefix", str(PRESETS_DIR / "prefix_document.txt"), "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--device", "cpu", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    result = record["results"][0]
    assert {"reply", "with_reuse_s", "without_reuse_s", "match"} <= set(result) and result["match"] is True
    assert record["total_saved_s"] == pytest.approx(record["total_without_s"] - record["total_with_s"])
