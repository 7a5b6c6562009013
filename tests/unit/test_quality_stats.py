"""The quality report's statistics against hand-worked cases: llama.cpp's figures, Wilson, the Pareto front."""

import math
import random

import pytest
import torch

from kvlab.quality.stats import (DP_LEVELS, KLD_LEVELS, LLAMA_CPP_NAMES, MIN_TOKENS_FOR_UNCERTAINTY,
                                 QualityFigures, RunningQuality, pareto_front, quality_figures, score_tokens,
                                 wilson_interval)

pytestmark = pytest.mark.unit

N = 12
BASE = [1.0] * 6 + [3.0] * 6
"""Mean 2, population variance 1."""
SHIFT = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0] * 2
"""d = nll - nll_base: mean 0.5, population variance 0.25, uncorrelated with BASE (three 1s in each half)."""
COLUMN = [b + d for b, d in zip(BASE, SHIFT)]
KL_SHUFFLED = [i / 100 for i in (7, 2, 11, 0, 5, 9, 1, 10, 3, 6, 8, 4)]
"""0.00 .. 0.11 in a scrambled order: every linear-interpolation percentile of it is level * 0.11."""
SAME_TOP = [True] * 9 + [False] * 3


@pytest.fixture(scope="module")
def figures() -> QualityFigures:
    return quality_figures(BASE, COLUMN, KL_SHUFFLED, SAME_TOP)


def test_perplexity_statistics_follow_llama_cpp_formulas(figures):
    # population moments: var(x) = 1 + 0.25 = 1.25, var(y) = 1, cov(x, y) = 1; a squared error is var / (n - 1).
    ppl, base = math.exp(2.5), math.exp(2.0)
    assert figures.n_tokens == N
    assert figures.ppl == pytest.approx(ppl, rel=1e-14)
    assert figures.ppl_unc == pytest.approx(ppl * math.sqrt(1.25 / 11), rel=1e-12)
    assert figures.ppl_base == pytest.approx(base, rel=1e-14)
    assert figures.ppl_base_unc == pytest.approx(base * math.sqrt(1 / 11), rel=1e-12)
    assert figures.ln_ppl_correlation == pytest.approx(1 / math.sqrt(1.25), rel=1e-12)
    assert figures.ln_ppl_ratio == pytest.approx(0.5, rel=1e-14)
    assert figures.ln_ppl_ratio_unc == pytest.approx(0.5 / math.sqrt(11), rel=1e-12)
    assert figures.ppl_ratio == pytest.approx(math.exp(0.5), rel=1e-14)
    assert figures.ppl_ratio_unc == pytest.approx(math.exp(0.5) * 0.5 / math.sqrt(11), rel=1e-12)
    assert figures.ppl_diff == pytest.approx(ppl - base, rel=1e-14)
    delta_var = ppl ** 2 * 1.25 + base ** 2 * 1.0 - 2 * ppl * base * 1.0
    assert figures.ppl_diff_unc == pytest.approx(math.sqrt(delta_var / 11), rel=1e-12)


def test_a_shift_that_grows_with_the_base_nll_enters_the_covariance():
    # d = 1 exactly where nll_base = 3: x takes 1 and 4, var(x) = 2.25, var(y) = 1, cov(x, y) = 1.5, var(d) = 0.25.
    column = [b + (1.0 if b == 3.0 else 0.0) for b in BASE]
    figures = quality_figures(BASE, column, [0.0] * N, [True] * N)
    ppl, base = math.exp(2.5), math.exp(2.0)
    assert figures.ln_ppl_correlation == pytest.approx(1.0, rel=1e-12)
    assert figures.ln_ppl_ratio_unc == pytest.approx(0.5 / math.sqrt(11), rel=1e-12)
    # llama.cpp: sqrt(P^2 var(x) + B^2 var(y) - 2 P B cov(x, y)) / sqrt(n - 1) = |1.5 P - B| / sqrt(11).
    assert figures.ppl_diff_unc == pytest.approx(abs(1.5 * ppl - base) / math.sqrt(11), rel=1e-12)


