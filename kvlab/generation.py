"""Generation settings, prompt checks and encoding, and next-token choice.

Sampling uses transformers' own logits processors (temperature, top-k, top-p,
repetition penalty); each column draws from its own `torch.Generator` seeded
with the same seed, so sampled columns draw the same random numbers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from .measure.record import DEFAULT_POLICY, POLICIES

MAX_NEW_TOKENS_CAP = int(os.environ.get("KVLAB_MAX_NEW_TOKENS", "4096"))
MAX_PROMPT_TOKENS = int(os.environ.get("KVLAB_MAX_PROMPT_TOKENS", "8192"))
PROMPT_CHARS_PER_TOKEN = 32
"""Characters read per allowed prompt token: a prompt longer than MAX_PROMPT_TOKENS × this many characters is
refused before the tokenizer reads it (English runs about 4 per token; tokenizing a 20 MB message took about a
minute of CPU and gigabytes of memory, only to be refused for its token count)."""
EMPTY_PROMPT = "the prompt is empty: type something to generate from"


def surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (a code point that UTF-8 cannot encode), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def prompt_refusal(prompt, what: str = "the prompt") -> str | None:
    """One line saying why `prompt` cannot run (empty, or holding a lone surrogate), or None when it can.

    A JSON escape (`\\ud800`) or an API client can hand kvlab a lone surrogate: the tokenizer reads it, but no page
    can show it (gradio cannot encode it as UTF-8 for the browser), so every front refuses it before it runs.
    """
    if not (prompt or "").strip():
        return EMPTY_PROMPT if what == "the prompt" else f"{what} is empty: type something to generate from"
    at = surrogate_at(prompt)
    if at is not None:
        return (f"{what} holds text that is not valid Unicode (a lone surrogate at character {at + 1}); "
                "type or paste it again")
    return None


def check_prompt(prompt, what: str = "the prompt") -> None:
    """Raise ValueError with `prompt_refusal`'s line unless `prompt` can run."""
    refusal = prompt_refusal(prompt, what)
    if refusal:
        raise ValueError(refusal)


@dataclass
class GenerationSettings:
    """How each column generates.

    max_new_tokens: tokens to generate (1..MAX_NEW_TOKENS_CAP).
    do_sample: False = greedy; True = sample with temperature/top_p/top_k.
    repetition_penalty: > 0, 1.0 = off. seed: for sampling.
    stop_at_eos: end a column at the tokenizer's end-of-sequence token.
    fidelity: score every column against the baseline after the run.
    timing_policy: how the timing figures are taken, one of `kvlab.measure.POLICIES` (`live`, the default:
        the live run's figures after a warm-up; see docs/timing.md).
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True
    fidelity: bool = True
    timing_policy: str = DEFAULT_POLICY

    def problems(self) -> list[str]:
        """Human-readable reasons these settings are invalid (empty when valid)."""
        found = []
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_CAP:
            found.append(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}, got {self.max_new_tokens!r}")
        if not self.repetition_penalty > 0:
            found.append(f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty!r}")
        if self.timing_policy not in POLICIES:
            found.append(f"timing_policy must be one of {list(POLICIES)}, got {self.timing_policy!r}")
        if self.do_sample:
            if not self.temperature > 0:
                found.append(f"temperature must be > 0 when sampling (use greedy for 0), got {self.temperature!r}")
            if not 0 < self.top_p <= 1:
                found.append(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
            if not isinstance(self.top_k, int) or self.top_k < 0:
                found.append(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        return found

    def check(self) -> None:
        """Raise ValueError listing every problem."""
        found = self.problems()
        if found:
            raise ValueError("; ".join(found))

    def with_overrides(self, overrides: dict | None) -> "GenerationSettings":
        """A copy with some fields replaced; unknown names raise ValueError listing the allowed ones.

        A column's `max_new_tokens` is a ceiling: the column makes at most that many tokens and never more
        than the run's own `max_new_tokens` (a run asked for 4 tokens gives every column at most 4)."""
        if not overrides:
            return self
        allowed = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            raise ValueError(f"unknown generation setting(s) {unknown}; allowed: {allowed}")
        overrides = dict(overrides)
        limit = overrides.get("max_new_tokens")
        if isinstance(limit, int) and isinstance(self.max_new_tokens, int):
            overrides["max_new_tokens"] = min(limit, self.max_new_tokens)
        return dataclasses.replace(self, **overrides)


