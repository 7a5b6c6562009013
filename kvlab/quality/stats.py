"""The statistics of the quality report: how far a cache column's predictions are from the dense (base) run.

Every figure is the one llama.cpp's `llama-perplexity --kl-divergence` prints against its base run, computed
as llama.cpp computes it (`tools/perplexity/perplexity.cpp`, function `kl_divergence`, with its lambdas
`mean_and_uncertainty`, `covariance` and `percentile`, over the per-token sums of `kl_divergence_result` that
its `log_softmax(n_vocab, logits, base_log_prob, tok, kld)` fills): Mean PPL(Q) and PPL(base), their
correlation, ln(PPL(Q)/PPL(base)), PPL(Q)/PPL(base) and PPL(Q)-PPL(base), each with its standard error; the
mean KL divergence and its percentiles; Δp, the change in the probability of the correct token; "same top p",
the top-1 agreement, with llama.cpp's standard error and a Wilson 95 % score interval besides.

Per token the inputs are, in nats: `nll_base` = -ln p_base(target), `nll` = -ln p_Q(target),
`kl` = KL(base || Q) = sum_v p_base(v) (ln p_base(v) - ln p_Q(v)), and `same_top` = argmax p_Q == argmax p_base
(`score_tokens` computes them from two logit tables). Δp = exp(-nll) - exp(-nll_base) follows from the NLLs.

Like llama.cpp's, the standard errors treat tokens as independent draws; neighbouring tokens of one text
are correlated, so the true uncertainty of a single text's figures is somewhat larger.

Where kvlab departs from llama.cpp, on purpose:
- a standard error needs MIN_TOKENS_FOR_UNCERTAINTY tokens (llama.cpp's `count > 10`); below that it is NaN,
  "not estimated" (llama.cpp prints 0, and prints its final block only from 100 tokens on);
- everything is float64 (llama.cpp keeps per-token NLLs and percentile fractions in float32, sums in double);
- the standard errors of ln(PPL(Q)/PPL(base)) and PPL(Q)-PPL(base) come from the per-token differences
  nll - nll_base, an algebraically equal form of llama.cpp's var(Q) + var(base) - 2 cov that does not subtract
  two nearly equal numbers: identical columns give exactly 0;
- the RMS Δp's standard error is 0 when every Δp is 0 (llama.cpp's 0.5 / RMS * σ is 0/0 there);
- `score_tokens` sums the KL over the whole vocabulary; llama.cpp stores the base log-probs in 16 bits over
  the top 16 nats and skips tokens below -16 nats.

`RunningQuality` takes the tokens one by one (so a report can show its figures while it runs) and
`quality_figures` is the same accumulator fed a whole column: both give the same floats. `wilson_interval`
(a hit rate k/n, e.g. the Needle grid's recall) and `pareto_front` (bytes against a quality loss) serve the
report's tables. Pure: no model, no gradio, no plotting.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

MIN_TOKENS_FOR_UNCERTAINTY = 11
"""llama.cpp's `mean_and_uncertainty` gives a standard error only for `count > 10`."""
WILSON_Z_95 = 1.96
"""The normal quantile of a two-sided 95 % interval, as Newcombe (1998) uses it."""
KLD_LEVELS = (1.0, 0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001, 0.0)
"""The KL-divergence percentiles llama.cpp prints, in its order (1.0 = Maximum, 0.5 = Median, 0.0 = Minimum)."""
DP_LEVELS = (1.0, 0.999, 0.99, 0.95, 0.90, 0.75, 0.5, 0.25, 0.10, 0.05, 0.01, 0.001, 0.0)
"""The Δp percentiles llama.cpp prints, in its order."""
NAN = float("nan")


class TokenScores(NamedTuple):
    """One column's per-token scores against the base run: four aligned 1-D sequences of T tokens.

    `nll_base`, `nll`: negative log-likelihood of the target token under the base and the column (nats);
    `kl`: KL(base || column) of the next-token distributions (nats); `same_top`: the two argmaxes agree (bool).
    `quality_figures(*scores)` and `RunningQuality.extend(*scores)` take one as it is.
    """

    nll_base: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    same_top: torch.Tensor


