"""Tests of dpverify.stats.order_statistics: eq. 1 of Xiang et al. 2025, its null simulations, and
the mechanism that shows it is no test of f-DP."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from dpverify.stats.bounds import epsilon_lower_bound
from dpverify.stats.curves import ClaimedRun, curve_refutes
from dpverify.stats.order_statistics import product_channel_tail, product_channel_test
from dpverify.stats.scoring import GuessRule
from tests.test_curves import (
    DELTA,
    LEVEL,
    M,
    SIMULATIONS,
    critical_correct,
    false_rejection_upper_limit,
    gaussian_scores,
    simulate,
)

CONFIDENCE = GuessRule().corrected_confidence(1 - LEVEL)


def released_errors(mu: float, m: int, r: int, audits: int, rng) -> np.ndarray:
    """Wrong guesses among the r most confident of m independent μ-Gaussian channels, per audit."""
    members = rng.random((audits, m)) < 0.5
    distance = mu * members + rng.standard_normal((audits, m)) - mu / 2
    released = np.argsort(-np.abs(distance), axis=1)[:, :r]
    wrong = np.take_along_axis((distance > 0) != members, released, axis=1)
    return wrong.sum(axis=1)


@pytest.mark.parametrize("mu, r", [(0.5, 20), (1.0, 100), (2.0, 199)])
def test_tail_is_the_simulated_product_channel(mu, r):
    """Eq. 1 against 20 000 simulated audits of m = 200 channels, within 4 standard errors."""
    errors = released_errors(mu, 200, r, 20_000, np.random.default_rng(int(10 * mu) + r))
    for u in np.quantile(errors, [0.02, 0.2, 0.6]).astype(int):
        simulated = np.mean(errors <= u)
        tail = product_channel_tail(200, r, r - u, mu=mu)
        assert abs(tail - simulated) <= 4 * np.sqrt(simulated * (1 - simulated) / errors.size), (u, tail, simulated)


def test_full_release_is_binomial_and_counts_broadcast():
    tails = product_channel_tail(1000, np.array([1000, 1000]), np.array([600, 700]), mu=0.5)
    assert np.allclose(tails, special.bdtr([400, 300], 1000, special.ndtr(-0.25)))
    assert product_channel_tail(10, 4, 4, mu=0.0) == pytest.approx(0.5**4, rel=1e-6)


def test_outcome_flips_at_the_claim():
    counts, correct = np.array([100, 1000]), np.array([80, 640])
    low = product_channel_test(1000, counts, correct, mu=0.2, delta=DELTA, confidence=0.99)
    high = product_channel_test(1000, counts, correct, mu=2.0, delta=DELTA, confidence=0.99)
    assert low.refuted and not high.refuted
    assert low.mu == pytest.approx(high.mu, abs=1e-3)
    assert 0.2 < low.mu < 2.0
    assert low.epsilon == high.epsilon < high.claimed_epsilon
    assert low.p_value == np.min(low.tails) <= 0.01 < high.p_value


@pytest.mark.parametrize(
    "kwargs, message",
    [({"mu": -1.0}, "mu must be in"), ({"mu": 1.0, "correct": 11}, "correct must be in"), ({"mu": float("nan")}, "mu")],
)
def test_validates_at_the_door(kwargs, message):
    args = {"m": 100, "guesses": 10, "correct": 5} | kwargs
    with pytest.raises(ValueError, match=message):
        product_channel_tail(**args)


# -- null simulations on the lead's guess grid, Bonferroni at 5 % -----------------------------------------


def product_refutes(mu: float):
    return lambda ks, vs: product_channel_tail(M, ks, vs, mu=mu) <= 1 - CONFIDENCE


def rejections(draw_scores, refutes, seed: int) -> int:
    counts, correct = simulate(draw_scores, seed)
    return int(np.sum(np.any(correct >= critical_correct(refutes, counts), axis=1)))


@pytest.mark.parametrize("mu, seed", [(0.5, 21), (1.0, 22)])
def test_independent_gaussian_scores_are_refuted_at_most_the_level(mu, seed):
    """10 000 audits of m independent μ-Gaussian channels: the hypothesis eq. 1 is exact for."""
    assert false_rejection_upper_limit(rejections(gaussian_scores(mu), product_refutes(mu), seed)) <= LEVEL


def test_half_the_noise_is_refuted_often():
    counts, correct = simulate(gaussian_scores(1.0), seed=23)
    critical = critical_correct(product_refutes(0.5), counts)
    assert np.mean(np.any(correct >= critical, axis=1)) > 0.5


def shared_loss_scores(mu: float):
    """A mechanism exactly μ-GDP for every canary whose canaries share one privacy-loss level.

    ℓ is |log-likelihood ratio| of one N(0, 1) vs N(μ, 1) outcome (its law is the same under both);
    every bit is answered by randomized response at ε = ℓ. For one canary, the others fixed, the
    output is (ℓ, its answer): the Gaussian pair's sufficient statistic, so its curve is exactly
    μ-GDP. The score is the answer ±1, ties broken by an independent uniform.
    """

    def draw(rng, members):
        level = np.abs(mu * rng.standard_normal((members.shape[0], 1)) - mu**2 / 2)
        answers = members ^ (rng.random(members.shape) < special.expit(-level))
        return np.where(answers, 1.0, -1.0) + rng.random(members.shape)

    return draw


def test_a_shared_privacy_loss_breaks_the_order_statistics_test_but_not_the_f_dp_tests():
    """The claim "μ-GDP per canary" is true here; only the independence eq. 1 adds is false.

    The curve test (Mahloujifar et al.) and the Steinke bound keep the level; the order-statistics
    test refutes the true claim with a rate whose 99.9 % Clopper–Pearson lower limit is above it.
    """
    claim = ClaimedRun(noise_multiplier=2.0, steps=1)
    mu, claimed = claim.mu, claim.epsilon(DELTA)
    curve = claim.curve()
    tests = {
        "curve": lambda ks, vs: curve_refutes(M, ks, vs, curve=curve, confidence=CONFIDENCE),
        "steinke": lambda ks, vs: epsilon_lower_bound(M, ks, vs, delta=DELTA, confidence=CONFIDENCE) > claimed,
    }
    for name, refutes in tests.items():
        assert false_rejection_upper_limit(rejections(shared_loss_scores(mu), refutes, 24)) <= LEVEL, name
    refuted = rejections(shared_loss_scores(mu), product_refutes(mu), 24)
    assert stats.beta.ppf(0.001, refuted, SIMULATIONS - refuted + 1) > LEVEL, refuted