def test_kl_statistics_and_llama_cpp_percentiles(figures):
    assert figures.kld_mean == pytest.approx(0.055, rel=1e-14)
    # population variance of 0, 1, ..., 11 is (12^2 - 1) / 12, here in units of 0.01^2.
    assert figures.kld_mean_unc == pytest.approx(0.01 * math.sqrt(143 / 12 / 11), rel=1e-12)
    kld = figures.kld_percentiles
    assert kld.levels == KLD_LEVELS
    assert kld.values == pytest.approx([level * 0.11 for level in KLD_LEVELS], abs=1e-15)
    assert (kld.maximum, kld.median, kld.minimum, kld[0.99]) == pytest.approx((0.11, 0.055, 0.0, 0.1089), abs=1e-15)
    assert kld.labels() == ("Maximum", "99.9%", "99.0%", "95.0%", "90.0%", "Median", "10.0%", "5.0%", "1.0%",
                            "0.1%", "Minimum")
    with pytest.raises(KeyError, match="no percentile at 0.98"):
        kld[0.98]


def test_token_probability_statistics(figures):
    low, high = math.exp(-2) - math.exp(-1), math.exp(-4) - math.exp(-3)
    dp = [low] * 3 + [0.0] * 3 + [high] * 3 + [0.0] * 3
    mean, mean2, mean4 = sum(dp) / N, sum(v * v for v in dp) / N, sum(v ** 4 for v in dp) / N
    assert figures.dp_mean == pytest.approx(mean, rel=1e-13)
    assert figures.dp_mean_unc == pytest.approx(math.sqrt((mean2 - mean ** 2) / 11), rel=1e-12)
    assert figures.dp_rms == pytest.approx(math.sqrt(mean2), rel=1e-13)
    assert figures.dp_rms_unc == pytest.approx(0.5 / math.sqrt(mean2) * math.sqrt((mean4 - mean2 ** 2) / 11),
                                               rel=1e-12)
    # sorted: low x3, high x3, 0 x6; the 25 % point sits at 2.75, the median between index 5 (high) and 6 (0).
    assert figures.dp_percentiles.levels == DP_LEVELS
    assert figures.dp_percentiles[0.25] == pytest.approx(low + 0.75 * (high - low), rel=1e-13)
    assert figures.dp_percentiles.median == pytest.approx(high / 2, rel=1e-13)
    assert (figures.dp_percentiles.maximum, figures.dp_percentiles.minimum) == (0.0, low)
    assert figures.n_same_top == 9 and figures.same_top == 0.75
    assert figures.same_top_unc == pytest.approx(math.sqrt(0.75 * 0.25 / 11), rel=1e-14)
    assert (figures.same_top_low, figures.same_top_high) == wilson_interval(9, 12)


def test_identical_columns_are_exactly_unchanged():
    rng = random.Random(3)
    nll = [rng.uniform(0.0, 8.0) for _ in range(50)]
    figures = quality_figures(nll, list(nll), [0.0] * 50, [True] * 50)
    assert figures.ppl == figures.ppl_base
    assert (figures.ppl_diff, figures.ppl_diff_unc, figures.ln_ppl_ratio, figures.ln_ppl_ratio_unc) == (0, 0, 0, 0)
    assert (figures.ppl_ratio, figures.ppl_ratio_unc, figures.ln_ppl_correlation) == (1, 0, 1)
    assert (figures.kld_mean, figures.kld_mean_unc, figures.dp_mean, figures.dp_mean_unc, figures.dp_rms,
            figures.dp_rms_unc) == (0, 0, 0, 0, 0, 0)
    assert set(figures.kld_percentiles.values) == set(figures.dp_percentiles.values) == {0.0}
    assert (figures.same_top, figures.same_top_unc, figures.same_top_high) == (1, 0, 1)


