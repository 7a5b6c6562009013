"""The Compare tab's view model, pure: the runner's events -> what the page shows.

- `RunView.apply(event)` folds one `kvlab.compare.events` event into a view model: per
  column the streamed text, a status (waiting, running, done, stopped, error,
  unavailable) with its message, a live readout (tokens, tok/s, cache size), the
  series the plots draw (with each fallback switch of a budgeted column), and
  after the run the summary table with the best value per metric marked.
- The form's side (the page's values -> a validated `RunPlan`) is
  `kvlab.ui.compare.form`; after the run, `kvlab.ui.compare.records` writes the record,
  the exports and the code.

No gradio, no threads of its own. The browser tab (`kvlab.ui.compare.tab`)
turns this into component updates; tests feed it fake events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.compare.events import (
    ColumnDone,
    ColumnResult,
    ColumnStarted,
    Event,
    FallbackSwitched,
    FidelityScored,
    MemorySample,
    RunPhase,
    StepMetrics,
    SummaryReady,
    TokenEvent,
)
from kvlab.compare.summary import LABELS, best_marks, best_sets, by_layer_type_text, candidates, summary_rows
from kvlab.protocol import ColumnFailed, RunDone, RunStarted

from ..shared.figures import MIB
from ..shared.markup import md_text
from .timing_text import TIMING_HELP, phase_text, policy_readout, timing_line

BEST_MARK = " ★"
MISSING = "–"
PENDING = "scoring…"
"""A teacher-forced figure the fidelity pass has not reached yet (the summary shows before it)."""
FIDELITY_KEYS = ("top1_agreement", "mean_kl")
SUMMARY_HELP = (
    "★ marks the best value per metric among finished columns; timing figures closer than their measured noise "
    "are marked as ties (all or none). **TTFT**: prefill + first token. "
    "**decode tok/s**: generated tokens per second of compute (in fair mode each column is timed alone). "
    f"{TIMING_HELP} "
    "**ITL p50 / p99**: inter-token latency, the median and 99th percentile of the decode steps after the "
    "first token, in ms (as vLLM's and GuideLLM's benchmarks report it; the mean, p90 and end-to-end latency "
    "are in the JSON and CSV). "
    "**peak cache**: bytes of the cache tensors (not process memory); *vs baseline* divides by the baseline's. "
    "**agreement**: share of the baseline's tokens matched at the same position; **first divergence**: first "
    "token index that differs, counted from 0 as Inspect counts its tokens (the link opens Inspect at it). **top-1 agreement** and **mean KL** feed the baseline's text through each "
    "column's cache (teacher-forced) and compare next-token distributions, a fairer judge of a lossy cache."
)

NOTE_CHARS = 48
"""Characters of a column's note shown in its summary cell; the whole notes follow the table once each
(`summary_notes`), behind a toggle."""
MORE_MARK = " …"
"""Ends a summary note cut to NOTE_CHARS: the whole note is in the notes below the table."""

BUSY_MARK = " · ⚠ too busy for a fair comparison (why: the notes under the summary)"
"""Ends the one-line finished status when the machine was too busy; the timing note itself is in
`RunView.summary_notes`."""

DISPLAY_COLUMNS = [
    ("column", "text"), ("status", "text"), ("ttft_s", "seconds"), ("decode_tok_s", "rate"), ("itl_ms_p50", "ms"),
    ("itl_ms_p99", "ms"),
    ("peak_cache_bytes", "mib"), ("vs_baseline_bytes", "ratio"), ("predicted_cache_bytes", "mib"),
    ("cache_bytes_by_layer_type", "by_type"), ("agreement", "percent"), ("first_divergence", "int"), ("top1_agreement", "percent"), ("mean_kl", "kl"),
    ("note", "text"),
]
"""The summary table: (key in `report.summary_rows`, formatter kind), in display order."""

HEADERS = {**LABELS, "peak_cache_bytes": "peak cache (MiB)", "vs_baseline_bytes": "vs baseline",
           "predicted_cache_bytes": "predicted dense (MiB)", "cache_bytes_by_layer_type": "by layer type, end (MiB)"}
"""Header shown per key: the report's labels, with MiB where the page shows bytes as MiB."""
SUMMARY_WIDTHS = ["10%", "9%", "5%", "5%", "5%", "5%", "5%", "6%", "6.5%", "7.5%", "6.5%", "6.5%", "6.5%", "6.5%",
                  "10%"]
