"""Compare for a recurrent model: one prompt through a Mamba-2's own recurrent-state cache, beside a KV cache
growing, streamed as Compare's events.

A Mamba-2 keeps, per layer, a convolution state (the last `conv_kernel` inputs) and an SSM state (heads ×
head_dim × state_size) in transformers' `DynamicCache` of `LinearAttentionLayer`s: both of fixed size, so the
`dynamic` column's bytes are the same after every token. The run's last column, `REFERENCE_TITLE`, is the KV
side: `kvlab.recurrent.state.attention_reference`, a Llama as wide and deep, whose `DynamicCache` grows by
1,024 bytes per token, so the two lines cross on the cache-bytes plot (the state of the tiny Mamba-2 equals
21 tokens of that KV cache). Both models have seeded random weights: every column's message says STRUCTURE_ONLY.

Columns: `dynamic` (the model's own cache) and `no_cache` (no cache, the whole sequence each step) run;
strategies that cannot apply to a recurrent state are refused with their reason (`recurrent_refusal`): the
eviction methods, the sink, the quantized KV formats, and the other cache layouts. Each step's `StepMetrics`
splits the bytes by part (`conv_state`, `ssm_state`, or `full_attention` for the reference), each exact
(counted from the tensors) and predicted (`predicted_state_bytes`; the dense formula for the reference).
Greedy decoding over printable ASCII only (`unprintable_ids`), every step on kvlab's compute thread, columns one after another; no fidelity pass, no timing
policy other than the live run.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator

import torch

from ..accounting import cache_bytes, predicted_cache_bytes
from ..columns import MAX_COLUMNS, parse_columns
from ..compare.events import ColumnDone, ColumnResult, ColumnStarted, StepMetrics, SummaryReady, TokenEvent
from ..compute import compute
from ..generation import GenerationSettings, IncrementalDetokenizer
from ..protocol import ColumnFailed, RunDone, RunStarted
from .state import STRUCTURE_ONLY, attention_reference, predicted_state_bytes, state_parts

RECURRENT_STRATEGIES = ("no_cache", "dynamic")
"""What a recurrent column runs: the model's own state cache, or none."""
REFERENCE_TITLE = "dynamic · KV reference (a Llama as wide and deep)"
REFERENCE_PART = "full_attention"
EVICTION_REASON = ("not for a recurrent state: eviction scores and drops tokens' keys/values, and a Mamba-2 layer "
                   "keeps no per-token entries, only a fixed-size state that every past token is folded into")
SINK_REASON = ("not for a recurrent state: a sink cache keeps the first and the latest tokens' keys/values, and a "
               "Mamba-2 layer has neither, only a fixed-size state of the whole past")
QUANTIZED_REASON = ("not for a recurrent state: the quantized KV formats quantize keys/values per token, and "
                    "transformers' quantized caches build only attention layers; a Mamba-2's state is already a "
                    "fixed size (its SSM part kept in float32)")
QUANTIZED_NAMES = ("quantized", "llamacpp_quantized", "rotation_quantized", "vllm_kv_cache")


def recurrent_refusal(strategy) -> str | None:
    """Why `strategy` cannot run as a recurrent column (one line), or None."""
    if strategy.is_evicting:
        return EVICTION_REASON
    if strategy.is_streaming:
        return SINK_REASON
    if strategy.name in QUANTIZED_NAMES:
        return QUANTIZED_REASON
    if strategy.name not in RECURRENT_STRATEGIES:
        return (f"not offered for a recurrent model: a recurrent column runs {' or '.join(RECURRENT_STRATEGIES)} "
                f"(the state is already of fixed size, whatever the layout)")
    return None


@functools.lru_cache(maxsize=2)
def reference_model(vocab_size: int):
    """The seeded attention reference for a vocabulary (built once per process: under a second)."""
    return attention_reference(vocab_size=vocab_size)


@functools.lru_cache(maxsize=4)
def unprintable_ids(tokenizer) -> torch.Tensor:
    """The token ids that do not decode to one printable ASCII character or a newline (control bytes, bytes of
    multi-byte characters, special and extra ids): a random model's greedy choice skips them, so its text never
    carries a terminal's escape sequences."""
    def printable(text: str) -> bool:
        return len(text) == 1 and (text == "\n" or (text.isascii() and text.isprintable()))
    return torch.tensor([i for i in range(len(tokenizer)) if not printable(tokenizer.decode([i]))], dtype=torch.long)


def column_titles(columns: list, reference: bool = True) -> list[str]:
    """The run's column titles: the given columns', then the KV reference's (when `reference`)."""
    return [*(column.describe() for column in columns), *([REFERENCE_TITLE] if reference else [])]


