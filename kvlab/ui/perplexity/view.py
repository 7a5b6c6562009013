"""The Perplexity tab's pure part: the form -> a validated plan, the run's scored tokens -> a view model.

- `perplexity_choices()` lists the caches offered: the StreamingLLM paper's
  three (`dynamic`, `window` = a sink cache with 0 sinks, `sink`) first,
  `dynamic all-full` (every token on every layer), then every other registered
  strategy whose `usable_in_perplexity` is true. `default_choices(source)`: a
  hybrid bundled model starts with `dynamic all-full` vs `sliding_window`, whose
  window comes from the model's config and is marked on the plots. More
  columns with their own knobs can be typed in the compare syntax
  (`quantized:backend=hqq:nbits=2`).
- `plan_perplexity(request, loaded)` checks the form, tokenizes the text (the
  shipped one, `kvlab.quality.defaults.shipped_text`, unless one is pasted) and
  leaves out, with the reason, every cache that cannot run on the model (e.g.
  `sliding_window` on a full-attention model); nothing crashes.
- `PerplexityView.apply(event)` folds in one event of the run
  (`kvlab.quality.perplexity.run_perplexity`: each `TokenScored`); the view gives the status line, the native
  plots' data (`kvlab.ui.shared.plot_frames`) and the per-segment table.

No gradio; tests feed it fake steps.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pandas as pd

from kvlab.accounting import layer_windows
from kvlab.columns import Column
from kvlab.models.bundled import bundled_model
from kvlab.models.gguf_cache import ModelLoadError
from kvlab.quality.defaults import CHARS_PER_TOKEN, pasted_text_refusal, shipped_text
from kvlab.quality.perplexity import DEFAULT_SINKS, DEFAULT_WINDOW, perplexity_columns, ppl_by_segment, refusals
from kvlab.quality.report import TokenScored
from kvlab.strategies import StrategyError
from kvlab.strategies.base import names_with

from ..shared.plot_frames import perplexity_colors, perplexity_frames

MAX_TOKENS_CAP = int(os.environ.get("KVLAB_MAX_PERPLEXITY_TOKENS", "8192"))
DEFAULT_TOKENS = 1024
CAPABILITY = "usable_in_perplexity"
PAPER_CHOICES = {"dynamic": "dynamic", "window": "sink:num_sink_tokens=0", "sink": "sink"}
"""The paper's three curves: checkbox label -> strategy spec (compare syntax); window and sink take the
window/sinks settings."""
DEFAULT_CHOICES = list(PAPER_CHOICES)
ALL_FULL = "dynamic all-full"
"""The choice that keeps every token on every layer (`dynamic:layer_types=full`): on a hybrid model the full
reference beside its own sliding window; on a full-attention model the same cache as `dynamic`."""
HYBRID_CHOICES = [ALL_FULL, "sliding_window"]
"""What a hybrid model (sliding layers) starts with: everything kept vs the model's own window."""
BUILT_IN = "Python's help topics (pydoc_data.topics)"
PASTED = "the text pasted below"


def perplexity_choices() -> list[str]:
    """Checkbox labels: the paper's three, `dynamic all-full`, then every other registered strategy usable in
    perplexity."""
    names = names_with(CAPABILITY)
    paper = [label for label, spec in PAPER_CHOICES.items() if spec.split(":")[0] in names]
    return paper + [ALL_FULL] + [name for name in names if name not in PAPER_CHOICES]


def default_choices(source: str) -> list[str]:
    """The checked caches for a model source: a bundled model with sliding layers starts with
    `HYBRID_CHOICES`, any other with the paper's three."""
    try:
        model = bundled_model(source)
    except ModelLoadError:
        model = None
    return list(HYBRID_CHOICES) if model is not None and model.sliding_window else list(DEFAULT_CHOICES)