"""Summary table column widths, in the order of DISPLAY_COLUMNS: at 1400 px each column holds its longest header
word and value ("unavailable", "divergence", "0.0000 ★") whole, with the table's type set in
`kvlab.ui.shared.theme.CSS`."""
SUMMARY_DATATYPES = ["markdown" if key == "first_divergence" else "str" for key, _ in DISPLAY_COLUMNS]
"""The summary's cell types: the first divergence is a link into Inspect (`RunView.divergence_links`)."""

FINISHED = ("done", "warning", "stopped", "error", "unavailable")


# ----- the view model -----

def format_mib(n_bytes: int | None) -> str:
    """Bytes as MiB with two decimals (`4055040` -> `3.87 MiB`)."""
    return MISSING if n_bytes is None else f"{n_bytes / MIB:.2f} MiB"


def short_note(note: str | None) -> str:
    """A summary cell's note: the first clause of `note` (up to its first `;` or sentence end), cut at a word to
    at most NOTE_CHARS characters and marked MORE_MARK when anything was left out."""
    if not note:
        return ""
    first = note.split("; ")[0].split(". ")[0].rstrip(".")
    if len(first) > NOTE_CHARS:
        first = first[:NOTE_CHARS].rsplit(" ", 1)[0]
    return note if first == note else first + MORE_MARK


def format_value(value, kind: str) -> str:
    """One summary cell as text; None becomes a dash."""
    if value is None:
        return MISSING
    formats = {"seconds": "{:.3f}", "rate": "{:.1f}", "ms": "{:.1f}", "ratio": "{:.2f}×", "kl": "{:.4f}"}
    if kind in formats:
        return formats[kind].format(value)
    if kind == "mib":
        return f"{value / MIB:.2f}"
    if kind == "by_type":
        return by_layer_type_text(value, MIB, 2)
    if kind == "percent":
        return f"{100 * value:.1f}%"
    return str(value)


@dataclass
class ColumnView:
    """One column as the page shows it. Series are indexed by generated token (step); the by-layer-type ones
    map a layer type to its series. keeps: what the cache keeps on this model ('' without sliding layers)."""

    index: int
    title: str
    status: str = "waiting"
    message: str = ""
    text: str = ""
    prompt_tokens: int = 0
    cache_bytes: list[int] = field(default_factory=list)
    predicted_cache_bytes: list[int] = field(default_factory=list)
    cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    predicted_cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    per_token_s: list[float] = field(default_factory=list)
    keeps: str = ""
    switches: list[dict] = field(default_factory=list)
    result: ColumnResult | None = None

    @property
    def tokens(self) -> int:
        return len(self.per_token_s)

    def tok_s(self) -> float | None:
        """Decode tokens per second of compute (the first token, which includes prefill, is left out)."""
        decode = self.per_token_s[1:]
        total = sum(decode)
        return len(decode) / total if decode and total > 0 else None

    def readout(self) -> str:
        """The live line under the status, e.g. `23 tokens · 12.1 tok/s · cache 1.94 MiB`."""
        if self.status in ("error", "unavailable") and not self.tokens:
            return ""
        parts = [f"{self.tokens} token{'s' if self.tokens != 1 else ''}"]
        rate = self.tok_s()
        shown = policy_readout(self.result, rate)
        if shown or rate is not None:
            parts.append(shown or f"{rate:.1f} tok/s")
        if self.cache_bytes:
            parts.append(f"cache {format_mib(self.cache_bytes[-1])}")
        result = self.result
        if result is not None and result.is_baseline:
            parts.append("baseline")
        elif result is not None and result.top1_agreement is not None:
            parts.append(f"top-1 {100 * result.top1_agreement:.0f}%")
        return " · ".join(parts)

    def status_text(self) -> str:
        """Status word plus its message, e.g. `unavailable: needs a CUDA GPU ...`."""
        return f"{self.status}: {self.message}" if self.message else self.status


