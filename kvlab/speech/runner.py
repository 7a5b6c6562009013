"""Compare for a speech model: one clip transcribed by Whisper under several self-attention caches, streamed as
Compare's events.

Whisper's decoder keeps transformers' `EncoderDecoderCache`: a self-attention cache that grows by one token per
decoded token (the column's strategy builds it: `dynamic`, `static`, `quantized`; `no_cache` keeps none and
feeds the whole transcript each step) beside a cross-attention cache that holds the keys and values of the
encoder's output, filled at the first decoder step and never changed: 2 × decoder layers × 1,500 positions ×
d_model values, whatever the transcript's length. The clip's log-mel features are encoded once per run
(`encode_clip`, on the compute thread, outside every column's clock); each column then decodes greedily from
Whisper's prompt (`<|startoftranscript|><|notimestamps|>`, English-only model) with its tokens suppressed as
the model's generation config says (`suppress_tokens` always, `begin_suppress_tokens` at the first step),
until `<|endoftext|>` or `max_new_tokens`.

Each step's `StepMetrics` splits the bytes by part (`self_attention`, `cross_attention`), each exact (counted
from the tensors, `kvlab.accounting`) and predicted (self: the dense formula for the tokens it holds; cross:
`cross_bytes_predicted`). A finished column's message gives its word error rate against the clip's text
(`kvlab.speech.clips.word_error_rate`), also in `ColumnResult.wer`. Strategies that cannot apply to an
encoder-decoder cache are refused with their reason (`speech_refusal`): the eviction methods and the sink.
Columns run one after another (sequential mode), every step on kvlab's compute thread. No fidelity pass, no
timing policy other than the live run.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..accounting import cache_bytes, predicted_cache_bytes
from ..columns import MAX_COLUMNS, parse_columns
from ..compare.events import ColumnDone, ColumnResult, ColumnStarted, StepMetrics, SummaryReady, TokenEvent
from ..compute import compute
from ..generation import GenerationSettings, IncrementalDetokenizer
from ..protocol import ColumnFailed, RunDone, RunStarted
from .clips import Clip, read_samples, word_errors

SPEECH_STRATEGIES = ("no_cache", "dynamic", "static", "quantized")
"""The strategies a speech column runs: what builds a self-attention cache from the decoder's config."""
DEFAULT_SPEECH_COLUMNS = ["dynamic", "static", "quantized:backend=quanto:nbits=4:residual_length=4"]
"""A speech run's columns when none are given: a short transcript never fills quanto's default 128-token
residual, so the quantized column keeps only 4 tokens in full precision."""
SELF, CROSS = "self_attention", "cross_attention"
EVICTION_REASON = ("not for an encoder-decoder cache: eviction scores and prunes a prompt's keys/values at "
                   "prefill, and Whisper's decoder prompt is 2 special tokens; its context is the cross-attention "
                   "cache of the encoder's 1,500 positions, which these methods do not prune")
SINK_REASON = ("not for an encoder-decoder cache: a sink cache re-positions the tokens it keeps inside a rolling "
               "window, but Whisper's decoder adds learned absolute position embeddings (448 positions) before "
               "the cache, and the cross-attention cache it would leave untouched is most of the bytes")
PROMPT_TOKENS = ("<|startoftranscript|>", "<|notimestamps|>")


@dataclass
class DecoderView:
    """What a strategy's `build_cache` / `unavailable_reason` reads of a loaded model (`config`, `model`,
    `device`), for the decoder's self-attention: `config` counts the decoder's layers."""

    config: object
    model: object
    device: torch.device


def decoder_view(loaded) -> DecoderView:
    """The decoder's view of a loaded Whisper (`num_hidden_layers` = its decoder layers; Whisper's decoder has
    as many heads as its encoder, which `num_attention_heads` names)."""
    config = copy.deepcopy(loaded.model.config)
    config.num_hidden_layers = config.decoder_layers
    return DecoderView(config, loaded.model, loaded.device)


def cross_bytes_predicted(config, dtype: torch.dtype) -> int:
    """The cross-attention cache's bytes: 2 (keys, values) × decoder layers × encoder positions × d_model ×
    bytes per value."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.decoder_layers * config.max_source_positions * config.d_model * element


def speech_refusal(strategy, view: DecoderView) -> str | None:
    """Why `strategy` cannot run as a speech column (one line), or None."""
    if strategy.is_evicting:
        return EVICTION_REASON
    if strategy.is_streaming:
        return SINK_REASON
    if strategy.name not in SPEECH_STRATEGIES:
        return (f"not offered for an encoder-decoder model: a speech column runs one of "
                f"{', '.join(SPEECH_STRATEGIES)} as its self-attention cache")
    return strategy.unavailable_reason(view)


def encode_clip(loaded, clip: Clip) -> torch.Tensor:
    """The encoder's output for a clip, (1, max_source_positions, d_model), on the compute thread."""
    features = loaded.features(read_samples(clip.path), sampling_rate=loaded.features.sampling_rate,
                               return_tensors="pt").input_features

    def encode():
        with torch.inference_mode():
            return loaded.model.model.encoder(features.to(loaded.device, loaded.model.dtype)).last_hidden_state
    return compute(encode)