def model_window(loaded) -> int | None:
    """The model's own sliding window from its config (tokens), when it has sliding layers."""
    windows = [w for w in layer_windows(loaded.config) if w]
    return min(windows) if windows else None


@dataclass
class PerplexityRequest:
    """The tab's inputs as the page sends them (not yet validated).

    choices: checked labels from `perplexity_choices()`; extra: more columns in the compare syntax.
    tokens: tokens of the text to stream; window, sinks: `window_length` and `num_sink_tokens` for sink
    columns that do not set them.
    """

    source: str = "bundled"
    text_choice: str = BUILT_IN
    choices: list[str] = field(default_factory=lambda: list(DEFAULT_CHOICES))
    extra: str = ""
    tokens: float | int = DEFAULT_TOKENS
    window: float | int = DEFAULT_WINDOW
    sinks: float | int = DEFAULT_SINKS
    pasted: str = ""

    def spec_text(self) -> str:
        """Every picked column in the compare syntax, checked boxes first."""
        specs = [{**PAPER_CHOICES, ALL_FULL: "dynamic:layer_types=full"}.get(label, label) for label in self.choices or []]
        return ",".join(specs + [part for part in [(self.extra or "").strip()] if part])

    def columns(self) -> list[Column]:
        """The picked columns (`kvlab.quality.perplexity.perplexity_columns`), checked without a model.

        Raises:
            StrategyError: an unknown name or knob, a knob not written as key=value, a strategy that keeps no
                cache, a label twice.
            ValueError: nothing picked.
        """
        return perplexity_columns(self.spec_text(), int(self.window), int(self.sinks))

    def text(self) -> str:
        """The text to stream: the pasted one, or the shipped long text. Raises ValueError when it is empty or a
        pasted one is longer than `kvlab.quality.defaults.MAX_TEXT_CHARS` (checked before it is tokenized)."""
        text = self.pasted if self.text_choice == PASTED else shipped_text()
        if not text or not text.strip():
            raise ValueError("the text is empty: paste a long text or pick the built-in one")
        refusal = pasted_text_refusal(text) if self.text_choice == PASTED else None
        if refusal:
            raise ValueError(refusal)
        return text


@dataclass
class PerplexityPlan:
    """A run that can start: token ids (1, seq), the columns that run, the ones left out (label -> why), and
    the model's own sliding window from its config (tokens; None without sliding layers)."""

    input_ids: object
    columns: list[Column]
    skipped: dict[str, str]
    model_window: int | None = None


def plan_perplexity(request: PerplexityRequest, loaded) -> PerplexityPlan:
    """Validate the form against `loaded` (a `kvlab.models.LoadedModel`).

    Caches that cannot run on this model are left out and named in `skipped` with the reason.

    Raises:
        StrategyError: a bad spec, a knob not written as key=value, or no picked cache can run on this model.
        ValueError: nothing picked, the text is empty, shorter than 2 tokens or longer than MAX_TEXT_CHARS. Only
            the text's first `tokens * CHARS_PER_TOKEN` characters are tokenized.
    """
    columns = request.columns()
    tokens = int(request.tokens)
    ids = loaded.tokenizer(request.text()[: tokens * CHARS_PER_TOKEN], return_tensors="pt")["input_ids"][:, :tokens]
    if ids.shape[1] < 2:
        raise ValueError("the text has fewer than 2 tokens")
    skipped = refusals(loaded, columns, ids.shape[1])
    runnable = [column for column in columns if column.describe() not in skipped]
    if not runnable:
        raise StrategyError("no picked cache can run on this model: " + skipped_text(skipped))
    return PerplexityPlan(ids, runnable, skipped, model_window(loaded))


def skipped_text(skipped: dict[str, str]) -> str:
    """`label: reason; label: reason` for caches left out."""
    return "; ".join(f"{label}: {reason}" for label, reason in skipped.items())