@dataclass
class MemoryView:
    """Process memory samples: time since the run started (s), RSS and CUDA allocated (bytes)."""

    elapsed_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    cuda_allocated_bytes: list[int] = field(default_factory=list)


class RunView:
    """The view model of one run, built by `apply`-ing its events in order.

    Args:
        titles: one title per run column (the strategies' `describe()`), in run order.
        slots: for each run column, the page slot it is shown in (its colour); default 0..n-1.
    """

    def __init__(self, titles: list[str], slots: list[int] | None = None):
        self.columns = [ColumnView(i, title) for i, title in enumerate(titles)]
        self.slots = list(slots) if slots is not None else list(range(len(titles)))
        self.memory = MemoryView()
        self.done: RunDone | None = None
        self.stop_requested = False
        self.run_phase: RunPhase | None = None
        self.ready: SummaryReady | None = None
        """The summary's results once every column finished (before the fidelity pass)."""
        self.scored = 0
        """Columns whose fidelity has been scored so far (`FidelityScored` events)."""
        self.to_score = 0
        """Columns the fidelity pass scores (`SummaryReady.to_score`)."""
        self.plot_series: dict[str, list[str]] = {}
        """Per native plot, the series the page was last sent (`kvlab.ui.shared.live_plots.LivePlots.updates`)."""
        self.divergence_links: dict[int, str] = {}
        """Run column index -> the link opening Inspect at its first divergence (`kvlab.ui.shared.inspect_links`)."""
        self.divergence_reasons: dict[int, str] = {}
        """Run column index -> why its first divergence has no link into Inspect."""

    def apply(self, event: Event) -> set[int]:
        """Fold one event in; returns the run column indices whose text or status changed."""
        if isinstance(event, MemorySample):
            self.memory.elapsed_s.append(event.elapsed_s)
            self.memory.rss_bytes.append(event.rss_bytes)
            self.memory.cuda_allocated_bytes.append(event.cuda_allocated_bytes)
            return set()
        if isinstance(event, RunPhase):
            self.run_phase = event
            return set()
        if isinstance(event, SummaryReady):
            self.ready, self.to_score = event, event.to_score
            for column, result in zip(self.columns, event.results):
                column.result = result
            return set(range(len(self.columns)))
        if isinstance(event, RunDone):
            self.done = event
            for column, result in zip(self.columns, event.results):
                column.result = result
            return set(range(len(self.columns)))
        if isinstance(event, RunStarted):
            return set()
        if not isinstance(event, (ColumnStarted, TokenEvent, StepMetrics, FallbackSwitched, ColumnDone, ColumnFailed,
                                  FidelityScored)):
            raise TypeError(f"not a runner event: {event!r}")
        if isinstance(event, FidelityScored):
            self.scored = max(self.scored, event.scored)
        self._apply_to_column(self.columns[event.column], event)
        return {event.column}

    @staticmethod
    def _apply_to_column(column: ColumnView, event: Event) -> None:
        if isinstance(event, ColumnStarted):
            column.title, column.prompt_tokens, column.status = event.name, event.prompt_tokens, "running"
            column.keeps, column.message = event.keeps, event.note
        elif isinstance(event, TokenEvent):
            column.text += event.text
        elif isinstance(event, StepMetrics):
            column.per_token_s.append(event.per_token_s)
            if event.cache_bytes is not None:  # an engine column that reports no bytes (a server) has no series
                column.cache_bytes.append(event.cache_bytes)
                column.predicted_cache_bytes.append(event.predicted_cache_bytes)
            for kind, value in event.cache_bytes_by_layer_type.items():
                column.cache_bytes_by_layer_type.setdefault(kind, []).append(value)
            for kind, value in event.predicted_cache_bytes_by_layer_type.items():
                column.predicted_cache_bytes_by_layer_type.setdefault(kind, []).append(value)
        elif isinstance(event, FallbackSwitched):
            column.switches.append(event.fallback)
            sentence = f"switched to {event.fallback['to']} at token {event.fallback['at_token']}: " \
                       f"{event.fallback['reason']}"
            column.message = "; ".join(filter(None, [column.message, sentence]))
        elif isinstance(event, ColumnDone):
            column.result, column.text = event.result, event.result.text
            column.status = "stopped" if event.result.stopped else ("warning" if event.result.warning else "done")
            column.message = "; ".join(filter(None, [event.result.warning, event.result.message]))
        elif isinstance(event, ColumnFailed):
            column.result, column.status, column.message = event.result, event.status, event.message
        else:
            column.result, column.message = event.result, event.result.message

    def recorded(self, part: str) -> dict:
        """The run record's `part` (`timing`, `fidelity`) once the run is done; {} before, or when a record
        predates it."""
        return (self.done.record.get(part) or {}) if self.done is not None else {}

    @property
    def columns_finished(self) -> bool:
        return all(c.status in FINISHED for c in self.columns)

    def phase(self) -> str:
        """`running`, `finishing` (columns finished, the timing policy's pass), `scoring` (the summary is shown,
        fidelity being scored), `stopping`, `stopped` or `done`."""
        if self.done is not None:
            return "stopped" if self.done.stopped else "done"
        if self.stop_requested:
            return "stopping"
        if self.ready is not None:
            return "scoring"
        return "finishing" if self.columns_finished else "running"

    def fidelity_text(self) -> str:
        """`fidelity: 2 of 5 columns scored` while (and after) the pass runs; '' when it scores nothing."""
        fidelity = self.recorded("fidelity")
        to_score = fidelity.get("to_score", 0) if self.done is not None else self.to_score
        if not to_score:
            return ""
        scored = fidelity.get("scored", self.scored) if self.done is not None else self.scored
        stopped = " (stopped)" if fidelity.get("state") == "stopped" else ""
        return f"fidelity: {scored} of {to_score} columns scored{stopped}"

    def progress_text(self) -> str:
        """One line for the run status, e.g. `running: 3 of 5 columns, 120 tokens so far`."""
        phase = self.phase()
        tokens = sum(c.tokens for c in self.columns)
        if phase == "running" and self.run_phase is not None and self.run_phase.phase == "warm_up" and not tokens:
            return phase_text(self.run_phase, tokens)
        if phase == "running":
            active = sum(c.status == "running" for c in self.columns)
            return f"running: {active} of {len(self.columns)} columns generating, {tokens} tokens so far"
        if phase == "finishing":
            return phase_text(self.run_phase, tokens) or f"columns finished ({tokens} tokens)…"
        if phase == "scoring":
            return (f"summary ready after {self.ready.wall_s:.1f} s ({tokens} tokens); "
                    f"{self.fidelity_text() or 'fidelity: nothing to score'}, teacher-forced against the baseline…")
        if phase == "stopping":
            return "stopping every column…"
        wall = f" in {self.done.wall_s:.1f} s" if self.done else ""
        counts = {}
        for c in self.columns:
            counts[c.status] = counts.get(c.status, 0) + 1
        detail = ", ".join(f"{n} {status}" for status, n in counts.items())
        timing = {key: value for key, value in self.recorded("timing").items() if key != "note"}
        busy = BUSY_MARK if timing.get("busy") else ""  # one line: the timing note goes under the summary
        summary_s = self.done.record.get("summary_s") if self.done else None
        summary = f" · summary after {summary_s:.1f} s" if summary_s else ""
        fidelity = f" · {self.fidelity_text()}" if self.fidelity_text() else ""
        return f"{'stopped' if phase == 'stopped' else 'finished'}{wall}: {tokens} tokens ({detail})" + \
            summary + fidelity + timing_line(timing) + busy

    def summary(self) -> tuple[list[dict], dict[str, int]]:
        """(report.summary_rows of the results, metric -> index of the best row) from `SummaryReady` on (the
        fidelity figures fill in as they are scored); empty before it."""
        results = self.done.results if self.done is not None else self.ready.results if self.ready else None
        if results is None:
            return [], {}
        rows = summary_rows(results)
        return rows, best_marks(rows)

    def pending(self, row: int) -> bool:
        """Whether row `row`'s teacher-forced figures are still to come (the fidelity pass is running)."""
        if self.done is not None or self.ready is None or not self.to_score:
            return False
        result = self.ready.results[row]
        return result.status == "ok" and bool(result.token_ids) and not result.fidelity_status

    def summary_table(self) -> tuple[list[str], list[list[str]]]:
        """(headers, rows of display strings) with `BEST_MARK` after the best value of each metric.

        Rows that tie with the best value are all marked; a metric on which every candidate row ties
        (nothing to choose) is not marked at all.
        """
        rows, _ = self.summary()
        marked = best_sets(rows)
        headers = [HEADERS[key] for key, _ in DISPLAY_COLUMNS]
        table = [[self._cell(i, key, (short_note(row[key]) if key == "note" else self._value(i, key, row[key], kind))
                             + (BEST_MARK if i in marked.get(key, ()) else ""))
                  for key, kind in DISPLAY_COLUMNS] for i, row in enumerate(rows)]
        return headers, table

    def _value(self, row: int, key: str, value, kind: str) -> str:
        """A cell's text: PENDING for a teacher-forced figure still being scored."""
        if value is None and key in FIDELITY_KEYS and self.pending(row):
            return PENDING
        return format_value(value, kind)

    def summary_notes(self) -> str:
        """Markdown: every column's note in full, each distinct note once with the columns it belongs to, and the
        run's timing note (kept off the one-line status), in a closed `<details>` (the summary cells show the
        first NOTE_CHARS characters); '' when there is nothing more to say. Column names and notes (a replayed
        record's own text) are literal text (`kvlab.ui.shared.markup.md_text`)."""
        rows, _ = self.summary()
        timing_note = self.recorded("timing").get("note")
        notes: dict[str, list[str]] = {timing_note: ["timing"]} if timing_note else {}
        for row in rows:
            if row["note"] and short_note(row["note"]) != row["note"]:
                notes.setdefault(row["note"], []).append(str(row["column"]))
        for index, reason in self.divergence_reasons.items():
            if index < len(rows):
                notes.setdefault(f"its first divergence has no link into Inspect: {reason}", []).append(
                    str(rows[index]["column"]))
        if not notes:
            return ""
        items = "\n".join(f"- **{md_text(', '.join(columns))}**: {md_text(note)}" for note, columns in notes.items())
        return f"<details class=\"kv-more\"><summary>notes in full</summary>\n\n{items}\n\n</details>"

    def _cell(self, row: int, key: str, text: str) -> str:
        """A summary cell: the first divergence (a Markdown cell, SUMMARY_DATATYPES) as literal text, linked into
        Inspect when it has a link; any other cell (plain text) as it is."""
        if key != "first_divergence":
            return text
        link = self.divergence_links.get(row)
        return f"[{md_text(text)}]({link})" if link else md_text(text)


def best_rows(rows: list[dict], metric: str, best: int) -> set[int]:
    """Indices of the rows tied with row `best` on `metric` (the candidates `report.best_marks` chose
    from); empty when every candidate ties."""
    value = rows[best][metric]
    competing = candidates(rows, metric)
    tied = {i for i in competing if rows[i][metric] == value}
    return set() if len(tied) == len(competing) and len(competing) > 1 else tied