class RecurrentDecoder:
    """One column's greedy decode of a prompt: with a cache (`model(ids, cache=...)`, one new token per step after
    the prefill) or without (`cache` None: the whole sequence each step).

    `steps()` yields (token id, seconds of the step's forward and choice, the cache) until `max_new_tokens` or
    `stop`."""

    def __init__(self, model, cache, prompt_ids: torch.Tensor, max_new_tokens: int, stop: threading.Event,
                 suppress: torch.Tensor | None = None):
        self.model, self.cache, self.stop = model, cache, stop
        self.ids, self.max_new_tokens, self.suppress = prompt_ids, max_new_tokens, suppress

    def _step(self, new_tokens: int) -> tuple[int, float]:
        started = time.perf_counter()
        with torch.inference_mode():
            fed = self.ids[:, -new_tokens:] if self.cache is not None else self.ids
            out = self.model(input_ids=fed, cache=self.cache, use_cache=self.cache is not None, logits_to_keep=1)
            logits = out.logits[0, -1].float()
            if self.suppress is not None:
                logits[self.suppress] = -torch.inf
            token = int(torch.argmax(logits))
        self.ids = torch.cat([self.ids, torch.tensor([[token]], device=self.ids.device)], dim=1)
        return token, time.perf_counter() - started

    def steps(self) -> Iterator[tuple[int, float]]:
        new_tokens = self.ids.shape[1]
        for _ in range(self.max_new_tokens):
            if self.stop.is_set():
                return
            token, elapsed = compute(self._step, new_tokens)
            new_tokens = 1
            yield token, elapsed


def _parts(model, cache, seen: int) -> tuple[dict[str, int], dict[str, int]]:
    """(measured, predicted) bytes by part for a cache holding `seen` tokens (empty dicts without a cache)."""
    if cache is None:
        return {}, {}
    if getattr(model.config, "model_type", "") == "mamba2":
        return state_parts(cache), predicted_state_bytes(model.config, model.dtype)
    return ({REFERENCE_PART: cache_bytes(cache)},
            {REFERENCE_PART: predicted_cache_bytes(model.config, model.dtype, seen)})


def _record_step(result: ColumnResult, token: int, elapsed: float, measured: dict, predicted: dict) -> None:
    result.token_ids.append(token)
    result.per_token_s.append(elapsed)
    result.ttft_s = result.ttft_s if len(result.token_ids) > 1 else elapsed
    result.cache_bytes.append(sum(measured.values()))
    result.predicted_cache_bytes.append(sum(predicted.values()))
    for kind in measured:
        result.cache_bytes_by_layer_type.setdefault(kind, []).append(measured[kind])
        result.predicted_cache_bytes_by_layer_type.setdefault(kind, []).append(predicted[kind])


def decode_column(model, tokenizer, index: int, result: ColumnResult, cache, prompt_ids, settings, stop
                  ) -> Iterator:
    """Stream one column's decode into `result` and events (`TokenEvent`, `StepMetrics` per token); a failure
    ends this column only (`ColumnFailed`), else `ColumnDone`. Returns `result`."""
    try:
        decoder = RecurrentDecoder(model, cache, prompt_ids, settings.max_new_tokens, stop,
                                   unprintable_ids(tokenizer).to(prompt_ids.device))
        detok = IncrementalDetokenizer(tokenizer)
        for step, (token, elapsed) in enumerate(decoder.steps()):
            seen = decoder.ids.shape[1] - 1
            measured, predicted = _parts(model, cache, seen)
            _record_step(result, token, elapsed, measured, predicted)
            text = detok.push(token)
            result.text = detok.text
            yield TokenEvent(index, step, token, text)
            yield StepMetrics(index, step, elapsed, sum(measured.values()), sum(predicted.values()), seen,
                              measured, predicted)
    except Exception as err:  # noqa: BLE001 - any failure ends this column only
        result.status, result.message = "error", f"{type(err).__name__}: {err}"
        result.finish_decode_stats()
        yield ColumnFailed(index, result.name, "error", result.message, result)
        return result
    result.status, result.stopped = "ok", stop.is_set()
    constant = _constancy(result) if getattr(model.config, "model_type", "") == "mamba2" else ""
    result.message = "; ".join(filter(None, [STRUCTURE_ONLY, constant, f"stopped after {len(result.token_ids)} "
                                             "tokens" if result.stopped else ""]))
    result.finish_decode_stats()
    yield ColumnDone(index, result)
    return result


def _constancy(result: ColumnResult) -> str:
    """What the measured state bytes did over the run, in words ('' without a cache)."""
    sizes = sorted(set(result.cache_bytes))
    if not result.use_cache or not sizes:
        return ""
    if len(sizes) == 1:
        return f"state {sizes[0]:,} bytes at every one of {len(result.cache_bytes)} steps"
    return f"state bytes changed during the run: {sizes[0]:,} to {sizes[-1]:,}"


def _new_result(index: int, name: str, strategy, prompt_tokens: int) -> ColumnResult:
    return ColumnResult(index, name, strategy.name, strategy.knobs(), lossy=False,
                        prompt_tokens=prompt_tokens, use_cache=strategy.use_cache)