class SpeechDecoder:
    """One column's greedy decode of an encoded clip through an `EncoderDecoderCache` (None for `no_cache`).

    `steps()` yields (token id, seconds of the step's forward and choice, self-attention bytes, cross-attention
    bytes, decoder ids fed so far) until `<|endoftext|>`, `max_new_tokens` or `stop`."""

    def __init__(self, loaded, strategy, hidden: torch.Tensor, max_new_tokens: int, stop: threading.Event):
        from transformers import DynamicCache, EncoderDecoderCache

        self.loaded, self.strategy, self.hidden, self.stop = loaded, strategy, hidden, stop
        generation = loaded.model.generation_config
        self.eos = generation.eos_token_id
        self.suppress = torch.tensor(list(generation.suppress_tokens or []), dtype=torch.long)
        self.begin = torch.tensor(list(generation.begin_suppress_tokens or []), dtype=torch.long)
        self.ids = torch.tensor([loaded.tokenizer.convert_tokens_to_ids(list(PROMPT_TOKENS))], device=loaded.device)
        self.max_new_tokens = max_new_tokens
        self.max_total = self.ids.shape[1] + max_new_tokens
        self.cache = None
        if strategy.use_cache:
            self_cache = strategy.build_cache(decoder_view(loaded), self.max_total)
            self.cache = EncoderDecoderCache(self_cache, DynamicCache())

    def _step(self, new_tokens: int) -> tuple[int, float]:
        started = time.perf_counter()
        with torch.inference_mode():
            fed = self.ids[:, -new_tokens:] if self.cache is not None else self.ids
            out = self.loaded.model(encoder_outputs=(self.hidden,), decoder_input_ids=fed, cache=self.cache,
                                    use_cache=self.cache is not None)
            logits = out.logits[0, -1].float()
            logits[self.suppress] = -torch.inf
            if new_tokens > 1:
                logits[self.begin] = -torch.inf
            token = int(torch.argmax(logits))
        self.ids = torch.cat([self.ids, torch.tensor([[token]], device=self.ids.device)], dim=1)
        return token, time.perf_counter() - started

    def parts(self) -> tuple[int, int]:
        """(self-attention bytes, cross-attention bytes) the cache holds now, counted from its tensors."""
        if self.cache is None:
            return 0, 0
        return cache_bytes(self.cache.self_attention_cache), cache_bytes(self.cache.cross_attention_cache)

    def steps(self) -> Iterator[tuple[int, float, int, int, int]]:
        new_tokens = self.ids.shape[1]
        for _ in range(self.max_new_tokens):
            if self.stop.is_set():
                return
            token, elapsed = compute(self._step, new_tokens)
            new_tokens = 1
            yield (token, elapsed, *self.parts(), self.ids.shape[1] - 1)
            if token == self.eos:
                return


def _new_result(index: int, column, prompt_tokens: int) -> ColumnResult:
    strategy = column.strategy
    return ColumnResult(index, column.describe(), strategy.name, strategy.knobs(), lossy=strategy.lossy,
                        caveat=strategy.caveat(), prompt_tokens=prompt_tokens, use_cache=strategy.use_cache)


def _predicted(view: DecoderView, strategy, seen: int, max_total: int) -> dict[str, int]:
    if not strategy.use_cache:
        return {SELF: 0, CROSS: 0}
    held = strategy.held_tokens(seen, max_total)
    return {SELF: predicted_cache_bytes(view.config, view.model.dtype, held),
            CROSS: cross_bytes_predicted(view.config, view.model.dtype)}


def _finish(result: ColumnResult, clip: Clip, stopped: bool) -> None:
    errors, total = word_errors(clip.text, result.text)
    result.wer = errors / total
    result.status, result.stopped = "ok", stopped
    result.message = "; ".join(filter(None, [
        f"WER {100 * result.wer:.1f} % against the clip's text ({errors} of {total} words wrong)",
        f"stopped after {len(result.token_ids)} tokens" if stopped else "", result.message]))
    result.finish_decode_stats()


