"""An engine column's run in Compare: the engine's steps (`kvlab.engines.EngineRun`) streamed into the column as
the runner streams kvlab's own decoder (`TokenEvent`, `StepMetrics`, the `ColumnResult` series).

The runner calls `decode_engine` for a column whose strategy is an engine column (`Strategy.engine_name`). An
engine computing in this process (llama.cpp) takes its steps in turns with the other columns on kvlab's compute
thread, so its step times are its own compute as theirs are; a server's stream is read in the column's own
thread. The engine's figures (its settings, the server's `/metrics`) go to `ColumnResult.engine`, its notes to
the column's message. This module runs nothing itself and renders nothing.
"""

from __future__ import annotations

import functools

import torch

from ..accounting import predicted_cache_bytes_by_layer_type
from ..engine import RunStopped
from ..generation import IncrementalDetokenizer
from .events import StepMetrics, TokenEvent


def decode_engine(loaded, index: int, column, prompt_ids: torch.Tensor, settings, emit, turns, stop,
                  result) -> None:
    """Open the column's engine (on the compute thread when it is local), stream its steps into `result` and
    events, and close it.

    Raises:
        StrategyError: a cache budget on the column.
        kvlab.engines.EngineError (or the model loader's error): the engine could not start or failed (one line).
        RunStopped: `stop` was set before the engine finished.
    """
    from ..strategies import StrategyError

    strategy = column.strategy
    if column.budget is not None:
        raise StrategyError(f"{strategy.name} takes no cache budget: the engine manages its own cache")
    ids = prompt_ids[0].tolist()
    threads = turns.run(torch.get_num_threads)
    opened = functools.partial(strategy.open_run, loaded, ids, settings, stop, threads)
    run = turns.run(opened) if strategy.is_local else opened()
    try:
        _stream(loaded, index, run, turns.iterate(run) if run.is_local else run, emit, result, len(ids))
    finally:
        if run.is_local:
            turns.run(run.close)
        else:
            run.close()
    result.engine = dict(run.figures)
    result.message = "; ".join(filter(None, [result.message, *run.notes]))
    if run.token_ids != result.token_ids:
        result.token_ids = list(run.token_ids)
    if run.stop_reason == "stopped":
        raise RunStopped


def _stream(loaded, index: int, run, steps, emit, result, prompt_tokens: int) -> None:
    """Each step into the result's series and a `TokenEvent` + `StepMetrics` pair."""
    detok = IncrementalDetokenizer(loaded.tokenizer)
    for step in steps:
        if step.index == 0:
            result.ttft_s = step.per_token_s
        if step.token_id >= 0:
            result.token_ids.append(step.token_id)
            text = detok.push(step.token_id)
            result.text = detok.text
        else:
            text = run.texts[step.index]
            result.text += text
        result.per_token_s.append(step.per_token_s)
        predicted = _predicted(loaded, step.seen_tokens) if step.cache_bytes is not None else {}
        if step.cache_bytes is not None:
            result.cache_bytes.append(step.cache_bytes)
            result.predicted_cache_bytes.append(sum(predicted.values()))
        emit(TokenEvent(index, step.index, step.token_id, text))
        emit(StepMetrics(index, step.index, step.per_token_s, step.cache_bytes, sum(predicted.values()),
                         step.seen_tokens or prompt_tokens + step.index, {}, predicted))


def _predicted(loaded, seen_tokens: int) -> dict[str, int]:
    """kvlab's dense prediction for the tokens an engine's cache holds, per layer type (every layer all of them:
    the engine's own window, if any, is its business)."""
    from ..accounting import layer_windows

    held = [seen_tokens] * len(layer_windows(loaded.config))
    return predicted_cache_bytes_by_layer_type(loaded.config, loaded.model.dtype, held)