@dataclass(frozen=True)
class Percentiles:
    """Percentiles of one per-token quantity: `values[i]` at fraction `levels[i]` (descending, 1.0 first).

    Computed as llama.cpp's `percentile` lambda (linear interpolation between the sorted values at
    fraction * (n - 1)), the median as its `kld_median` (the mean of the two middle values for an even n).
    """

    levels: tuple[float, ...]
    values: tuple[float, ...]

    def __getitem__(self, level: float) -> float:
        """The value at `level` (one of `levels`, e.g. 0.99). Raises KeyError for another level."""
        if level not in self.levels:
            raise KeyError(f"no percentile at {level}; have {self.levels}")
        return self.values[self.levels.index(level)]

    @property
    def maximum(self) -> float:
        return self[1.0]

    @property
    def median(self) -> float:
        return self[0.5]

    @property
    def minimum(self) -> float:
        return self[0.0]

    def labels(self) -> tuple[str, ...]:
        """llama.cpp's row names: "Maximum", "99.9%", ..., "Median", ..., "0.1%", "Minimum"."""
        names = {1.0: "Maximum", 0.5: "Median", 0.0: "Minimum"}
        return tuple(names.get(level, f"{100 * level:.1f}%") for level in self.levels)


@dataclass(frozen=True)
class QualityFigures:
    """Every figure of llama.cpp's `--kl-divergence` summary for one column; `*_unc` is a standard error.

    Fractions are plain numbers here where llama.cpp prints percent (correlation, Δp, same top p). A standard
    error is NaN below MIN_TOKENS_FOR_UNCERTAINTY tokens; `ln_ppl_correlation` is NaN there too, or when
    either column's NLL has no spread. `LLAMA_CPP_NAMES` maps each field to llama.cpp's printed name.
    """

    n_tokens: int
    ppl: float
    """Mean PPL(Q) = exp(mean nll); its error is ppl times the standard error of the mean nll."""
    ppl_unc: float
    ppl_base: float
    """Mean PPL(base) = exp(mean nll_base)."""
    ppl_base_unc: float
    ln_ppl_correlation: float
    """Cor(ln(PPL(Q)), ln(PPL(base))): Pearson's r of the per-token nll and nll_base (a fraction)."""
    ln_ppl_ratio: float
    """Mean ln(PPL(Q)/PPL(base)) = mean nll - mean nll_base (nats per token)."""
    ln_ppl_ratio_unc: float
    ppl_ratio: float
    """Mean PPL(Q)/PPL(base) = exp(ln_ppl_ratio); error ppl_ratio * ln_ppl_ratio_unc."""
    ppl_ratio_unc: float
    ppl_diff: float
    """Mean PPL(Q)-PPL(base) (ΔPPL), with the covariance of the two NLLs in its error."""
    ppl_diff_unc: float
    kld_mean: float
    """Mean KLD (nats per token)."""
    kld_mean_unc: float
    kld_percentiles: Percentiles
    """At KLD_LEVELS (nats)."""
    dp_mean: float
    """Mean Δp: p_Q(target) - p_base(target), a probability difference."""
    dp_mean_unc: float
    dp_percentiles: Percentiles
    """At DP_LEVELS."""
    dp_rms: float
    """RMS Δp = sqrt(mean Δp^2); error 0.5 / RMS * the standard error of mean Δp^2."""
    dp_rms_unc: float
    n_same_top: int
    """Tokens whose argmax agrees with the base run's."""
    same_top: float
    """Same top p = n_same_top / n_tokens; error sqrt(p (1 - p) / (n - 1)), NaN for one token."""
    same_top_unc: float
    same_top_low: float
    """Wilson 95 % score interval of same_top (`wilson_interval`)."""
    same_top_high: float


LLAMA_CPP_NAMES = {
    "ppl": "Mean PPL(Q)", "ppl_base": "Mean PPL(base)", "ln_ppl_correlation": "Cor(ln(PPL(Q)), ln(PPL(base)))",
    "ln_ppl_ratio": "Mean ln(PPL(Q)/PPL(base))", "ppl_ratio": "Mean PPL(Q)/PPL(base)",
    "ppl_diff": "Mean PPL(Q)-PPL(base)", "kld_mean": "Mean    KLD", "kld_percentiles": "KLD",
    "dp_mean": "Mean    Δp", "dp_percentiles": "Δp", "dp_rms": "RMS Δp", "same_top": "Same top p",
}
"""QualityFigures field -> the name llama.cpp prints it under (a field's `_unc` is its "±")."""