def run_column(loaded, index: int, column, clip: Clip, hidden, settings, stop) -> Iterator:
    """One speech column's events (`ColumnStarted`, then `TokenEvent` + `StepMetrics` per token, then
    `ColumnDone` or `ColumnFailed`); returns its `ColumnResult`."""
    view, strategy = decoder_view(loaded), column.strategy
    result = _new_result(index, column, len(PROMPT_TOKENS))
    yield ColumnStarted(index, result.name, result.prompt_tokens)
    reason = speech_refusal(strategy, view)
    if reason:
        result.status, result.message = "unavailable", reason
        yield ColumnFailed(index, result.name, "unavailable", reason, result)
        return result
    try:
        decoder = SpeechDecoder(loaded, strategy, hidden, settings.max_new_tokens, stop)
        detok = IncrementalDetokenizer(loaded.tokenizer)
        for step, (token, elapsed, self_bytes, cross_bytes, seen) in enumerate(decoder.steps()):
            measured, predicted = {SELF: self_bytes, CROSS: cross_bytes}, _predicted(view, strategy, seen,
                                                                                     decoder.max_total)
            result.token_ids.append(token)
            result.per_token_s.append(elapsed)
            result.ttft_s = result.ttft_s if step else elapsed
            result.cache_bytes.append(self_bytes + cross_bytes)
            result.predicted_cache_bytes.append(sum(predicted.values()))
            for kind in (SELF, CROSS):
                result.cache_bytes_by_layer_type.setdefault(kind, []).append(measured[kind])
                result.predicted_cache_bytes_by_layer_type.setdefault(kind, []).append(predicted[kind])
            text = detok.push(token)
            result.text = detok.text.strip()
            yield TokenEvent(index, step, token, text)
            yield StepMetrics(index, step, elapsed, self_bytes + cross_bytes, sum(predicted.values()), seen,
                              measured, predicted)
    except Exception as err:  # noqa: BLE001 - any failure ends this column only
        result.status, result.message = "error", str(err) if isinstance(err, ValueError) else \
            f"{type(err).__name__}: {err}"
        result.finish_decode_stats()
        yield ColumnFailed(index, result.name, "error", result.message, result)
        return result
    _finish(result, clip, stop.is_set())
    yield ColumnDone(index, result)
    return result


def run_speech(loaded, clip: Clip, columns: list | None = None, settings: GenerationSettings | None = None,
               stop: threading.Event | None = None) -> Iterator:
    """Transcribe `clip` under every column and yield Compare's events: `RunStarted` first, `SummaryReady`, then
    `RunDone` with the record (`speech_record`) and every column's `ColumnResult`.

    Args:
        loaded: a `kvlab.models.LoadedModel` of a speech model (`loaded.is_speech`).
        clip: a `kvlab.speech.clips.Clip`.
        columns: `Column`s, strategies or spec dicts (default `DEFAULT_SPEECH_COLUMNS`).
        settings: `max_new_tokens` is read (decoding is greedy: Whisper's own way).
        stop: set it to end the run within a token.

    Raises:
        ValueError: `loaded` is not a speech model, or no columns / too many (before anything runs).
        StrategyError: a column names an unknown strategy or knob.
    """
    if not getattr(loaded, "is_speech", False):
        raise ValueError(f"{loaded.name} is not a speech model: give a prompt to Compare instead of a clip")
    columns = parse_columns(columns or DEFAULT_SPEECH_COLUMNS, MAX_COLUMNS, empty="no strategy picked: add at "
                            "least one column", strict=True)
    settings, stop = settings or GenerationSettings(), stop or threading.Event()
    yield RunStarted(tuple(column.describe() for column in columns))
    started = time.perf_counter()
    hidden = encode_clip(loaded, clip)
    results = []
    for index, column in enumerate(columns):
        results.append((yield from run_column(loaded, index, column, clip, hidden, settings, stop)))
    wall_s = time.perf_counter() - started
    yield SummaryReady(list(results), wall_s)
    yield RunDone(speech_record(loaded, clip, settings, results, wall_s, stop.is_set()), wall_s, stop.is_set(),
                  list(results))


def speech_record(loaded, clip: Clip, settings, results: list[ColumnResult], wall_s: float, stopped: bool) -> dict:
    """The run's record: Compare's envelope (`kvlab.record.new_record`, kind `kvlab.compare`) with the clip
    (name, text, seconds) in place of a prompt and every column's result (`wer` filled)."""
    from dataclasses import asdict

    from ..compare.record import COMPARE
    from ..measure.environment import environment
    from ..record import new_record

    return new_record(COMPARE, model=loaded.info(), environment=environment(loaded),
                      columns=[r.to_json() for r in results], wall_s=wall_s, stopped=stopped, preset=None,
                      prompt=None, clip={"name": clip.name, "text": clip.text, "seconds": clip.seconds},
                      mode="sequential", settings=asdict(settings), summary_s=wall_s,
                      fidelity={"state": "off", "scored": 0, "to_score": 0}, timing={})