def run_column(loaded, index: int, column, prompt_ids, settings, stop) -> Iterator:
    """One recurrent column's events (`ColumnStarted`, then its steps, then `ColumnDone` or `ColumnFailed`);
    returns its `ColumnResult`."""
    from transformers import DynamicCache

    strategy = column.strategy
    result = _new_result(index, column.describe(), strategy, prompt_ids.shape[1])
    yield ColumnStarted(index, result.name, result.prompt_tokens)
    reason = recurrent_refusal(strategy)
    if reason:
        result.status, result.message = "unavailable", reason
        yield ColumnFailed(index, result.name, "unavailable", reason, result)
        return result
    cache = DynamicCache(config=loaded.model.config) if strategy.use_cache else None
    return (yield from decode_column(loaded.model, loaded.tokenizer, index, result, cache, prompt_ids, settings,
                                     stop))


def run_reference(loaded, index: int, prompt_ids, settings, stop) -> Iterator:
    """The KV reference column: the attention reference's `DynamicCache` over the same prompt and length."""
    from transformers import DynamicCache

    from ..strategies.dynamic import Dynamic

    model = reference_model(loaded.model.config.vocab_size)
    result = _new_result(index, REFERENCE_TITLE, Dynamic(), prompt_ids.shape[1])
    yield ColumnStarted(index, result.name, result.prompt_tokens)
    return (yield from decode_column(model, loaded.tokenizer, index, result, DynamicCache(), prompt_ids.cpu(),
                                     settings, stop))


def run_recurrent(loaded, prompt_ids: torch.Tensor, columns: list | None = None,
                  settings: GenerationSettings | None = None, stop: threading.Event | None = None,
                  reference: bool = True) -> Iterator:
    """Run every column, then the KV reference, and yield Compare's events: `RunStarted` first (its titles are
    `column_titles`), `SummaryReady`, then `RunDone` with the record (`recurrent_record`).

    Args:
        loaded: a `kvlab.models.LoadedModel` of a recurrent model (`loaded.is_recurrent`).
        prompt_ids: (1, prompt_tokens) token ids.
        columns: `Column`s, strategies or spec dicts (default: `dynamic`, `no_cache`), at most MAX_COLUMNS - 1
            with the reference (it takes one), MAX_COLUMNS without.
        settings: `max_new_tokens` is read (decoding is greedy).
        stop: set it to end the run within a token.
        reference: run the KV reference column after the others.

    Raises:
        ValueError: `loaded` is not a recurrent model, or no columns / too many (before anything runs).
        StrategyError: a column names an unknown strategy or knob.
    """
    if not getattr(loaded, "is_recurrent", False):
        raise ValueError(f"{loaded.name} is not a recurrent model: run it through Compare's text runner")
    columns = parse_columns(columns or list(RECURRENT_STRATEGIES[::-1]), MAX_COLUMNS - reference,
                            empty="no strategy picked: add at least one column", strict=True)
    settings, stop = settings or GenerationSettings(), stop or threading.Event()
    yield RunStarted(tuple(column_titles(columns, reference)))
    started, results = time.perf_counter(), []
    for index, column in enumerate(columns):
        results.append((yield from run_column(loaded, index, column, prompt_ids, settings, stop)))
    if reference:
        results.append((yield from run_reference(loaded, len(columns), prompt_ids, settings, stop)))
    wall_s = time.perf_counter() - started
    yield SummaryReady(list(results), wall_s)
    yield RunDone(recurrent_record(loaded, prompt_ids, settings, results, wall_s, stop.is_set()), wall_s,
                  stop.is_set(), list(results))


def recurrent_record(loaded, prompt_ids, settings, results: list[ColumnResult], wall_s: float, stopped: bool
                     ) -> dict:
    """The run's record: Compare's envelope (`kvlab.record.new_record`, kind `kvlab.compare`) with the prompt's
    token count, the STRUCTURE_ONLY label and every column's result."""
    from dataclasses import asdict

    from ..compare.record import COMPARE
    from ..measure.environment import environment
    from ..record import new_record

    return new_record(COMPARE, model=loaded.info(), environment=environment(loaded),
                      columns=[r.to_json() for r in results], wall_s=wall_s, stopped=stopped, preset=None,
                      prompt={"tokens": int(prompt_ids.shape[1]), "label": STRUCTURE_ONLY}, mode="sequential",
                      settings=asdict(settings), summary_s=wall_s,
                      fidelity={"state": "off", "scored": 0, "to_score": 0}, timing={})


def run_recurrent_preset(loaded, preset, stop: threading.Event | None = None, columns: list | None = None
                         ) -> Iterator:
    """`kvlab.compare.runner.run_preset` for a recurrent model: `preset`'s prompt encoded now, its settings, over
    `columns` (default: the preset's own), then the KV reference; the events of `run_recurrent`.

    Raises:
        ValueError: the prompt cannot be encoded (at once); as `run_recurrent` once the events are read.
    """
    from ..generation import encode_prompt

    prompt_ids = encode_prompt(loaded.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    return run_recurrent(loaded, prompt_ids, preset.build_columns() if columns is None else columns,
                         preset.settings(), stop)
