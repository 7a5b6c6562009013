"""The Report tab's pure part: the form -> a checked plan, the report's events (or saved records) -> table rows,
the page's table, the quality-vs-bytes plot's frame and the status line.

- `plan_report(request, loaded)` tokenizes the text (the shipped long text or the user's own), takes its first
  `context_tokens + scored_tokens` tokens and checks the split and the columns before any compute
  (`kvlab.quality.report.check_split`, `report_columns`).
- `ReportView.apply(event)` folds in a report run's events (`kvlab.protocol`'s and `kvlab.quality.report`'s); its `rows()` are
  `kvlab.quality.record.TABLE_FIELDS` dicts, one per column of the run in order (a column without figures
  yet is a row of blanks, a column error a row with its message), and end as the record's own rows.
- `rows_from_files(paths)` reads saved report, Compare and Needle records into one merged table
  (`rows_from_record`, `merge_rows`); a file that cannot be read is one line in the problems, the rest load.
- `table_frame(rows)` is the page's table (figures formatted as `kvlab.quality.table` formats them for the
  terminal, the Pareto front of mean bytes against mean KL marked); `plot_frame(rows, y, roster)` is the
  scatter plot's data: one point per row with bytes and the figure `y`, every figure as text for the hover,
  and one blank row (no x, no y: nothing drawn) for each series of `roster` without a point, so a native
  plot's colour domain holds every column from the first frame on.

No gradio, no model runs here; tests feed it fake events.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvlab.protocol import ColumnFailed, RunDone, RunStarted
from kvlab.quality.defaults import DEFAULT_COLUMNS as CLI_COLUMNS
from kvlab.quality.defaults import CHARS_PER_TOKEN, SHIPPED_TEXT_INFO, pasted_text_refusal, shipped_text
from kvlab.quality.record import TABLE_FIELDS, load_record, merge_rows, rows_from_record
from kvlab.quality.report import REFERENCE, ReportProgress, Split, check_split, report_columns
from kvlab.quality.stats import pareto_front
from kvlab.strategies.knob_yaml import shown
from kvlab.quality.table import HEADERS, MIB, cells, column_label, front_group, pareto_marks

from ..shared.markup import md_code, md_text

DEFAULT_COLUMNS = "sink:window_length=128, quantized:backend=quanto:nbits=4, snapkv:compression_ratio=0.5"
"""A first run's columns: one of each family (window + sinks, quantization, scored eviction)."""
DEFAULT_CONTEXT_TOKENS = 512
DEFAULT_SCORED_TOKENS = 64
"""A first run's split: small enough to finish in well under a minute on 2 CPU cores with SmolLM2-135M."""
MAX_CONTEXT_TOKENS = 8192
MAX_SCORED_TOKENS = 4096
CLI_COLUMN_COUNT = len([item for item in CLI_COLUMNS.split(",") if item.strip()])
"""Columns `kvlab report` runs by default (`kvlab.quality.defaults.DEFAULT_COLUMNS`), named in the form's note."""
BUILT_IN = "the shipped text: The Python Language Reference (PSF-2.0)"
PASTED = "your own text (pasted below)"
Y_CHOICES = {"mean KL": "kld_mean", "ΔPPL": "ppl_diff"}
"""The plot's y axis: radio label -> figure field."""
Y_TITLES = {"kld_mean": "mean KL(dense ‖ column) (nats)", "ppl_diff": "ΔPPL = PPL(column) − PPL(dense)"}
PLOT_FIELDS = ("series", "cache_MiB", "y", "column", "model", "status", "scored", "ppl_ratio", "dppl", "mean_kl",
               "p99_kl", "max_kl", "top1", "mib_mean", "mib_end", "vs_dense", "tok_s", "needle", "bytes", "front")
HOVER_FIELDS = list(PLOT_FIELDS[3:])
"""The plot's hover: every figure of the point, as the table writes it."""
MIB_PADDING = 0.1
"""The bytes axis runs from 0 to (1 + this) × the largest column's MiB, so no point sits on its edge."""
NAN = float("nan")