def wilson_interval(k: int, n: int, z: float = WILSON_Z_95) -> tuple[float, float]:
    """Wilson score interval (low, high) of a proportion k/n, e.g. a recall over cells x seeds.

    Wilson, E. B. (1927), "Probable inference, the law of succession, and statistical inference", JASA 22;
    method 3 of Newcombe, R. G. (1998), Statistics in Medicine 17: 857-872. Unlike the normal approximation it
    stays inside [0, 1] and is not empty at k = 0 or k = n (there the low / high end is exactly 0 / 1).

    Raises:
        ValueError: n < 1, k outside 0..n, a non-integer k or n, or z not a finite positive number.
    """
    k, n = operator.index(k), operator.index(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval needs 0 <= k <= n and n >= 1; got k={k}, n={n}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"wilson_interval needs a finite z > 0; got {z}")
    p, z2 = k / n, z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    low = 0.0 if k == 0 else max(0.0, center - half)
    high = 1.0 if k == n else min(1.0, center + half)
    return low, high


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (bytes, quality loss) points, where lower is better on both: True for each point on the front.

    A point is on the front when no other point has bytes <= and loss <= with one of them strictly smaller.
    Ties: equal points are all on the front (neither beats the other); of points with equal bytes only those
    with the lowest loss can be, and of points with equal loss only those with the fewest bytes. ±inf are
    ordinary values. Order as given; O(n log n).

    Raises:
        ValueError: a point that is not a pair, or holds NaN.
    """
    pairs = [tuple(float(v) for v in point) for point in points]
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or any(math.isnan(v) for v in pair):
            raise ValueError(f"pareto_front: point {i} is {points[i]!r}; each point is (bytes, loss), no NaN")
    order = sorted(range(len(pairs)), key=lambda i: pairs[i])
    front, best_before = [False] * len(pairs), None
    start = 0
    while start < len(order):
        stop, size = start, pairs[order[start]][0]
        while stop < len(order) and pairs[order[stop]][0] == size:
            stop += 1
        group_best = pairs[order[start]][1]
        if best_before is None or group_best < best_before:
            for i in order[start:stop]:
                front[i] = pairs[i][1] == group_best
            best_before = group_best
        start = stop
    return front


def _percentile(ordered: list[float], fraction: float) -> float:
    """llama.cpp's `percentile` lambda on sorted values: linear interpolation at fraction * (n - 1)."""
    if fraction <= 0:
        return ordered[0]
    if fraction >= 1:
        return ordered[-1]
    position = fraction * (len(ordered) - 1)
    below = int(position)
    weight = position - below
    return (1 - weight) * ordered[below] + weight * ordered[min(below + 1, len(ordered) - 1)]


