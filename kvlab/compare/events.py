"""Compare's own step events, streamed between the run protocol's (`kvlab.protocol`), and the per-column result
they build.

Every consumer (the browser adapter, the CLI, the benchmark) reads these; none
of them reads runner internals. Times are seconds, sizes are bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..measure.record import ColumnTiming
from ..protocol import ColumnFailed, RunDone, RunStarted


@dataclass
class ColumnResult:
    """Everything measured for one column; `to_json()` gives the CLI's JSON record.

    Times in seconds, sizes in bytes. ttft_s: prefill forward + first token choice.
    per_token_s: every step's forward + choice (the first is the TTFT). decode_tok_s:
    decode steps over their summed time. Serving-style latency, named as vLLM's and
    GuideLLM's benchmarks name it: inter-token latency (ITL, each decode step after
    the first token; in fair mode a step's own compute, not its wait for other
    columns) as `itl_ms_mean` and percentiles `itl_ms_p50`/`_p90`/`_p99` in
    milliseconds, and `e2e_latency_s` = TTFT + every decode step. cache_bytes:
    exact cache bytes after each step; predicted_cache_bytes: the dense formula for
    the tokens held. cache_bytes_by_layer_type and
    predicted_cache_bytes_by_layer_type: the same per layer type (`full_attention`, `sliding_attention`, ...),
    one list per type with one value per step (a sliding layer is predicted to hold at most its window).
    keeps: what the cache keeps on this model, when it has sliding layers; keeps_everything: whether it
    holds every token on every layer of this model.
    budget_bytes: the column's cache budget (None: none).
    fallbacks: each switch to a smaller cache (`kvlab.budget.Fallback.to_json`:
    at_token, from, to, reason, bytes_before, bytes_after, to_spec).

    timing: how the timing figures above (ttft_s, decode_tok_s, itl_ms_*, e2e_latency_s) were taken
    (`kvlab.measure.ColumnTiming`: the policy, each figure's relative noise, the warm-up seconds, and the live
    figures when the policy replaced them). `per_token_s` is always the live run's steps (what the plots drew).

    warning: a one-line warning about the column's settings on this prompt (`Strategy.warning_on`), '' none.

    engine: an engine column's own figures (`kvlab.engines.EngineRun.figures`: the engine, its settings, a
    server's `/metrics` readings); {} for a strategy's column.

    status: `ok` (finished or stopped), `error` (bad settings or a failure while
    running) or `unavailable` (cannot run here; `message` says why).

    wer: a speech column's word error rate against its clip's text (a fraction; None for a text column,
    `kvlab.speech`).

    fidelity_status: whether the teacher-forced figures (top1_agreement, mean_kl over fidelity_tokens) were
    filled: `scored`, `not scored: <why>` (fidelity off, stopped, no baseline, a failure) or '' (a column that did
    not finish, or a record that predates the field). `agreement` and `first_divergence` need no model work and
    are filled with the summary.
    """

    index: int
    name: str
    strategy: str
    knobs: dict
    status: str = "pending"
    message: str = ""
    lossy: bool = False
    caveat: str = ""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    use_cache: bool = True
    ttft_s: float | None = None
    per_token_s: list[float] = field(default_factory=list)
    decode_tok_s: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2e_latency_s: float | None = None
    cache_bytes: list[int] = field(default_factory=list)
    predicted_cache_bytes: list[int] = field(default_factory=list)
    cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    predicted_cache_bytes_by_layer_type: dict[str, list[int]] = field(default_factory=dict)
    cache_bytes_by_device: dict[str, int] = field(default_factory=dict)
    keeps: str = ""
    warning: str = ""
    keeps_everything: bool = False
    peak_cache_bytes: int = 0
    stopped: bool = False
    agreement: float | None = None
    first_divergence: int | None = None
    top1_agreement: float | None = None
    mean_kl: float | None = None
    fidelity_tokens: int = 0
    fidelity_status: str = ""
    is_baseline: bool = False
    budget_bytes: int | None = None
    wer: float | None = None
    fallbacks: list[dict] = field(default_factory=list)
    timing: ColumnTiming = field(default_factory=ColumnTiming)
    engine: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The JSON record: every field, plus `prefill_s` (the same value as `ttft_s`, kept for records read by
        older tools) and `predicted_cache_bytes_final`."""
        record = asdict(self)
        record["prefill_s"] = self.ttft_s
        record["predicted_cache_bytes_final"] = self.predicted_cache_bytes[-1] if self.predicted_cache_bytes else 0
        return record

    def finish_decode_stats(self) -> None:
        """Fill `decode_tok_s`, the ITL figures and `e2e_latency_s` from the per-token latencies (the first token
        is prefill), and `peak_cache_bytes`."""
        self.fill_timing(self.per_token_s)
        self.peak_cache_bytes = max(self.cache_bytes, default=0)

    def fill_timing(self, per_token_s: list[float]) -> None:
        """decode tok/s, the ITL figures and e2e latency from `per_token_s` (seconds per step, the first the
        prefill)."""
        decode = per_token_s[1:]
        total = sum(decode)
        self.decode_tok_s = len(decode) / total if decode and total > 0 else None
        itl = latency_summary_ms(decode)
        self.itl_ms_mean, self.itl_ms_p50, self.itl_ms_p90, self.itl_ms_p99 = (
            itl.get(key) for key in ("mean", "p50", "p90", "p99"))
        self.e2e_latency_s = sum(per_token_s) if per_token_s else None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary_ms(latencies_s: list[float]) -> dict[str, float]:
    """{mean, p50, p90, p99} of latencies given in seconds, in milliseconds; {} for none."""
    if not latencies_s:
        return {}
    ms = [1000 * value for value in latencies_s]
    return {"mean": sum(ms) / len(ms), **{f"p{q}": percentile(ms, q) for q in (50, 90, 99)}}