@dataclass
class ReportRequest:
    """The tab's inputs as the page sends them (not yet checked); columns in compare syntax; the text is the
    shipped one (`kvlab.quality.defaults.shipped_text`, about 8,500 SmolLM2 tokens) unless PASTED is picked."""

    source: str = "bundled"
    text_choice: str = BUILT_IN
    pasted: str = ""
    columns: str = DEFAULT_COLUMNS
    context_tokens: float | int = DEFAULT_CONTEXT_TOKENS
    scored_tokens: float | int = DEFAULT_SCORED_TOKENS

    def text(self) -> str:
        """The text to score: the pasted one or the shipped long text. Raises ValueError when it is empty or
        longer than `kvlab.quality.defaults.MAX_TEXT_CHARS` (checked before it is tokenized)."""
        text = self.pasted if self.text_choice == PASTED else shipped_text()
        if not text or not text.strip():
            raise ValueError("the text is empty: paste a long text or pick the shipped one")
        refusal = pasted_text_refusal(text)
        if refusal:
            raise ValueError(refusal)
        return text

    def text_info(self) -> dict:
        """What the record says about the text."""
        if self.text_choice == PASTED:
            return {"name": "pasted", "title": "the user's own text"}
        return dict(SHIPPED_TEXT_INFO)


@dataclass
class ReportPlan:
    """A run that can start: the text's token ids (1, context + scored), its split, the progress interval
    (tokens) and what the record says about the text."""

    input_ids: object
    split: Split
    progress_every: int
    text_info: dict


def whole(value, name: str) -> int:
    """`value` (a number from the page) as an int. Raises ValueError naming `name` when it is not a whole number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number, got {shown(value)}") from None
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number, got {shown(value)}")
    return int(number)


def progress_every(scored_tokens: int) -> int:
    """Tokens between two table updates: about 16 updates a run, at least every 4 tokens."""
    return max(4, scored_tokens // 16)


def plan_report(request: ReportRequest, loaded) -> ReportPlan:
    """Check the form against `loaded` (a `kvlab.models.LoadedModel`) and tokenize the text.

    Raises:
        ValueError: the text is empty or has fewer tokens than the split needs (the message gives its count), a
            split below 1 token, no column or more than the report takes (`report_columns`). Bad single columns
            are not raised: each becomes its own error row when the run starts.
    """
    context, scored = whole(request.context_tokens, "context tokens"), whole(request.scored_tokens, "scored tokens")
    text = request.text()
    wanted = max(1, context + scored)
    ids = loaded.tokenizer(text[:wanted * CHARS_PER_TOKEN], return_tensors="pt")["input_ids"]
    if ids.shape[1] < wanted and len(text) > wanted * CHARS_PER_TOKEN:
        ids = loaded.tokenizer(text, return_tensors="pt")["input_ids"]
    split = check_split(ids.shape[1], scored, context)
    report_columns(request.columns or "")
    return ReportPlan(ids[:, :context + scored], split, progress_every(scored), request.text_info())


def blank_row(model: str, column: str, status: str, message: str = "", context_tokens: int | None = None) -> dict:
    """A TABLE_FIELDS row with no figures."""
    return {**dict.fromkeys(TABLE_FIELDS), "model": model, "column": column, "status": status, "message": message,
            "context_tokens": context_tokens, "source": "this run"}


class ReportView:
    """What the page shows of one report run, updated one event at a time (`apply`)."""

    def __init__(self, model: str):
        self.model = model
        self.columns: list[str] = []
        self.split: Split | None = None
        self._rows: dict[str, dict] = {}
        self.done: RunDone | None = None

    def apply(self, event) -> None:
        """Fold one event of a report run in. Raises TypeError for anything else."""
        if isinstance(event, RunStarted):
            self.columns, self.split = list(event.columns), event.plan
            self._rows = {name: blank_row(self.model, name, "waiting", context_tokens=event.plan.context_tokens)
                          for name in event.columns}
        elif isinstance(event, ReportProgress):
            self._rows[event.column] = {**self._rows[event.column], **event.figures, "reference": event.reference,
                                        "status": "scoring"}
        elif isinstance(event, ColumnFailed):
            self._rows[event.name] = {**blank_row(self.model, event.name, "error", event.message,
                                                  self._rows.get(event.name, {}).get("context_tokens"))}
        elif isinstance(event, RunDone):
            self.done = event
            self._rows = {row["column"]: {**row, "source": "this run"}
                          for row in rows_from_record(event.record, "this run")}
            self.columns = self.columns or list(self._rows)
        else:
            raise TypeError(f"not a report event: {event!r}")

    def rows(self) -> list[dict]:
        """One TABLE_FIELDS row per column, in the run's order."""
        return [self._rows[name] for name in self.columns if name in self._rows]

    def has_points(self) -> bool:
        """Whether some column has figures to draw."""
        return any(row.get("kld_mean") is not None for row in self.rows())

    def round_complete(self) -> bool:
        """Whether every column still scoring has figures over the same number of tokens (a full progress round
        has arrived: the moment to redraw)."""
        counts = {row.get("scored_tokens") for row in self.rows() if row["status"] in ("waiting", "scoring")}
        return len(counts) <= 1 and None not in counts

    def roster(self) -> list[str]:
        """Every column of the run: the plot's series from its first frame to its last."""
        return series_names(self.rows())

    def status_text(self) -> str:
        """Progress (tokens scored of the split; a range when the columns differ, as a Stop that lands inside a
        round leaves them), errors, and how the run ended."""
        if self.split is None:
            return "starting…"
        rows = self.rows()
        errors = sum(row["status"] == "error" for row in rows)
        counts = [row.get("scored_tokens") or 0 for row in rows if row["status"] != "error"] or [0]
        scored = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        head = (f"{len(rows)} column(s) against {REFERENCE} on {self.split.context_tokens} context tokens + "
                f"{self.split.scored_tokens} scored")
        if self.done is None:
            line = f"{head} · {scored} of {self.split.scored_tokens} tokens scored"
        elif self.done.stopped:
            line = (f"{head} · stopped after {scored} of {self.split.scored_tokens} tokens "
                    f"({self.done.wall_s:.1f} s): the table keeps every token scored")
        else:
            line = f"{head} · done in {self.done.wall_s:.1f} s"
        return line + (f" · {errors} column(s) could not run: see their rows" if errors else "")