def _median(ordered: list[float]) -> float:
    """llama.cpp's `kld_median`: the middle value, or the mean of the two middle ones."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2] + ordered[n // 2 - 1])


def _percentiles(ordered: list[float], levels: tuple[float, ...]) -> Percentiles:
    return Percentiles(levels, tuple(_median(ordered) if level == 0.5 else _percentile(ordered, level)
                                     for level in levels))


def _finite(name: str, value, index: int) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} at token {index} is {number}: every score must be a finite number")
    return number


def _flag(value, index: int) -> bool:
    if value not in (0, 1):
        raise ValueError(f"same_top at token {index} is {value!r}: it must be a bool (or 0 / 1)")
    return bool(value)


class RunningQuality:
    """QualityFigures that stream in: `add` one token's scores, read `figures()` at any time.

    Keeps llama.cpp's running sums (`kl_divergence_result`: sums of nll, nll^2, nll_base, ..., in token order,
    float64) plus the sums of the difference d = nll - nll_base, and the KL and Δp values sorted for the
    percentiles: `add` is O(T) at worst (a sorted insert), `figures()` O(1) plus building the percentiles.
    """

    def __init__(self):
        self.n_tokens = 0
        self.n_same_top = 0
        self.sums = dict.fromkeys(("nll", "nll2", "base", "base2", "nll_base", "d", "d2", "d_base",
                                   "kl", "kl2", "dp", "dp2", "dp4"), 0.0)
        self.kl_sorted: list[float] = []
        self.dp_sorted: list[float] = []

    def add(self, nll_base: float, nll: float, kl: float, same_top: bool) -> None:
        """One token's scores (nats; `same_top` a bool). Raises ValueError on NaN / inf, naming the input
        and the token's index; the accumulator is then unchanged."""
        index = self.n_tokens
        base, col = _finite("nll_base", nll_base, index), _finite("nll", nll, index)
        kl, same = _finite("kl", kl, index), _flag(same_top, index)
        d, dp = col - base, math.exp(-col) - math.exp(-base)
        s = self.sums
        s["nll"] += col
        s["nll2"] += col * col
        s["base"] += base
        s["base2"] += base * base
        s["nll_base"] += col * base
        s["d"] += d
        s["d2"] += d * d
        s["d_base"] += d * base
        s["kl"] += kl
        s["kl2"] += kl * kl
        s["dp"] += dp
        s["dp2"] += dp * dp
        s["dp4"] += dp * dp * dp * dp
        self.n_same_top += same
        self.n_tokens += 1
        bisect.insort(self.kl_sorted, kl)
        bisect.insort(self.dp_sorted, dp)

    def extend(self, nll_base, nll, kl, same_top) -> None:
        """Many tokens at once: four aligned 1-D sequences (lists, tensors or arrays), added in order.

        Raises:
            ValueError: sequences of different lengths (nothing is added), or a NaN / inf value (the tokens
                before it are added).
        """
        columns = [_values(values) for values in (nll_base, nll, kl, same_top)]
        lengths = [len(values) for values in columns]
        if len(set(lengths)) != 1:
            raise ValueError(f"nll_base, nll, kl and same_top must be equally long; got lengths {lengths}")
        for token in zip(*columns):
            self.add(*token)

    def figures(self) -> QualityFigures:
        """The figures over every token added so far. Raises ValueError before the first token."""
        n = self.n_tokens
        if n == 0:
            raise ValueError("no tokens scored yet: quality figures need at least one token")
        s = self.sums
        same_top = self.n_same_top / n
        low, high = wilson_interval(self.n_same_top, n)
        dp_rms, dp_rms_unc = self._rms_dp()
        return QualityFigures(
            n_tokens=n, **self._perplexity_figures(),
            kld_mean=s["kl"] / n, kld_mean_unc=_standard_error(s["kl"], s["kl2"], n),
            kld_percentiles=_percentiles(self.kl_sorted, KLD_LEVELS),
            dp_mean=s["dp"] / n, dp_mean_unc=_standard_error(s["dp"], s["dp2"], n),
            dp_percentiles=_percentiles(self.dp_sorted, DP_LEVELS), dp_rms=dp_rms, dp_rms_unc=dp_rms_unc,
            n_same_top=self.n_same_top, same_top=same_top,
            same_top_unc=math.sqrt(same_top * (1 - same_top) / (n - 1)) if n > 1 else NAN,
            same_top_low=low, same_top_high=high)

    def _perplexity_figures(self) -> dict[str, float]:
        """llama.cpp's "Perplexity statistics" block. x = nll, y = nll_base, d = x - y; population moments over
        n - 1 give the squared standard errors: var(mean x - mean y) = pvar(d) / (n - 1), and the delta method
        var(e^mx - e^my) = pvar(P x - B y) / (n - 1) with P x - B y = P d + (P - B) y."""
        s, n = self.sums, self.n_tokens
        mean_x, mean_y, mean_d = s["nll"] / n, s["base"] / n, s["d"] / n
        var_x, var_y = _population_variance(s["nll"], s["nll2"], n), _population_variance(s["base"], s["base2"], n)
        var_d = _population_variance(s["d"], s["d2"], n)
        cov_xy, cov_dy = s["nll_base"] / n - mean_x * mean_y, s["d_base"] / n - mean_d * mean_y
        ppl, ppl_base = math.exp(mean_x), math.exp(mean_y)
        ln_ratio = mean_x - mean_y
        enough = n >= MIN_TOKENS_FOR_UNCERTAINTY
        ln_ratio_unc = math.sqrt(var_d / (n - 1)) if enough else NAN
        diff_var = ppl * ppl * var_d + (ppl - ppl_base) ** 2 * var_y + 2 * ppl * (ppl - ppl_base) * cov_dy
        correlated = enough and var_x > 0 and var_y > 0
        return dict(
            ppl=ppl, ppl_unc=ppl * _standard_error(s["nll"], s["nll2"], n),
            ppl_base=ppl_base, ppl_base_unc=ppl_base * _standard_error(s["base"], s["base2"], n),
            ln_ppl_correlation=cov_xy / math.sqrt(var_x * var_y) if correlated else NAN,
            ln_ppl_ratio=ln_ratio, ln_ppl_ratio_unc=ln_ratio_unc,
            ppl_ratio=math.exp(ln_ratio), ppl_ratio_unc=math.exp(ln_ratio) * ln_ratio_unc,
            ppl_diff=ppl - ppl_base, ppl_diff_unc=math.sqrt(max(0.0, diff_var) / (n - 1)) if enough else NAN)

    def _rms_dp(self) -> tuple[float, float]:
        """RMS Δp and its error, llama.cpp's `p_diff_rms_val` and `p_diff_rms_unc` (0 when every Δp is 0)."""
        s, n = self.sums, self.n_tokens
        rms, mse_unc = math.sqrt(s["dp2"] / n), _standard_error(s["dp2"], s["dp4"], n)
        if math.isnan(mse_unc):
            return rms, NAN
        return rms, 0.5 / rms * mse_unc if rms > 0 else 0.0


