"""The passkey prompt: Landmark Attention's retrieval test, built to a token length with the needle at a depth.

Format from Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length for
Transformers" (arXiv:2305.16300), as reused by LongLoRA (arXiv:2309.12307) and Quest (arXiv:2406.10774):
an instruction, repeated filler sentences, the needle "The pass key is K. Remember it. K is the pass key."
somewhere in the filler, and the question "What is the pass key? The pass key is" whose continuation
is scored. Raw text, no chat template (a small instruct model answers the question inside a chat turn
with an explanation instead of the key).

Each seed gives a different 5-digit key and starts the filler at a different sentence. This module builds
prompts and their token ids; it does not run a model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.")
FILLER_SENTENCES = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
                    "There and back again.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
KEY_DIGITS = 5
KEY_LOW, KEY_HIGH = 10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS - 1


@dataclass(frozen=True)
class PasskeyPrompt:
    """One cell's prompt.

    text: the exact prompt (ends with ANSWER_PREFIX, no trailing space). prompt_ids: its token ids, tokenized
    as plain text without special tokens. key: the pass key as a string. key_ids: the ids of " " + key that
    follow the prompt (tokenizing text + " " + key gives prompt_ids + key_ids). key_position: index in
    prompt_ids of the needle sentence's first token. depth: where the needle sits in the filler (0 = first,
    1 = last). seed: what chose the key and the filler offset.
    """

    text: str
    prompt_ids: tuple[int, ...]
    key: str
    key_ids: tuple[int, ...]
    key_position: int
    depth: float
    seed: int

    @property
    def context_tokens(self) -> int:
        """The real prompt length in tokens."""
        return len(self.prompt_ids)

    @property
    def tokens_after_key(self) -> int:
        """Tokens from the needle's first token to the end of the prompt (a window cache keeps the needle only
        if its window holds at least this many recent tokens)."""
        return len(self.prompt_ids) - self.key_position


def passkey_for(seed: int) -> tuple[str, int]:
    """(5-digit key, filler offset in 0..len(FILLER_SENTENCES)-1) for `seed`, the same on every machine."""
    rng = random.Random(seed)
    return str(rng.randint(KEY_LOW, KEY_HIGH)), rng.randrange(len(FILLER_SENTENCES))


def _filler(count: int, offset: int) -> list[str]:
    return [FILLER_SENTENCES[(offset + i) % len(FILLER_SENTENCES)] for i in range(count)]


def compose(sentences: int, depth: float, key: str, offset: int) -> tuple[str, str]:
    """(full prompt text, the text before the needle) with `sentences` filler sentences, round(depth * sentences)
    of them before the needle."""
    before = round(depth * sentences)
    filler = _filler(sentences, offset)
    head = " ".join([INSTRUCTION, *filler[:before]])
    tail = " ".join([NEEDLE.format(key=key), *filler[before:], QUESTION, ANSWER_PREFIX])
    return f"{head} {tail}", head


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def min_context_tokens(tokenizer) -> int:
    """Tokens of a prompt without filler (instruction, needle, question): the shortest length one can ask for."""
    return len(_ids(tokenizer, compose(0, 0.0, "1" * KEY_DIGITS, 0)[0]))


def key_tokens(tokenizer, seeds) -> int:
    """The most tokens the key (" " + the 5-digit key after ANSWER_PREFIX) takes for any of `seeds`: the fewest
    greedy tokens an answer needs to be able to hit."""
    prefix = len(_ids(tokenizer, ANSWER_PREFIX))
    return max(len(_ids(tokenizer, f"{ANSWER_PREFIX} {passkey_for(seed)[0]}")) - prefix for seed in seeds)


def build_passkey_prompt(tokenizer, target_tokens: int, depth: float, seed: int) -> PasskeyPrompt:
    """The passkey prompt of at most `target_tokens` tokens (as close as whole filler sentences allow) with
    the needle at `depth`.

    Raises:
        ValueError: depth outside [0, 1], or `target_tokens` below `min_context_tokens(tokenizer)`.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    key, offset = passkey_for(seed)
    bare = len(_ids(tokenizer, compose(0, depth, key, offset)[0]))
    if target_tokens < bare:
        raise ValueError(f"a passkey prompt needs at least {bare} tokens, got {target_tokens}")
    per_sentence = max(1, len(_ids(tokenizer, " ".join(_filler(len(FILLER_SENTENCES), 0)))) / len(FILLER_SENTENCES))
    sentences = max(0, int((target_tokens - bare) / per_sentence) + 1)
    while True:
        text, head = compose(sentences, depth, key, offset)
        ids = _ids(tokenizer, text)
        if len(ids) <= target_tokens or sentences == 0:
            break
        sentences -= 1
    key_ids = _ids(tokenizer, text + " " + key)[len(ids):]
    return PasskeyPrompt(text, tuple(ids), key, tuple(key_ids), len(_ids(tokenizer, head)), depth, seed)
