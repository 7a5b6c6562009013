"""Divergence forensics: a lossy run stepped in lockstep with a dense reference, compared layer by layer.

`DivergeSession` steps a strategy's own decode loop (`kvlab.engine.Decoder`) and, after each step, feeds the
same ids (the lossy run's own tokens, teacher-forced) through a reference cache (default `dynamic`) on the same
model through the same engine (`kvlab.engine.forward`). Per step it records a `DivergeStep`: the next-token
KL(reference || lossy) in nats and both top-5, and per decoder layer a `LayerDivergence`:

- KV error: relative Frobenius error ||K - K_ref|| / ||K_ref|| (and the same for values) of what the layer
  holds against the reference's keys/values at the positions both hold (`kvlab.inspect.held`: quantized
  layers de-quantized; a sink layer's keys rotated back to their absolute positions);
- attention lost: the attention mass the reference's query of the step's token puts, per KV head (mean over
  the query heads sharing it), on positions the lossy layer no longer holds, recomputed from the reference's
  keys and the query rebuilt with the model's rotary embedding and scaling (`kvlab.inspect.probes`);
- hidden-state drift: cosine similarity and relative L2 ||h - h_ref|| / ||h_ref|| of the residual stream
  after the layer, for the step's token;
- logit lens (nostalgebraist 2020; Belrose et al. 2023, arXiv:2303.08112 for the tuned variant): each
  layer's hidden state through the final norm and LM head; `DivergeStep.lens_diverged_from` is the first
  layer from which the two runs' top-1 differ through the last layer.

A measure that cannot be computed is None and `LayerDivergence.reasons` says why (never 0).

This module runs and measures; it does not render (`kvlab.ui`) and does not pick a thread (callers run `step`
on kvlab's compute thread).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from ..engine import Decoder, forward
from ..generation import GenerationSettings
from .inspector import (MAX_INSPECT_STEPS, Candidate, InspectError, SteppedSession, held_tokens, kl_nats,
                        top_candidates)
from ..strategies import Strategy
from ..strategies.dynamic import Dynamic
from .held import HeldKV, held_kv
from .probes import attention_probs, attention_unsupported_reason, decoder_parts, probe

MAX_DIVERGE_STEPS = MAX_INSPECT_STEPS
"""Most steps one lockstep session keeps."""
DIVERGED_ATOL = 1e-4
"""A per-layer measure above this counts as 'this layer differs' in `first_layer_with`: float32 rounding of
two equal runs computed with different shapes stays orders of magnitude below it."""


@dataclass(frozen=True)
class LayerDivergence:
    """One decoder layer at one step.

    key_error / value_error / kv_error: relative Frobenius errors at the positions both caches hold (kv_error
    over keys and values together). attention_lost: mean over KV heads of attention_lost_by_head, each the
    reference attention mass (0..1) on positions the lossy layer no longer holds. hidden_cosine / hidden_rel_l2:
    the residual stream after the layer. lens_top1 / lens_reference_top1: logit-lens top-1 token ids.
    held_tokens / reference_held_tokens: slots each layer holds. reasons: measure name -> why it is None.
    """

    layer: int
    key_error: float | None
    value_error: float | None
    kv_error: float | None
    attention_lost: float | None
    attention_lost_by_head: tuple[float, ...] | None
    hidden_cosine: float
    hidden_rel_l2: float
    lens_top1: int
    lens_reference_top1: int
    held_tokens: int
    reference_held_tokens: int
    reasons: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DivergeStep:
    """One lockstep step (index 0 is the prefill and the first token).

    token_id: the lossy run's chosen token (fed to both runs next). reference_token_id: the reference's top-1
    on the same ids. seen_tokens: ids fed so far; cache_length: slots the lossy cache's first layer holds.
    kl_nats: KL(reference || lossy) of the next-token distributions. lens_diverged_from: first layer from
    which the logit lens' top-1 differ through the last layer (None: they agree at the last layer).
    """

    index: int
    token_id: int
    token_text: str
    reference_token_id: int
    seen_tokens: int
    cache_length: int
    kl_nats: float
    top: tuple[Candidate, ...]
    reference_top: tuple[Candidate, ...]
    lens_diverged_from: int | None
    layers: tuple[LayerDivergence, ...]

    @property
    def top1_agrees(self) -> bool:
        """The lossy run's most likely next token is the reference's."""
        return self.top[0].token_id == self.reference_token_id

    def measure(self, name: str) -> list[float | None]:
        """One per-layer measure (a `LayerDivergence` field) over the layers."""
        return [getattr(layer, name) for layer in self.layers]

    def to_json(self) -> dict:
        record = asdict(self)
        record["top1_agrees"] = self.top1_agrees
        return record


def relative_error(other: torch.Tensor, reference: torch.Tensor) -> float:
    """||other - reference|| / ||reference|| (Frobenius); 0 when both are zero."""
    norm = float(reference.norm())
    diff = float((other - reference).norm())
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def kv_errors(lossy: HeldKV, reference: HeldKV) -> tuple[float, float, float] | None:
    """(key, value, combined) relative errors at the positions both hold, None when they share none."""
    ref_index = {int(p): i for i, p in enumerate(reference.positions[0].tolist())}
    pairs_k, pairs_v, refs_k, refs_v = [], [], [], []
    for head in range(lossy.positions.shape[0]):
        mine = [(i, ref_index[int(p)]) for i, p in enumerate(lossy.positions[head].tolist()) if int(p) in ref_index]
        if not mine:
            continue
        own, theirs = torch.tensor([m[0] for m in mine]), torch.tensor([m[1] for m in mine])
        pairs_k.append(lossy.keys[head, own]), pairs_v.append(lossy.values[head, own])
        refs_k.append(reference.keys[head, theirs]), refs_v.append(reference.values[head, theirs])
    if not pairs_k:
        return None
    k, v, rk, rv = (torch.cat(t) for t in (pairs_k, pairs_v, refs_k, refs_v))
    both = relative_error(torch.cat([k.flatten(), v.flatten()]), torch.cat([rk.flatten(), rv.flatten()]))
    return relative_error(k, rk), relative_error(v, rv), both


def attention_lost(probs: torch.Tensor, lossy: HeldKV, reference: HeldKV) -> tuple[float, ...]:
    """Per KV head, the mass of `probs` (heads, reference positions) on reference positions the lossy layer does
    not hold, averaged over the query heads of the head's group."""
    kv_heads = reference.positions.shape[0]
    groups = probs.shape[0] // kv_heads
    lost = []
    for head in range(kv_heads):
        kept = torch.isin(reference.positions[head], lossy.positions[min(head, lossy.positions.shape[0] - 1)])
        mass = probs[head * groups:(head + 1) * groups][:, ~kept].sum(dim=-1)
        lost.append(float(mass.mean()))
    return tuple(lost)


