"""The tokenizer the unit tier runs on (tests/conftest.py `tiny_tokenizer`): a real byte-level BPE
trained in-process, with special tokens and a ChatML chat template. Checks what kvlab relies on:
lossless round trips, learned merges, special ids, and chat renderings that extend each other."""

TEXT = "The garden keeps its compost in a bin; naïve café — 東京 🌱."
TEMPLATE_GLUE = "<|im_end|>\n<|im_start|>assistant\n"


def test_text_round_trips_and_merges_were_learned(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == TEXT
    prose = "The return statement leaves the current function call with the expression list."
    assert len(tiny_tokenizer(prose)["input_ids"]) < len(prose.encode()) / 2
    assert max(ids) < len(tiny_tokenizer) == 1000


def test_special_tokens_have_their_own_ids_and_are_skipped_when_decoding(tiny_tokenizer):
    specials = [tiny_tokenizer.unk_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id,
                tiny_tokenizer.pad_token_id]
    assert specials == [0, 1, 2, 3]
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    ids = tiny_tokenizer("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == tiny_tokenizer.bos_token_id and ids[-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_chat_template_renders_chatml_with_a_default_system_message(tiny_tokenizer):
    user = [{"role": "user", "content": "Hi"}]
    prompt = tiny_tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tiny_tokenizer.apply_chat_template(user, tokenize=False).endswith("assistant\n")
    own = [{"role": "system", "content": "Be brief."}] + user
    assert tiny_tokenizer.apply_chat_template(own, tokenize=False).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_a_longer_conversation_starts_with_the_ids_of_the_shorter_one(tiny_tokenizer):
    first = [{"role": "user", "content": "One"}]
    longer = first + [{"role": "assistant", "content": "Two"}, {"role": "user", "content": "Three"}]
    short_ids = tiny_tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
    long_ids = tiny_tokenizer.apply_chat_template(longer, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]
    assert long_ids[:len(short_ids)] == short_ids and len(long_ids) > len(short_ids)
    assert tiny_tokenizer.decode(long_ids).endswith("Three" + TEMPLATE_GLUE)


def test_the_tiny_model_stops_at_the_tokenizers_eos(tiny, tiny_tokenizer):
    assert tiny.tokenizer is tiny_tokenizer
    assert tiny.config.eos_token_id == tiny_tokenizer.eos_token_id
    assert tiny.config.vocab_size == len(tiny_tokenizer)


def test_a_plain_prompt_keeps_the_system_text_before_it(tiny):
    """A base model (or chat=False) has no system role: the system text goes first, a blank line, then the
    prompt; it is never dropped."""
    from kvlab.generation import encode_prompt

    tokenizer = tiny.tokenizer
    with_system = encode_prompt(tokenizer, "Once upon a time", system="Be brief.", chat=False)
    assert with_system[0].tolist() == tokenizer("Be brief.\n\nOnce upon a time", return_tensors="pt")["input_ids"][0].tolist()
    assert encode_prompt(tokenizer, "Once upon a time", system="  ", chat=False)[0].tolist() == \
        tokenizer("Once upon a time", return_tensors="pt")["input_ids"][0].tolist()
