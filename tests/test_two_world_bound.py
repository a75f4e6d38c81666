"""The two-world bound: known values, monotonicity, input checks and the null simulation (design rule 9)."""

import math

import numpy as np
import pytest
from scipy import stats

from dpverify.stats.bounds import _gdp_epsilon, clopper_pearson_epsilon
from dpverify.stats.two_world import curve_refutable, gdp_curve, runs_needed, two_world_bound, two_world_ceiling

DELTA = 1e-5


def test_perfect_separation_reaches_the_ceiling_known_before_training():
    rng = np.random.default_rng(0)
    d, dprime = rng.uniform(0, 1, 200), rng.uniform(2, 3, 200)
    bound = two_world_bound(d, dprime, delta=DELTA, confidence=0.95)
    eps_c, mu_c = two_world_ceiling(200, delta=DELTA, confidence=0.95)
    assert bound.epsilon_lower_bound == pytest.approx(eps_c) == pytest.approx(bound.epsilon_ceiling)
    assert bound.gdp_mu_lower_bound == pytest.approx(mu_c)
    # 100 evaluated runs a side, each Clopper-Pearson limit at (0.05 / 2) / 2: ᾱ = β̄ = 1 - 0.0125^(1/100).
    upper = 1 - 0.0125 ** (1 / 100)
    assert eps_c == pytest.approx(math.log((1 - DELTA - upper) / upper), rel=1e-9)
    assert mu_c == pytest.approx(-2 * stats.norm.ppf(upper), rel=1e-9)


def test_split_counts_only_the_held_out_half_and_matches_the_shared_clopper_pearson_bound():
    rng = np.random.default_rng(1)
    d, dprime = rng.standard_normal(400), rng.standard_normal(400) + 2
    bound = two_world_bound(d, dprime, delta=DELTA, confidence=0.9)
    assert bound.selection_runs == 200 and bound.negatives == bound.positives == 200
    assert bound.false_positives == int(np.sum(d[200:] > bound.threshold))
    assert bound.false_negatives == int(np.sum(dprime[200:] <= bound.threshold))
    expected = clopper_pearson_epsilon(
        bound.false_positives, bound.false_negatives, 200, 200, delta=DELTA, confidence=1 - 0.1 / 2
    )
    assert bound.epsilon_lower_bound == pytest.approx(expected)
    assert bound.gdp_epsilon_lower_bound == pytest.approx(_gdp_epsilon(np.asarray(bound.gdp_mu_lower_bound), DELTA))


def test_grid_is_bonferroni_corrected_and_more_thresholds_never_help_at_the_same_counts():
    d, dprime = np.arange(100.0), np.arange(100.0) + 1000
    one = two_world_bound(d, dprime, delta=DELTA, threshold_rule="grid", thresholds=[500.0])
    ten = two_world_bound(d, dprime, delta=DELTA, threshold_rule="grid", thresholds=[500.0] + [-1e6] * 9)
    assert ten.epsilon_lower_bound < one.epsilon_lower_bound == pytest.approx(one.epsilon_ceiling)
    assert one.epsilon_ceiling == pytest.approx(two_world_ceiling(100, delta=DELTA, threshold_rule="grid")[0])


def test_bound_grows_with_separation_runs_and_lower_confidence():
    rng = np.random.default_rng(2)
    noise_d, noise_dprime = rng.standard_normal(2000), rng.standard_normal(2000)
    by_mu = [two_world_bound(noise_d, noise_dprime + mu, delta=DELTA).gdp_mu_lower_bound for mu in (0.5, 1, 2, 3)]
    assert by_mu == sorted(by_mu) and by_mu[0] < by_mu[-1]
    ceilings = [two_world_ceiling(r, delta=DELTA)[0] for r in (10, 100, 1000, 10000)]
    assert ceilings == sorted(ceilings)
    assert two_world_ceiling(100, delta=DELTA, confidence=0.5)[0] > two_world_ceiling(100, delta=DELTA)[0]
    assert runs_needed(two_world_ceiling(1000, delta=DELTA)[0], delta=DELTA) == 1001 or runs_needed(
        two_world_ceiling(1000, delta=DELTA)[0], delta=DELTA
    ) == 1002  # the split evaluates ceil(R/2) runs a side, so R = 1001 and 1002 tie


def test_curve_test_refutes_a_curve_the_scores_clearly_beat():
    rng = np.random.default_rng(3)
    bound = two_world_bound(
        rng.standard_normal(2000), rng.standard_normal(2000) + 3, delta=DELTA, claimed_curve=gdp_curve(1.0)
    )
    assert bound.curve_refuted is True and bound.gdp_mu_lower_bound > 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scores_d=[1.0], scores_dprime=[1.0, 2.0]), "scores_d must hold >= 2 runs"),
        (dict(scores_d=[1.0, np.nan], scores_dprime=[1.0, 2.0]), "NaN or infinite"),
        (dict(scores_d=[1.0, 2.0], scores_dprime=[1.0, 2.0], threshold_rule="grid"), "declared in advance"),
        (dict(scores_d=[1.0, 2.0], scores_dprime=[1.0, 2.0], thresholds=[0.0]), "grid"),
        (dict(scores_d=[1.0, 2.0], scores_dprime=[1.0, 2.0], threshold_rule="best"), "threshold_rule must be one of"),
    ],
)
def test_bad_inputs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        two_world_bound(delta=DELTA, **kwargs)
    with pytest.raises(ValueError, match="runs must be >= 2, got 1"):
        two_world_ceiling(1, delta=DELTA)


@pytest.mark.parametrize("mu", [0.0, 1.0, 2.5])
def test_null_simulation_refutes_the_true_mechanism_at_most_at_the_stated_level(mu):
    """3 × 3400 two-world audits whose scores come from exactly the claimed mechanism (μ-GDP: N(0, 1) vs
    N(μ, 1); μ = 0 is two equal distributions, claimed 0-DP) against both tests at once: the claim (the GDP
    curve, and its (ε, δ)) is refuted in at most 5 % of them, by a 99 % Clopper-Pearson upper limit."""
    audits, runs, level = 3400, 100, 0.05
    claimed_eps = float(_gdp_epsilon(np.asarray(mu), DELTA))
    rng = np.random.default_rng(20261126)
    refuted = 0
    for _ in range(audits):
        bound = two_world_bound(
            rng.standard_normal(runs), rng.standard_normal(runs) + mu, delta=DELTA, confidence=1 - level,
            claimed_curve=gdp_curve(mu),
        )
        refuted += bool(bound.curve_refuted or bound.epsilon_lower_bound > claimed_eps)
    upper = stats.beta.ppf(0.99, refuted + 1, audits - refuted) if refuted < audits else 1.0
    assert upper <= level, f"{refuted} of {audits} audits refuted a true claim (upper limit {upper:.4f})"


def test_split_finds_a_world_whose_scores_fall_in_d_prime():
    rng = np.random.default_rng(4)
    bound = two_world_bound(rng.standard_normal(400) + 3, rng.standard_normal(400), delta=DELTA)
    assert bound.direction == -1 and bound.epsilon_lower_bound > 1.0


def test_a_curve_is_refutable_only_when_perfect_separation_lies_below_it():
    _, mu_ceiling = two_world_ceiling(100, delta=DELTA)
    assert curve_refutable(gdp_curve(0.9 * mu_ceiling), 100)
    assert not curve_refutable(gdp_curve(1.1 * mu_ceiling), 100)