def test_one_token_gives_its_values_and_no_uncertainty():
    figures = quality_figures(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([0.25]), torch.tensor([False]))
    assert (figures.n_tokens, figures.ppl, figures.ppl_base) == (1, math.exp(2.0), math.exp(1.0))
    assert figures.ln_ppl_ratio == 1.0 and figures.ppl_diff == math.exp(2.0) - math.exp(1.0)
    assert set(figures.kld_percentiles.values) == {0.25} and figures.same_top == 0.0
    assert figures.dp_mean == math.exp(-2.0) - math.exp(-1.0)
    for name in ("ppl_unc", "ppl_base_unc", "ln_ppl_correlation", "ln_ppl_ratio_unc", "ppl_ratio_unc",
                 "ppl_diff_unc", "kld_mean_unc", "dp_mean_unc", "dp_rms_unc", "same_top_unc"):
        assert math.isnan(getattr(figures, name)), name
    # Wilson at k = 0 of n = 1: high = z^2 / (n + z^2).
    assert (figures.same_top_low, figures.same_top_high) == pytest.approx((0.0, 1.96 ** 2 / (1 + 1.96 ** 2)))


def test_uncertainties_start_at_llama_cpps_token_count():
    below = MIN_TOKENS_FOR_UNCERTAINTY - 1
    assert math.isnan(quality_figures(BASE[:below], COLUMN[:below], [0.1] * below, [True] * below).ppl_unc)
    at = MIN_TOKENS_FOR_UNCERTAINTY
    assert quality_figures(BASE[:at], COLUMN[:at], [0.1] * at, [True] * at).ppl_unc > 0


def test_streaming_equals_the_batch_path_float_for_float():
    rng = random.Random(7)
    base = [rng.expovariate(0.4) for _ in range(40)]
    column = [b + rng.gauss(0.05, 0.3) for b in base]
    kl = [rng.expovariate(20.0) for _ in range(40)]
    same = [rng.random() < 0.8 for _ in range(40)]
    batch = quality_figures(torch.tensor(base, dtype=torch.float64), column, kl, torch.tensor(same))
    running = RunningQuality()
    for i, token in enumerate(zip(base, column, kl, same)):
        running.add(*token)
        if i in (0, 20, 39):
            running.figures()
    assert running.figures() == batch
    chunked = RunningQuality()
    for start, stop in ((0, 13), (13, 14), (14, 40)):
        chunked.extend(base[start:stop], column[start:stop], kl[start:stop], same[start:stop])
    assert chunked.figures() == batch


@pytest.mark.parametrize("field, at", [("nll_base", 3), ("nll", 0), ("kl", 5)])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_scores_are_refused_by_name(field, at, bad):
    scores = {"nll_base": [1.0] * 6, "nll": [1.5] * 6, "kl": [0.1] * 6, "same_top": [True] * 6}
    scores[field][at] = bad
    with pytest.raises(ValueError, match=f"{field} at token {at} is {bad}"):
        quality_figures(scores["nll_base"], scores["nll"], scores["kl"], scores["same_top"])


def test_bad_inputs_are_refused():
    running = RunningQuality()
    with pytest.raises(ValueError, match="no tokens scored yet"):
        running.figures()
    with pytest.raises(ValueError, match="same_top at token 0 is 2"):
        running.add(1.0, 1.0, 0.0, 2)
    assert running.n_tokens == 0
    with pytest.raises(ValueError, match=r"equally long; got lengths \[2, 2, 1, 2\]"):
        quality_figures([1.0, 1.0], [1.0, 1.0], [0.0], [True, True])
    with pytest.raises(ValueError, match="at least one token"):
        quality_figures([], [], [], [])


def test_llama_cpp_names_cover_every_headline_field():
    fields = set(QualityFigures.__dataclass_fields__)
    assert set(LLAMA_CPP_NAMES) <= fields
    assert {name for name in fields if not name.endswith("_unc")} - set(LLAMA_CPP_NAMES) == {
        "n_tokens", "n_same_top", "same_top_low", "same_top_high"}