MAX_SAVED_RECORDS = 32
"""Most saved records one load merges (a leaderboard is one record; each may be up to the record cap)."""


def rows_from_files(paths) -> tuple[list[dict], list[str]]:
    """The merged table rows of saved records (report, Compare, Needle) and one line per file that could not be
    read (its name and why). More than MAX_SAVED_RECORDS files are refused whole, in one line, before any is
    read."""
    groups, problems = [], []
    if len(paths or []) > MAX_SAVED_RECORDS:
        return [], [f"{len(paths)} files picked: one load merges at most {MAX_SAVED_RECORDS} saved records "
                    f"(MAX_SAVED_RECORDS); pick fewer"]
    for path in paths or []:
        name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
        try:
            record = load_record(path, name)  # its message names the file by `name`, never the server's path
        except ValueError as err:
            problems.append(str(err))
            continue
        try:
            groups.append(rows_from_record(record, name))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{name}: {err}" if isinstance(err, ValueError) else f"{name}: not a kvlab record ({err})")
    return merge_rows(groups), problems


def _models(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["model"] for row in rows))


def replay_status(rows: list[dict], records_read: int, problems: list[str]) -> str:
    """The status line after saved records load: how many rows from how many records, the models they are of
    (the table names the model only when there are several), then one ⚠️ line per file that could not be read;
    with no rows, only those lines (or what to pick when there are none). Markdown; what the files hold or are
    named (models, problems) is literal text (`kvlab.ui.shared.markup.md_text`)."""
    lines = [f"⚠️ {md_text(problem)}" for problem in problems]
    if not rows:
        return "  \n".join(lines) or "⚠️ no rows: pick report, Compare or Needle records"
    models = _models(rows)
    head = (f"{len(rows)} row(s) from {records_read} saved record(s) · model{'s' if len(models) > 1 else ''}: "
            f"{', '.join(md_text(model) for model in models)}")
    return "  \n".join([head, *lines])


def series_names(rows: list[dict]) -> list[str]:
    """The plot series of each row: the column's name, prefixed with its model when rows of several models mix."""
    several = len(_models(rows)) > 1
    return [f"{row['model']} · {row['column']}" if several else row["column"] for row in rows]