def build_logits_processors(settings: GenerationSettings):
    """transformers LogitsProcessorList for `settings` (empty for plain greedy)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    processors = LogitsProcessorList()
    if settings.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(settings.repetition_penalty))
    if settings.do_sample:
        if settings.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k > 0:
            processors.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            processors.append(TopPLogitsWarper(settings.top_p))
    return processors


class TokenChooser:
    """Picks the next token from last-position logits, greedy or sampled.

    Args:
        settings: validated generation settings.
        device: where the generator lives (the logits' device).
    """

    def __init__(self, settings: GenerationSettings, device: torch.device):
        self.settings = settings
        self.processors = build_logits_processors(settings)
        self.generator = None
        if settings.do_sample:
            self.generator = torch.Generator(device=device).manual_seed(settings.seed)

    def __call__(self, sequence: torch.Tensor, logits: torch.Tensor) -> int:
        """sequence: (1, seq) token ids so far; logits: (1, vocab) float. Returns the token id."""
        scores = self.processors(sequence, logits.float()) if self.processors else logits
        if self.generator is None:
            return int(scores.argmax(dim=-1)[0])
        probs = torch.softmax(scores.float(), dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator)[0, 0])


def eos_token_ids(loaded) -> set[int]:
    """End-of-sequence ids from the generation config and the tokenizer."""
    ids = set()
    for source in (getattr(loaded.model, "generation_config", None), loaded.tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


PLAIN_ROLES = {"system": "", "user": "User: ", "assistant": "Assistant: "}
"""How `plain_conversation` labels each role's turn (the system text stands alone at the top)."""


def plain_conversation(messages: list[dict]) -> str:
    """Chat messages as plain text for a base model (no chat template): one line per turn, `User: ...` and
    `Assistant: ...` (the system message first, unlabelled), ending with `Assistant:` for the reply."""
    lines = [PLAIN_ROLES.get(m["role"], f"{m['role'].capitalize()}: ") + str(m["content"]).strip() for m in messages]
    return "\n".join(lines + ["Assistant:"])


def encode_prompt(tokenizer, prompt: str | list[dict], system: str = "", chat: bool = True) -> torch.Tensor:
    """Token ids (1, seq) for a plain-text prompt or chat messages.

    `prompt` as a string with `chat=True` becomes one user message (after an
    optional system message) rendered by the tokenizer's chat template with the
    generation prompt; with `chat=False`, or for a tokenizer without a chat
    template (a base model), it is tokenized as is, after the system text and a
    blank line when one is given (never dropped). Messages given to a tokenizer
    without a chat template are joined as plain text (`plain_conversation`).

    Raises:
        ValueError: empty prompt, one that is not valid Unicode (a lone surrogate), longer than
            MAX_PROMPT_TOKENS × PROMPT_CHARS_PER_TOKEN characters (checked before tokenizing), or longer than
            MAX_PROMPT_TOKENS tokens.
    """
    if isinstance(prompt, str):
        check_prompt(prompt)
        if chat and getattr(tokenizer, "chat_template", None):
            messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
                {"role": "user", "content": prompt}
            ]
        else:
            messages = None
            prompt = f"{system.strip()}\n\n{prompt}" if system and system.strip() else prompt
    else:
        messages = list(prompt)
        if not messages or not any(str(m.get("content", "")).strip() for m in messages):
            raise ValueError("the conversation is empty: add a message")
        for message in messages:
            if surrogate_at(str(message.get("content", ""))) is not None:
                check_prompt(str(message.get("content", "")), "a message")
    texts = [prompt, system or ""] if messages is None else [str(m.get("content", "")) for m in messages]
    chars = sum(len(text) for text in texts)
    if chars > MAX_PROMPT_TOKENS * PROMPT_CHARS_PER_TOKEN:
        raise ValueError(f"the prompt has {chars:,} characters; the limit here is "
                         f"{MAX_PROMPT_TOKENS * PROMPT_CHARS_PER_TOKEN:,} ({PROMPT_CHARS_PER_TOKEN} per token of "
                         f"KVLAB_MAX_PROMPT_TOKENS={MAX_PROMPT_TOKENS})")
    if messages is not None and not getattr(tokenizer, "chat_template", None):
        prompt, messages = plain_conversation(messages), None
    if messages is None:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    else:
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = encoded if isinstance(encoded, torch.Tensor) else encoded["input_ids"]
    if ids.shape[1] > MAX_PROMPT_TOKENS:
        raise ValueError(f"the prompt has {ids.shape[1]} tokens; the limit here is {MAX_PROMPT_TOKENS} "
                         "(KVLAB_MAX_PROMPT_TOKENS)")
    return ids


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return delta
