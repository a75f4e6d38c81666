"""Tests of dpverify.stats.bounds: golden values, a plain reference implementation, properties, soundness."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpverify.stats.bounds import (
    clopper_pearson_epsilon,
    epsilon_lower_bound,
    fdp_epsilon_lower_bound,
    optimal_epsilon,
    required_canaries,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "optimal_epsilon.json").read_text())
DELTA = 1e-5
# Rate at which the null-data tests below may fail although the bound is correct.
TEST_ERROR = 1e-4


# -- a reference written straight from Theorem 1 ------------------------------------------------------


def reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """β + 2mδα with α = max_{1<=i<=v} P[v > W >= v-i] / i, summing the window one term at a time.

    The window sums are accumulated in log space, so that a window far right of the mode, whose
    first terms underflow, still counts the mass near the mode.
    """
    q = math.exp(eps) / (1 + math.exp(eps))
    beta = stats.binom.sf(v - 1, r, q)
    log_sums = np.logaddexp.accumulate(stats.binom.logpmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.exp(np.max(log_sums - np.log(np.arange(1, v + 1))))) if v else 0.0
    return min(beta + 2 * m * delta * alpha, 1.0)


def reference_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """sup{ε >= 0 : p(ε) <= 1 - confidence} by plain bisection."""
    level = 1 - confidence
    if reference_p_value(m, r, v, 0.0, delta) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while reference_p_value(m, r, v, hi, delta) <= level:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reference_p_value(m, r, v, mid, delta) <= level else (lo, mid)
    return lo


@st.composite
def counts(draw, max_m=300):
    m = draw(st.integers(1, max_m))
    guesses = draw(st.integers(0, m))
    correct = draw(st.integers(0, guesses))
    return m, guesses, correct


deltas = st.sampled_from([1e-6, 1e-5, 1e-3, 1e-2])
confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])


# -- golden values ----------------------------------------------------------------------------------


@pytest.mark.parametrize("row", GOLDEN["values"], ids=lambda row: f"m={row['m']}")
def test_optimal_epsilon_matches_the_paper(row):
    value = optimal_epsilon(row["m"], delta=GOLDEN["delta"], confidence=GOLDEN["confidence"])
    assert abs(value - row["epsilon"]) <= 0.5 * 10 ** -row["decimals"]


def test_clopper_pearson_matches_the_paper():
    """UniAud: ε_O = 5.6 for the Clopper–Pearson bound with T = 1000 trials (no errors)."""
    assert round(clopper_pearson_epsilon(0, 0, 1000, 1000, delta=DELTA), 1) == 5.6


# -- agreement with the reference ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(counts(), deltas, confidences)
def test_bound_equals_the_reference_loop(c, delta, confidence):
    expected = reference_bound(*c, delta, confidence)
    assert epsilon_lower_bound(*c, delta=delta, confidence=confidence) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "m, guesses, correct", [(10_000, 10_000, 9_000), (10_000, 1_000, 900), (5_000, 300, 290)]
)
def test_bound_equals_the_reference_for_many_canaries(m, guesses, correct):
    expected = reference_bound(m, guesses, correct, DELTA, 0.95)
    assert epsilon_lower_bound(m, guesses, correct, delta=DELTA) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "m, guesses, correct, delta, confidence",
    [(10_000, 10_000, 9_500, 1e-5, 1 - 1e-5), (50_000, 25_000, 25_000, 1e-5, 1 - 1e-4)],
)
def test_bound_equals_the_reference_far_right_of_the_mode(m, guesses, correct, delta, confidence):
    """Far more correct guesses than r·q: the window pmf near v underflows, the mass near the mode does not.

    Before the window search started at the mode these gave 0.095 (reference 0) and 0.559 (0.446).
    """
    expected = reference_bound(m, guesses, correct, delta, confidence)
    assert epsilon_lower_bound(m, guesses, correct, delta=delta, confidence=confidence) == pytest.approx(
        expected, abs=1e-6
    )


def test_bound_equals_the_reference_on_random_large_counts():
    """Random counts up to m = 20 000 with many correct guesses, where α's window is long."""
    rng = np.random.default_rng(7)
    for _ in range(12):
        m = int(rng.integers(1_000, 20_001))
        guesses = int(rng.integers(1_100, m + 1))
        correct = int(rng.integers(guesses // 2, guesses + 1))
        delta = float(rng.choice([1e-6, 1e-5, 1e-4]))
        confidence = float(rng.choice([0.95, 1 - 1e-4, 1 - 1e-5]))
        expected = reference_bound(m, guesses, correct, delta, confidence)
        value = epsilon_lower_bound(m, guesses, correct, delta=delta, confidence=confidence)
        assert value == pytest.approx(expected, abs=1e-6), (m, guesses, correct, delta, confidence)


def test_arrays_broadcast_and_match_scalar_calls():
    guesses = np.array([[50], [200]])
    correct = np.array([40, 45, 50])
    bounds = epsilon_lower_bound(1000, guesses, correct, delta=DELTA)
    assert bounds.shape == (2, 3)
    for (i, j), value in np.ndenumerate(bounds):
        scalar = epsilon_lower_bound(1000, int(guesses[i, 0]), int(correct[j]), delta=DELTA)
        assert value == pytest.approx(scalar, abs=1e-6)  # rows may stop their search a round apart
    assert isinstance(epsilon_lower_bound(1000, 50, 40, delta=DELTA), float)


# -- properties --------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(counts(), deltas, confidences)
def test_more_correct_guesses_never_lower_the_bound(c, delta, confidence):
    m, guesses, correct = c
    if correct < guesses:
        pair = np.array([correct, correct + 1])
        low, high = epsilon_lower_bound(m, guesses, pair, delta=delta, confidence=confidence)
        assert high >= low - 1e-6


@settings(max_examples=30, deadline=None)
@given(counts(), st.sampled_from([(1e-6, 1e-4), (1e-5, 1e-3), (1e-3, 1e-2)]), confidences)
def test_larger_delta_never_raises_the_bound(c, deltas_pair, confidence):
    """A larger δ makes the claim weaker and the p-value β + 2mδα larger: ε_L can only shrink."""
    small, large = (epsilon_lower_bound(*c, delta=d, confidence=confidence) for d in deltas_pair)
    assert large <= small + 1e-6


@settings(max_examples=30, deadline=None)
@given(counts(), deltas, st.sampled_from([(0.8, 0.9), (0.9, 0.95), (0.95, 0.99)]))
def test_higher_confidence_never_raises_the_bound(c, delta, confidence_pair):
    """Higher confidence allows a smaller p-value, so fewer ε are rejected: ε_L can only shrink."""
    lower, higher = (epsilon_lower_bound(*c, delta=delta, confidence=k) for k in confidence_pair)
    assert higher <= lower + 1e-6


@settings(max_examples=30, deadline=None)
@given(counts(max_m=2000), deltas)
def test_bound_never_exceeds_the_optimum(c, delta):
    assert epsilon_lower_bound(*c, delta=delta) <= optimal_epsilon(c[0], delta=delta) + 1e-6


@pytest.mark.parametrize(
    "m, guesses, correct", [(1000, 100, 80), (1000, 500, 350), (10_000, 1000, 700), (5000, 300, 250)]
)
def test_fdp_bound_is_tighter_in_typical_settings(m, guesses, correct):
    assert fdp_epsilon_lower_bound(m, guesses, correct, delta=DELTA) > epsilon_lower_bound(
        m, guesses, correct, delta=DELTA
    )


def test_required_canaries_is_the_first_m_that_suffices():
    m = required_canaries(5.0, delta=DELTA)
    assert optimal_epsilon(m - 1, delta=DELTA) <= 5.0 < optimal_epsilon(m, delta=DELTA)


def test_required_canaries_says_when_no_m_suffices():
    with pytest.raises(ValueError, match="no number of canaries.*epsilon=9"):
        required_canaries(9.0, delta=DELTA)


def test_clopper_pearson_shrinks_with_errors():
    values = clopper_pearson_epsilon(np.array([0, 10, 100]), 10, 1000, 1000, delta=DELTA)
    assert np.all(np.diff(values) < 0) and values[-1] > 0


# -- soundness on simulated data -----------------------------------------------------------------


def allowed_exceedances(repetitions: int, level: float) -> int:
    """Largest count a correct bound reaches with probability >= 1 - TEST_ERROR (binomial tail)."""
    return int(stats.binom.isf(TEST_ERROR, repetitions, level))


@pytest.mark.parametrize("true_epsilon", [0.0, 1.0])
@pytest.mark.parametrize("guesses", [20, 200, 1000])
def test_bound_is_sound_on_randomized_response(true_epsilon, guesses):
    """Guesses right with probability e^ε/(1 + e^ε), the most an ε-DP mechanism allows.

    Of 2000 audits at 95 % confidence, at most the binomial quantile of level 5 % may report
    ε_L > ε; the test fails with probability < 1e-4 when the bound is correct.
    """
    rng = np.random.default_rng(guesses + int(10 * true_epsilon))
    correct = rng.binomial(guesses, math.exp(true_epsilon) / (1 + math.exp(true_epsilon)), size=2000)
    bounds = epsilon_lower_bound(1000, guesses, correct, delta=DELTA)
    assert np.sum(bounds > true_epsilon) <= allowed_exceedances(2000, 0.05)


@pytest.mark.parametrize("estimator", [epsilon_lower_bound, fdp_epsilon_lower_bound])
def test_bounds_are_sound_on_fair_coins(estimator):
    """Membership guesses that are fair coins: no bound may exceed 0 more often than the level allows.

    Fails with probability < 1e-4 when the bound is correct.
    """
    correct = np.random.default_rng(1).binomial(150, 0.5, size=2000)
    bounds = estimator(1000, 150, correct, delta=DELTA)
    assert np.sum(bounds > 0) <= allowed_exceedances(2000, 0.05)


@pytest.mark.parametrize("estimator", [epsilon_lower_bound, fdp_epsilon_lower_bound])
def test_bounds_are_sound_for_a_gaussian_mechanism(estimator):
    """Each canary's score is μ·(±½) plus N(0, 1) noise: μ-GDP, hence (ε(μ, δ), δ)-DP.

    The attack guesses the sign on the 100 scores farthest from 0 and abstains on the rest. Of
    2000 audits at 95 % confidence, the count reporting ε_L > ε(μ, δ) must stay within the binomial
    quantile; fails with probability < 1e-4 when the bound is correct.
    """
    mu, m, guesses = 1.0, 1000, 100
    rng = np.random.default_rng(2)
    members = rng.integers(0, 2, size=(2000, m)) * 2 - 1
    scores = mu * members / 2 + rng.standard_normal((2000, m))
    confident = np.argsort(-np.abs(scores), axis=1)[:, :guesses]
    rows = np.arange(2000)[:, None]
    correct = np.sum(np.sign(scores[rows, confident]) == members[rows, confident], axis=1)
    true_epsilon = _gdp_epsilon(mu, DELTA)
    bounds = estimator(m, guesses, correct, delta=DELTA)
    assert np.sum(bounds > true_epsilon) <= allowed_exceedances(2000, 0.05)


def _gdp_epsilon(mu: float, delta: float) -> float:
    from scipy.optimize import brentq

    def excess(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(excess, 0.0, 50.0)


# -- validation and imports ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0, 0, 0), {}, r"m must be >= 1, got 0"),
        ((10, 11, 0), {}, r"guesses must be in \[0, 10\], got 11"),
        ((10, -1, 0), {}, r"guesses must be in \[0, 10\], got -1"),
        ((10, 5, 6), {}, r"correct must be in \[0, 5\], got 6"),
        ((10, 5, -1), {}, r"correct must be in \[0, 5\], got -1"),
        ((10, 5, 2.5), {}, r"correct must be an integer"),
        ((10, np.array([5, 12]), 1), {}, r"guesses must be in \[0, m\] = \[0, 10\], got 12"),
        ((10, 5, 2), {"delta": 1.5}, r"delta must be in \(0, 1\), got 1.5"),
        ((10, 5, 2), {"delta": 0.0}, r"delta must be in \(0, 1\)"),
        ((10, 5, 2), {"confidence": 1.0}, r"confidence must be in \(0, 1\)"),
    ],
)
@pytest.mark.parametrize("estimator", [epsilon_lower_bound, fdp_epsilon_lower_bound])
def test_bad_counts_raise(estimator, args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        estimator(*args, **{"delta": DELTA, **kwargs})


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: optimal_epsilon(0, delta=DELTA), r"m must be >= 1"),
        (lambda: optimal_epsilon(10, delta=2.0), r"delta must be in \(0, 1\)"),
        (lambda: required_canaries(-1.0, delta=DELTA), r"epsilon must be in \[0, inf\]"),
        (
            lambda: clopper_pearson_epsilon(11, 0, 10, 10, delta=DELTA),
            r"false_positives must be in \[0, 10\], got 11",
        ),
        (lambda: clopper_pearson_epsilon(0, 0, 0, 10, delta=DELTA), r"negatives must be >= 1"),
        (
            lambda: clopper_pearson_epsilon(0, 0, 10, 10, delta=DELTA, confidence=0),
            r"confidence must be in \(0, 1\)",
        ),
    ],
)
def test_other_bad_input_raises(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- golden values of google-deepmind/jax_privacy (tests/auditing_test.py, test_epsilon_one_run_close) --


def _deterministic_normal(mean: float, n: int) -> np.ndarray:
    """n scores at the normal quantiles (i + ½)/n, shifted by ``mean``: the sample without its noise."""
    return stats.norm.ppf((np.arange(n) + 0.5) / n) + mean


def _roc_hull_counts(in_scores: np.ndarray, out_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """True and false positives ("in" when score >= t) at the thresholds on the ROC's concave hull.

    The thresholds are every score and +inf; those whose (false negatives, true negatives) point
    lies on or below the chord of its neighbours are dropped, as jax_privacy's Pareto frontier does.
    """
    thresholds = np.concatenate([np.union1d(in_scores, out_scores), [np.inf]])
    fn = np.searchsorted(np.sort(in_scores), thresholds, side="left")
    tn = np.searchsorted(np.sort(out_scores), thresholds, side="left")
    hull: list[int] = []
    for k in range(thresholds.size):
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            if (fn[j] - fn[i]) * (tn[k] - tn[i]) - (tn[j] - tn[i]) * (fn[k] - fn[i]) < 0:
                break
            hull.pop()
        hull.append(k)
    return in_scores.size - fn[hull], out_scores.size - tn[hull]


@pytest.mark.parametrize(
    "shift, steinke, fdp", [(0, 0.0, 0.0), (1, 1.13346, 2.164749), (2, 2.311945, 4.7218075), (4, 4.395568, 9.133752)]
)
def test_one_run_epsilons_match_jax_privacy(shift, steinke, fdp):
    """jax_privacy's published one-run ε for 10 000 in-canaries N(shift, 1) and 10 000 out-canaries N(0, 1).

    One-sided guesses ("in" above a threshold) at every threshold of the ROC's concave hull, m = 20 000,
    significance 0.05 split over the thresholds (Bonferroni), δ = 1e-6; the f-DP ε is that of the
    largest refuted μ-GDP at δ. Published to rtol 1e-5 there, checked to the same here.
    """
    n = 10_000
    tp, fp = _roc_hull_counts(_deterministic_normal(shift, n), _deterministic_normal(0.0, n))
    confidence = 1 - 0.05 / tp.size
    guessed = tp + fp > 0
    kwargs = {"delta": 1e-6, "confidence": confidence}
    args = (2 * n, (tp + fp)[guessed], tp[guessed])
    assert np.max(epsilon_lower_bound(*args, **kwargs)) == pytest.approx(steinke, rel=1e-5, abs=1e-9)
    assert np.max(fdp_epsilon_lower_bound(*args, **kwargs)) == pytest.approx(fdp, rel=1e-5, abs=1e-9)
