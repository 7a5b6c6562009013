"""A diverge run from its plain inputs to its record, the one path every front takes: the strategy's and the
reference's spelling read (`parse_strategy`: a registered strategy with its knobs, or a loop mistake of
`kvlab.inspect.loops.LOOP_VARIANTS`), the request checked before any model loads (`DivergeRequest.check`), the
lockstep session built on a loaded model (`DivergeRequest.session`), and the record (`diverge_record`) that
`python -m kvlab diverge --json` writes and the `diverge` agent tool returns (`run_diverge` runs it to the end).

This module decides what a diverge record holds; it prints nothing and renders nothing (`kvlab.cli.diverge`,
`kvlab.ui.hosting.tools`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..generation import GenerationSettings, check_prompt, encode_prompt
from .diverge import MAX_DIVERGE_STEPS, DivergeSession
from .loops import LOOP_VARIANTS

DEFAULT_STEPS = 16
"""Steps a diverge run takes unless told otherwise."""


def parse_strategy(text: str):
    """A registered strategy or a loop variant from its command-line spelling. Raises ValueError (StrategyError)."""
    from ..strategies import StrategyError, make_strategy
    from ..strategies.base import parse_strategy_item

    text = text.strip()
    if text in LOOP_VARIANTS:
        return LOOP_VARIANTS[text]()
    loop = next((name for name in LOOP_VARIANTS if text.startswith(name + ":")), None)
    if loop is not None:
        raise StrategyError(f"{loop} takes no knobs (got {text[len(loop) + 1:]!r}): a loop mistake always runs on "
                            f"a dynamic cache; write {loop} alone")
    if text.startswith("loop:"):
        raise StrategyError(f"unknown loop mistake {text!r}: choose {' or '.join(LOOP_VARIANTS)}")
    return make_strategy(parse_strategy_item(text))


@dataclass(frozen=True)
class DivergeRequest:
    """What a diverge run asks for, as its fronts spell it: `strategy` and `reference` in compare syntax (or a loop
    mistake for `strategy`), the prompt (`system` and `chat`: the chat template applied), `steps` tokens, one
    lockstep step each, and whether the run ends at the end-of-sequence token. `flag_prefix` is put before the
    names of steps and reference in messages ("--" for the command line)."""

    strategy: str
    prompt: str
    steps: int = DEFAULT_STEPS
    reference: str = "dynamic"
    system: str = ""
    chat: bool = True
    stop_at_eos: bool = True
    flag_prefix: str = ""

    def check(self) -> tuple:
        """(strategy, reference strategy, GenerationSettings), checked without a model.

        Raises:
            ValueError: an empty prompt or one that is not valid Unicode, steps outside 1..MAX_DIVERGE_STEPS, a
                strategy that does not parse (StrategyError), or a reference that is not an exact cache; one line
                saying what to change.
        """
        check_prompt(self.prompt)
        if not 1 <= self.steps <= MAX_DIVERGE_STEPS:
            raise ValueError(f"{self.flag_prefix}steps must be from 1 to {MAX_DIVERGE_STEPS}, got {self.steps}")
        strategy, reference = parse_strategy(self.strategy), parse_strategy(self.reference)
        if reference.lossy or not reference.use_cache:
            raise ValueError(f"{self.flag_prefix}reference must be an exact cache (dynamic, static), got "
                             f"{reference.describe()}")
        settings = GenerationSettings(max_new_tokens=self.steps, stop_at_eos=self.stop_at_eos, fidelity=False)
        settings.check()
        return strategy, reference, settings

    def session(self, loaded) -> DivergeSession:
        """The lockstep session on `loaded` (a `kvlab.models.loading.LoadedModel`); raises what `check` raises."""
        strategy, reference, settings = self.check()
        prompt_ids = encode_prompt(loaded.tokenizer, self.prompt, self.system, self.chat)
        return DivergeSession(loaded, strategy, prompt_ids, settings, reference)

    def prompt_json(self) -> dict:
        """The prompt as the record keeps it."""
        return {"text": self.prompt, "system": self.system, "chat": self.chat}


def diverge_record(session: DivergeSession, prompt: dict, model_info: dict) -> dict:
    """The record of a diverge run: settings, tokens, first divergence, every step's record (JSON-ready)."""
    return {"model": model_info, "strategy": session.strategy.describe(), "reference": session.reference.describe(),
            "explanation": getattr(session.strategy, "explanation", ""), "prompt": prompt,
            "prompt_tokens": session.prompt_ids.shape[1], "token_ids": session.token_ids,
            "first_divergence": session.first_divergence, "steps": [r.to_json() for r in session.records]}


def run_diverge(loaded, request: DivergeRequest, stop: threading.Event | None = None) -> dict:
    """Run `request` on `loaded` to its last step (or until `stop` is set), its steps on kvlab's compute thread,
    and return its record. Raises what `DivergeRequest.check` raises."""
    from ..compute import compute_iter

    session = request.session(loaded)
    for _ in compute_iter(session.steps(request.steps)):
        if stop is not None and stop.is_set():
            break
    return diverge_record(session, request.prompt_json(), loaded.info())