def table_frame(rows: list[dict]) -> pd.DataFrame:
    """The page's table: per row its column (and model when several), status, context and scored tokens, the
    figures as `kvlab.quality.table.cells` writes them (the needle column only when a row has one), the Pareto
    mark (mean bytes against mean KL, per model) and the row's message (the note column only when a row has
    one)."""
    marks = pareto_marks(rows)
    needle = any(row.get("needle_cells") is not None for row in rows)
    several = len(_models(rows)) > 1
    figure_headers = list(HEADERS[2:12]) + (["needle [95% CI]"] if needle else [])
    records = []
    for row, mark in zip(rows, marks):
        text = cells({**row, "status": "ok"}, mark)
        figures = text[2:12] + ([text[12]] if needle else [])
        records.append([*([row["model"]] if several else []), column_label(row), row["status"] or "-",
                        _count(row.get("context_tokens")), _count(row.get("scored_tokens")), *figures,
                        "★" if mark else "", row.get("message") or ""])
    headers = [*(["model"] if several else []), "column", "status", "context", "scored", *figure_headers, "front",
               "note"]
    frame = pd.DataFrame(records, columns=headers)
    return frame if frame["note"].astype(bool).any() else frame.drop(columns="note")


def _count(value) -> str:
    return "-" if value is None else str(value)


def _bytes(row: dict) -> tuple[float | None, str]:
    """The x of a row (MiB) and which bytes it is: the mean over the scored tokens, else (a Compare record) the
    peak."""
    if row.get("cache_bytes_mean") is not None:
        return row["cache_bytes_mean"] / MIB, "mean over the scored tokens"
    if row.get("cache_bytes_end") is not None:
        return row["cache_bytes_end"] / MIB, "peak (Compare record)"
    return None, ""


def plot_front(rows: list[dict], y: str) -> list[bool]:
    """Per row: on its (model, reference)'s Pareto front of (bytes, |y|) (lower is better on both; |ΔPPL| since a
    cache's perplexity below dense is noise, not gain). Rows without both are never on it."""
    marks = [False] * len(rows)
    for group in {front_group(row) for row in rows}:
        index = [i for i, row in enumerate(rows) if front_group(row) == group and _bytes(row)[0] is not None
                 and row.get(y) is not None]
        points = [(_bytes(rows[i])[0], abs(rows[i][y])) for i in index]
        for i, on in zip(index, pareto_front(points)):
            marks[i] = on
    return marks


def plot_frame(rows: list[dict], y: str = "kld_mean", roster: list[str] | None = None) -> pd.DataFrame:
    """The scatter plot's data (PLOT_FIELDS): one point per row with bytes (MiB) and figure `y`, every figure as
    the table writes it for the hover, `front` yes/no (`plot_front`); then a blank row (NaN x and y) for each
    series of `roster` (default: every row's) that has no point, so the plot's colour domain holds it."""
    names, front = series_names(rows), plot_front(rows, y)
    data = []
    for name, row, on in zip(names, rows, front):
        mib, measure = _bytes(row)
        value = row.get(y)
        if mib is None or value is None:
            continue
        text = cells({**row, "status": "ok"}, on)
        data.append((name, round(mib, 4), value, row["column"], row["model"], row["status"],
                     _count(row.get("scored_tokens")), *text[2:12], text[12], measure, "yes" if on else "no"))
    drawn = {point[0] for point in data}
    data += [(name, NAN, NAN, *[""] * (len(PLOT_FIELDS) - 3)) for name in (roster or names) if name not in drawn]
    return pd.DataFrame(data, columns=PLOT_FIELDS)


def plot_limits(frame: pd.DataFrame) -> list[float]:
    """The bytes axis: 0 to MIB_PADDING past the largest point (0 to 1 MiB when there is none)."""
    top = float(frame["cache_MiB"].max()) if frame["cache_MiB"].notna().any() else 1.0
    return [0.0, round(top * (1 + MIB_PADDING), 4) or 1.0]


def plot_caption(rows: list[dict], y: str) -> str:
    """The line under the plot: the columns on its Pareto front (Markdown; each name literal, in a code element)."""
    front = [name for name, on in zip(series_names(rows), plot_front(rows, y)) if on]
    what = "mean KL" if y == "kld_mean" else "|ΔPPL|"
    text = f"**Pareto front** (no other column holds fewer bytes with a smaller {what}): "
    return text + (", ".join(md_code(name) for name in front) if front else "none yet") + \
        ". Hover a point for every figure."