@pytest.mark.parametrize("k, n, low, high", [
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_matches_newcombe_1998_table(k, n, low, high):
    """Newcombe (1998), Statistics in Medicine 17: 857-872: its worked examples, method 3 (score interval)."""
    assert wilson_interval(k, n) == pytest.approx((low, high), abs=5e-5)


def test_wilson_closed_forms_at_the_ends_and_the_middle():
    z2 = 1.96 ** 2
    assert wilson_interval(0, 10) == (0.0, pytest.approx(z2 / (10 + z2), rel=1e-14))
    assert wilson_interval(10, 10) == (pytest.approx(10 / (10 + z2), rel=1e-14), 1.0)
    # k = n / 2: centred on 0.5 with half-width z sqrt(1/(4n) + z^2/(4n^2)) / (1 + z^2/n).
    half = 1.96 * math.sqrt(1 / 40 + z2 / 400) / (1 + z2 / 10)
    assert wilson_interval(5, 10) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-14)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)
    assert wilson_interval(5, 10, z=2.576)[0] < wilson_interval(5, 10)[0]
    with pytest.raises(TypeError):
        wilson_interval(0.5, 2)


@pytest.mark.parametrize("k, n, z", [(1, 0, 1.96), (-1, 5, 1.96), (6, 5, 1.96), (1, 5, 0.0), (1, 5, math.nan)])
def test_wilson_refuses_impossible_counts(k, n, z):
    with pytest.raises(ValueError, match="wilson_interval needs"):
        wilson_interval(k, n, z)


def test_pareto_front_keeps_the_lower_left_points():
    assert pareto_front([]) == []
    assert pareto_front([(5, 0.3)]) == [True]
    assert pareto_front([(10, 0.0), (5, 0.1), (5, 0.2), (1, 0.5), (8, 0.5), (20, 0.0)]) == [
        True, True, False, True, False, False]


def test_pareto_front_ties():
    # equal points are both on the front; equal bytes: only the lowest loss; equal loss: only the fewest bytes.
    assert pareto_front([(4, 0.2), (4, 0.2), (9, 0.1)]) == [True, True, True]
    assert pareto_front([(4, 0.2), (4, 0.3), (4, 0.2)]) == [True, False, True]
    assert pareto_front([(6, 0.2), (4, 0.2), (2, 0.9)]) == [False, True, True]
    assert pareto_front([(1, math.inf), (2, 0.5), (3, -math.inf)]) == [True, True, True]


def test_pareto_front_refuses_nan_and_odd_points():
    with pytest.raises(ValueError, match="point 1 is"):
        pareto_front([(1, 0.1), (math.nan, 0.2)])
    with pytest.raises(ValueError, match="point 0 is"):
        pareto_front([(1, 0.1, 3)])


def test_score_tokens_by_hand():
    # base: uniform over 2 tokens; column: p = (3/4, 1/4); a third token the base never predicts adds no KL.
    base = torch.tensor([[0.0, 0.0, -math.inf], [0.0, 0.0, -math.inf]])
    column = torch.tensor([[math.log(3.0), 0.0, -math.inf], [0.0, math.log(3.0), 0.0]])
    scores = score_tokens(base, column, torch.tensor([0, 0]))
    assert scores.nll_base.tolist() == pytest.approx([math.log(2.0)] * 2, rel=1e-6)
    assert scores.nll.tolist() == pytest.approx([-math.log(0.75), math.log(5.0)], rel=1e-6)
    kl_second = 0.5 * math.log(0.5 / 0.2) + 0.5 * math.log(0.5 / 0.6)
    assert scores.kl.tolist() == pytest.approx([0.5 * math.log(4 / 3), kl_second], rel=1e-6)
    assert scores.same_top.tolist() == [True, False]
    assert scores.kl.dtype == torch.float64 and quality_figures(*scores).n_same_top == 1
    with pytest.raises(ValueError, match="score_tokens needs"):
        score_tokens(base, column[:1], torch.tensor([0, 0]))