def segment_table(nll: dict[str, list[float]], window: int) -> pd.DataFrame:
    """One row per cache, one column per `window`-token segment (perplexity, not log)."""
    segments = {name: ppl_by_segment(values, window) for name, values in nll.items()}
    longest = max(segments.values(), key=len, default=[])
    headers = [f"tokens {s['start'] + 1}-{s['end']}" for s in longest]
    rows = [[name] + [round(s["ppl"], 2) for s in parts] + [None] * (len(longest) - len(parts))
            for name, parts in segments.items()]
    return pd.DataFrame(rows, columns=["cache"] + headers)


class PerplexityView:
    """The view model of one perplexity run, built by `apply`-ing its events in order.

    Args:
        labels: the caches that run, in column order.
        window: tokens of the running log-perplexity and of each table segment.
        total: tokens scored per cache when the run completes (text tokens - 1).
        skipped: caches left out, label -> reason (shown in the status line).
        model_window: the model's own sliding window (tokens), named in the plots' caption; None without one.
    """

    def __init__(self, labels: list[str], window: int, total: int, skipped: dict[str, str] | None = None,
                 model_window: int | None = None):
        self.window, self.total, self.model_window = window, total, model_window
        self.labels = list(labels)
        self.skipped = dict(skipped or {})
        self.nll: dict[str, list[float]] = {label: [] for label in labels}
        self.cache_bytes: dict[str, list[int]] = {label: [] for label in labels}
        self.position = 0

    def apply(self, event) -> None:
        """Fold one event of the run in: a `TokenScored` adds a point to its column's curves; the others
        (the run's start and end, a failed column) change nothing here. Raises IndexError for a column the
        view was not given."""
        if isinstance(event, TokenScored):
            label = self.labels[event.column]
            self.nll[label].append(event.nll)
            self.cache_bytes[label].append(event.cache_bytes)
            self.position = event.position

    def running_ppl(self, label: str, upto: int | None = None) -> float | None:
        """Perplexity over the `window` tokens of one cache ending at its token `upto` (default: its last),
        None before its first token."""
        scored = self.nll[label] if upto is None else self.nll[label][:upto]
        recent = scored[-self.window:]
        return math.exp(sum(recent) / len(recent)) if recent else None

    def tokens_per_cache(self) -> int:
        return min((len(values) for values in self.nll.values()), default=0)

    def _note(self) -> str:
        return f" · not run: {skipped_text(self.skipped)}" if self.skipped else ""

    def progress_text(self) -> str:
        """e.g. `token 300 of 1023 · dynamic ppl 12.3 · window 256 ppl 40.1`: every cache's perplexity over
        the same tokens (those every cache has scored), so a cache one token ahead is not compared early."""
        common = self.tokens_per_cache()
        parts = [f"token {common} of {self.total}"]
        if common:
            parts += [f"{label} ppl {self.running_ppl(label, common):.1f}" for label in self.nll]
        return " · ".join(parts) + self._note()

    def final_text(self, stopped: bool) -> str:
        """e.g. `done: 1023 tokens per cache` (or `stopped: ...`), plus the caches left out."""
        return f"{'stopped' if stopped else 'done'}: {self.tokens_per_cache()} tokens per cache" + self._note()

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(running log-PPL in nats, cache MiB) against position, one series per cache
        (`kvlab.ui.shared.plot_frames.perplexity_frames`)."""
        return perplexity_frames(self.nll, self.cache_bytes, self.window)

    def colors(self) -> dict[str, str]:
        """Cache label -> its curve's colour (dense blue, window red, sink green, then the rest)."""
        return perplexity_colors(self.nll)

    def caption(self) -> str:
        """What the curves average over, and the model's own sliding window when it has one."""
        text = f"log-perplexity over the last {self.window} tokens at each position"
        if self.model_window:
            text += f"; the model's own sliding window is {self.model_window} tokens"
        return text

    def table(self) -> pd.DataFrame:
        return segment_table(self.nll, self.window)