def _population_variance(total: float, total2: float, n: int) -> float:
    """sum2 / n - mean^2, as llama.cpp's `mean_and_uncertainty` and `covariance` form it; never below 0."""
    mean = total / n
    return max(0.0, total2 / n - mean * mean)


def _standard_error(total: float, total2: float, n: int) -> float:
    """llama.cpp's `mean_and_uncertainty` error: sqrt((sum2/n - mean^2) / (n - 1)), NaN below
    MIN_TOKENS_FOR_UNCERTAINTY tokens (llama.cpp: 0)."""
    if n < MIN_TOKENS_FOR_UNCERTAINTY:
        return NAN
    return math.sqrt(_population_variance(total, total2, n) / (n - 1))


def _values(values) -> list:
    """A 1-D sequence (list, tensor, array) as a flat list of Python numbers."""
    if isinstance(values, torch.Tensor):
        return values.detach().reshape(-1).tolist()
    return list(values.reshape(-1).tolist() if hasattr(values, "reshape") else values)


def quality_figures(base_nll, col_nll, kl, same_top) -> QualityFigures:
    """The figures of one column over T tokens: four aligned 1-D sequences, as `RunningQuality.extend` takes.

    Equal, float for float, to adding the tokens one by one to a `RunningQuality`.

    Raises:
        ValueError: no tokens, sequences of different lengths, a NaN / inf score (named, with its token), or
            a same_top value that is not a bool / 0 / 1.
    """
    running = RunningQuality()
    running.extend(base_nll, col_nll, kl, same_top)
    return running.figures()


def score_tokens(base_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> TokenScores:
    """Per-token scores of a column against the base run, as llama.cpp's `log_softmax(..., kld)` forms them.

    Args:
        base_logits, logits: (T, vocab) next-token logits (or log-probs) of the base run and the column at the
            same T positions, teacher-forced on the same tokens.
        targets: (T,) the token that came next at each position.

    Returns:
        TokenScores of float64 / bool tensors of shape (T,): NLLs and KL(base || column) in nats (the KL
        summed over the whole vocabulary; a base probability of 0 adds nothing), same_top from the first
        argmax of each row.

    Raises:
        ValueError: shapes that do not match (T, vocab), (T, vocab), (T,).
    """
    if base_logits.dim() != 2 or logits.shape != base_logits.shape or targets.shape != base_logits.shape[:1]:
        raise ValueError(f"score_tokens needs (T, vocab), (T, vocab), (T,); got {tuple(base_logits.shape)}, "
                         f"{tuple(logits.shape)}, {tuple(targets.shape)}")
    base_lp = torch.log_softmax(base_logits.float(), -1)
    col_lp = torch.log_softmax(logits.float(), -1)
    index = targets.long().unsqueeze(-1)
    base_p = base_lp.exp()
    terms = torch.where(base_p > 0, base_p * (base_lp - col_lp), torch.zeros_like(base_p))
    return TokenScores(nll_base=-base_lp.gather(-1, index).squeeze(-1).double(),
                       nll=-col_lp.gather(-1, index).squeeze(-1).double(),
                       kl=terms.sum(-1, dtype=torch.float64),
                       same_top=logits.argmax(-1) == base_logits.argmax(-1))