def first_layer_with(step: DivergeStep, name: str, atol: float = DIVERGED_ATOL) -> int | None:
    """The first layer whose measure `name` exceeds `atol` (None: none does, or it is unknown everywhere)."""
    for layer in step.layers:
        value = getattr(layer, name)
        if value is not None and value > atol:
            return layer.layer
    return None


class DivergeSession(SteppedSession):
    """A lossy strategy stepped in lockstep with a reference on the same model and ids.

    Args:
        loaded: a `kvlab.models.LoadedModel`.
        strategy: the strategy under study (its own greedy/sampled tokens drive both runs).
        prompt_ids: (1, prompt_tokens) ids.
        settings: generation settings; max_new_tokens at most MAX_DIVERGE_STEPS.
        reference: the reference strategy (default `dynamic`): an exact cache (on a hybrid model its sliding
            layers may keep only their window, which their attention reads anyway).

    Raises:
        InspectError: a strategy cannot run here or is compiled, the reference is lossy, the model cannot be
            probed, too many steps, bad settings.
    """

    def __init__(self, loaded, strategy: Strategy, prompt_ids: torch.Tensor, settings: GenerationSettings,
                 reference: Strategy | None = None):
        self.loaded, self.strategy, self.prompt_ids, self.settings = loaded, strategy, prompt_ids, settings
        self.reference = reference or Dynamic()
        problems = settings.problems()
        if problems:
            raise InspectError("; ".join(problems))
        if settings.max_new_tokens > MAX_DIVERGE_STEPS:
            raise InspectError(f"at most {MAX_DIVERGE_STEPS} steps per session, got {settings.max_new_tokens}")
        if self.reference.lossy or not self.reference.use_cache or self.reference.is_streaming:
            raise InspectError(f"the reference must be an exact cache (dynamic, static); {self.reference.describe()} "
                               "is not")
        for chosen in (strategy, self.reference):
            if chosen.is_compileable:
                raise InspectError(f"{chosen.describe()}: turn compile off (the probes' hooks would recompile it)")
            reason = chosen.unavailable_reason(loaded)
            if reason:
                raise InspectError(f"{chosen.describe()} cannot run here: {reason}")
            try:
                chosen.check_fits(prompt_ids.shape[1], settings.max_new_tokens)
            except ValueError as err:
                raise InspectError(str(err)) from None
        try:
            self.layers, self.norm, self.head = decoder_parts(loaded.model)
        except ValueError as err:
            raise InspectError(str(err)) from None
        self.attention_reason = attention_unsupported_reason(loaded.model)
        self.reset()

    def reset(self) -> None:
        """Fresh caches, no step taken. Runs no model work."""
        total = self.prompt_ids.shape[1] + self.settings.max_new_tokens
        self.cache = self.strategy.build_cache(self.loaded, total)
        self.reference_cache = self.reference.build_cache(self.loaded, total)
        self.decoder = Decoder(self.loaded, self.strategy, self.cache, self.prompt_ids, self.settings, trace=True)
        self.records: list[DivergeStep] = []

    @property
    def finished(self) -> bool:
        return self.decoder.stop_reason is not None

    @property
    def first_divergence(self) -> int | None:
        """Index of the first step whose top-1 differs from the reference's (None so far)."""
        return next((r.index for r in self.records if not r.top1_agrees), None)

    def step(self) -> DivergeStep | None:
        """One lockstep step (model work: run it on kvlab's compute thread); None when the run has ended."""
        model = self.loaded.model
        with probe(model) as lossy_probe:
            step = next(self.decoder, None)
        if step is None:
            return None
        with probe(model, attention=self.attention_reason is None) as ref_probe:
            ref_logits = forward(self.loaded, self.reference, self.reference_cache, self.decoder.sequence,
                                 len(step.fed_ids))[0]
        logits = step.trace.logits
        count = len(self.layers)
        hidden, ref_hidden = lossy_probe.hidden_stack(count), ref_probe.hidden_stack(count)
        with torch.inference_mode():
            lens = self.head(self.norm(hidden)).argmax(-1).tolist()
            ref_lens = self.head(self.norm(ref_hidden)).argmax(-1).tolist()
        rows = tuple(self._layer(i, step.seen_tokens, hidden[i], ref_hidden[i], lens[i], ref_lens[i], ref_probe)
                     for i in range(count))
        tokenizer = self.loaded.tokenizer
        record = DivergeStep(
            index=step.index, token_id=step.token_id, token_text=tokenizer.decode([step.token_id]),
            reference_token_id=int(ref_logits.argmax()), seen_tokens=step.seen_tokens,
            cache_length=held_tokens(self.cache.layers[0]) if getattr(self.cache, "layers", None) else 0,
            kl_nats=kl_nats(ref_logits, logits), top=top_candidates(tokenizer, logits),
            reference_top=top_candidates(tokenizer, ref_logits), lens_diverged_from=_diverged_from(lens, ref_lens),
            layers=rows)
        self.records.append(record)
        return record

    def _layer(self, index, seen, hidden, ref_hidden, lens, ref_lens, ref_probe) -> LayerDivergence:
        reasons: dict[str, str] = {}
        lossy_layer = self.cache.layers[index] if getattr(self.cache, "layers", None) else None
        ref_layer = self.reference_cache.layers[index]
        mine, why = held_kv(lossy_layer, seen) if lossy_layer is not None else (None, "the strategy keeps no cache")
        theirs, ref_why = held_kv(ref_layer, seen)
        errors = lost = None
        if mine is None or theirs is None:
            reasons["kv_error"] = reasons["attention_lost"] = why or f"reference: {ref_why}"
        else:
            errors = kv_errors(mine, theirs)
            if errors is None:
                reasons["kv_error"] = "the two caches hold no position in common"
            if self.attention_reason:
                reasons["attention_lost"] = self.attention_reason
            else:
                probs = attention_probs(self.loaded.model, index, ref_probe.attention_input[index], theirs.keys)
                lost = attention_lost(probs, mine, theirs)
        cosine = float(torch.nn.functional.cosine_similarity(hidden, ref_hidden, dim=0))
        return LayerDivergence(
            layer=index, key_error=errors[0] if errors else None, value_error=errors[1] if errors else None,
            kv_error=errors[2] if errors else None, attention_lost=sum(lost) / len(lost) if lost else None,
            attention_lost_by_head=lost, hidden_cosine=cosine, hidden_rel_l2=relative_error(hidden, ref_hidden),
            lens_top1=int(lens), lens_reference_top1=int(ref_lens),
            held_tokens=held_tokens(lossy_layer) if lossy_layer is not None else 0,
            reference_held_tokens=held_tokens(ref_layer), reasons=reasons)



def _diverged_from(lens: list[int], ref_lens: list[int]) -> int | None:
    if lens[-1] == ref_lens[-1]:
        return None
    layer = len(lens) - 1
    while layer > 0 and lens[layer - 1] != ref_lens[layer - 1]:
        layer -= 1
    return layer