@dataclass(frozen=True)
class ColumnStarted:
    """A column began. keeps: what its cache keeps on this model ('' when the model has no sliding layers).
    note: what is known before its first token, e.g. fallback-chain members that cannot run on this model."""

    column: int
    name: str
    prompt_tokens: int
    keeps: str = ""
    note: str = ""


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: its id and the text it added (may be '' mid-character)."""

    column: int
    step: int
    token_id: int
    text: str


@dataclass(frozen=True)
class StepMetrics:
    """Measured right after step `step` (0 = prefill + first token).

    per_token_s: this step's forward + token choice, seconds (its turn only, in fair mode).
    cache_bytes: exact bytes the cache holds now (None for an engine column that reports none: a server);
    predicted_cache_bytes: the dense
    formula for the tokens it holds; seen_tokens: prompt + generated so far;
    cache_bytes_by_layer_type / predicted_cache_bytes_by_layer_type: both per layer type.
    """

    column: int
    step: int
    per_token_s: float
    cache_bytes: int | None
    predicted_cache_bytes: int
    seen_tokens: int
    cache_bytes_by_layer_type: dict[str, int] = field(default_factory=dict)
    predicted_cache_bytes_by_layer_type: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FallbackSwitched:
    """The column moved to a smaller cache before step `fallback["at_token"]` (a `kvlab.budget.Fallback` as
    JSON: at_token, from, to, reason, bytes_before, bytes_after in bytes)."""

    column: int
    fallback: dict


@dataclass(frozen=True)
class MemorySample:
    """Process memory sampled during the run: RSS (bytes), CUDA allocated and peak (bytes, 0 without CUDA)."""

    elapsed_s: float
    rss_bytes: int
    cuda_allocated_bytes: int
    cuda_peak_bytes: int


@dataclass(frozen=True)
class ColumnDone:
    """Column `column` finished (or was stopped): its result. A column that cannot run or fails sends the run
    protocol's `ColumnFailed` instead (its `result` a `ColumnResult` too)."""

    column: int
    result: ColumnResult


@dataclass(frozen=True)
class SummaryReady:
    """Every column finished (and the timing policy's own pass ran): the summary can be shown now, before the
    teacher-forced fidelity pass. results: every column's result (text agreement and first divergence filled;
    top-1 agreement and KL follow in `FidelityScored` events); wall_s: seconds from the run's start; timing: as
    the record's `timing`; to_score: how many columns the fidelity pass will score (0: none)."""

    results: list[ColumnResult]
    wall_s: float
    timing: dict = field(default_factory=dict)
    to_score: int = 0


@dataclass(frozen=True)
class FidelityScored:
    """Column `column`'s teacher-forced fidelity was scored (or failed: its `fidelity_status` says so);
    scored: columns scored so far in this pass, of `to_score`."""

    column: int
    result: ColumnResult
    scored: int = 0
    to_score: int = 0


@dataclass(frozen=True)
class RunPhase:
    """The run moved on to `phase`: `warm_up` (one-time set-up of the columns' backends, before any column's
    clock) or another phase of its timing policy (`kvlab.measure`; the page pauses its updates).
    detail: one line for the status (e.g. what is being warmed)."""

    phase: str
    detail: str = ""


Event = (RunStarted | ColumnStarted | TokenEvent | StepMetrics | FallbackSwitched | MemorySample | ColumnDone
         | ColumnFailed | SummaryReady | FidelityScored | RunPhase | RunDone)
"""A Compare run's events: the run protocol's (`kvlab.protocol`: `RunStarted`, `ColumnFailed`, `RunDone`, whose
record is `kvlab.compare.summary.run_record`'s: its `timing` says how the figures were taken, its `fidelity`
how far the fidelity pass got, its `summary_s` when the summary was ready) and Compare's own."""
