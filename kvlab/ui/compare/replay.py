"""A recorded Compare run shown again: a `kvlab.compare.replay.Replayed` record -> the page's view model and code.

- `view_from_record`: the `RunView` the run ended with (columns' text, status, series and fallback switches,
  process memory when the page recorded it, each column in its page slot), so the plots, the summary table
  and the cards come back exactly as measured, with the first-divergence links into Inspect (or why none).
- `replay_code`: the reproduce-it snippet of every column, from the record's strategies and settings.
- `form_values`: the form the run was made with (prompt, settings, mode, baseline, model), by `RunRequest`
  field name, so a share link or an uploaded record shows its own experiment, not the page's defaults.

Reads only; runs no model; no gradio.
"""

from __future__ import annotations

from kvlab.compare.events import ColumnResult
from kvlab.compare.replay import Replayed
from kvlab.generation import GenerationSettings
from kvlab.strategies import StrategyError, make_strategy

from ..shared.code import code_snippet
from ..shared.inspect_links import record_divergence_links
from .view import ColumnView, RunView

STATUS = {"unavailable": "unavailable", "error": "error"}
"""A result's status -> the card's status (an `ok` column is `done`, or `stopped` when it was stopped)."""


def _column_view(column: ColumnView, result: ColumnResult) -> None:
    """Fill `column` from its recorded result."""
    column.title, column.text, column.message, column.result = result.name, result.text, result.message, result
    column.status = STATUS.get(result.status) or ("stopped" if result.stopped else
                                                  ("warning" if result.warning else "done"))
    column.prompt_tokens, column.keeps, column.switches = result.prompt_tokens, result.keeps, list(result.fallbacks)
    column.per_token_s = list(result.per_token_s)
    column.cache_bytes = list(result.cache_bytes)
    column.predicted_cache_bytes = list(result.predicted_cache_bytes)
    column.cache_bytes_by_layer_type = {k: list(v) for k, v in result.cache_bytes_by_layer_type.items()}
    column.predicted_cache_bytes_by_layer_type = {k: list(v)
                                                  for k, v in result.predicted_cache_bytes_by_layer_type.items()}


def record_slots(record: dict, count: int) -> list[int]:
    """The page slot (colour) of each of `count` run columns: the record's `slots` when it has valid ones
    (a page export), else 0..count-1 (a CLI record)."""
    slots = record.get("slots")
    if isinstance(slots, list) and len(slots) == count and all(isinstance(s, int) and 0 <= s < 8 for s in slots):
        return slots
    return list(range(count))


def view_from_record(replayed: Replayed) -> RunView:
    """The finished run's view model rebuilt from its record (see the module docstring)."""
    results = replayed.done.results
    view = RunView([r.name for r in results], record_slots(replayed.record, len(results)))
    for column, result in zip(view.columns, results):
        _column_view(column, result)
    memory = replayed.record.get("memory") or {}
    for key in ("elapsed_s", "rss_bytes", "cuda_allocated_bytes"):
        values = memory.get(key)
        if isinstance(values, list):
            setattr(view.memory, key, list(values))
    view.done = replayed.done
    view.divergence_links, view.divergence_reasons = record_divergence_links(replayed.record, results)
    return view


def replay_code(record: dict) -> str:
    """One reproduce-it snippet per recorded column (as the page's "View code" shows after a run); a column
    whose strategy this kvlab cannot build says so instead."""
    prompt = record.get("prompt") or {}
    model = record.get("model") or {}
    try:
        settings = GenerationSettings(**(record.get("settings") or {}))
    except TypeError:
        settings = GenerationSettings()
    blocks = []
    for slot, column in zip(record_slots(record, len(record["columns"])), record["columns"]):
        header = f"# ── column {slot + 1}: {column.get('name')} " + "─" * 20
        if column.get("status") in ("unavailable", "error"):
            header += f"\n# ({column['status']} where it was measured: {column.get('message', '')})"
        if column.get("budget_bytes"):
            header += ("\n# (this column had a cache budget: the code below is its first cache; its fallbacks "
                       "are in the record)")
        try:
            strategy = make_strategy({"strategy": column.get("strategy"), **(column.get("knobs") or {})})
        except StrategyError as err:
            blocks.append(f"{header}\n# this kvlab cannot build the strategy: {err}")
            continue
        blocks.append(header + "\n" + code_snippet(strategy, settings, prompt.get("text", ""),
                                                   prompt.get("system") or "", bool(prompt.get("chat", True)),
                                                   model.get("source", "bundled"), model.get("dtype", "float32")))
    return "\n\n".join(blocks)


def form_values(record: dict) -> dict:
    """`RunRequest` field name -> the value the recorded run was made with, for the fields the record holds
    (a record from the CLI or an older kvlab may lack some; those are left out, not guessed)."""
    prompt, settings, model = record.get("prompt") or {}, record.get("settings") or {}, record.get("model") or {}
    values = {"prompt": prompt.get("text"), "system": prompt.get("system"), "chat": prompt.get("chat"),
              "mode": record.get("mode"), "preset": record.get("preset"),
              "model_source": model.get("source"), "dtype": model.get("dtype"), "device": model.get("device")}
    for name in ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "fidelity",
                 "timing_policy"):
        values[name] = settings.get(name)
    if "do_sample" in settings:
        values["decoding"] = "sample" if settings["do_sample"] else "greedy"
    if "stop_at_eos" in settings:
        values["ignore_eos"] = not settings["stop_at_eos"]
    columns = record.get("columns") or []
    slots = record_slots(record, len(columns))
    chosen = [i for i, column in enumerate(columns) if column.get("is_baseline")]
    first_dynamic = next((i for i, column in enumerate(columns) if column.get("strategy") == "dynamic"), None)
    if chosen:
        values["baseline"] = "auto" if chosen[0] == first_dynamic else f"column {slots[chosen[0]] + 1}"
    return {name: value for name, value in values.items() if value is not None}
