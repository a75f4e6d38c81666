"""Tests of dpverify.stats.curves and dpverify.stats.mmc: curves, the one-run curve test, null simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from dpverify.stats import mmc
from dpverify.stats.accounting import add_remove_epsilon, privacy_profile
from dpverify.stats.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.stats.curves import (
    ClaimedRun,
    GaussianCurve,
    ProfileCurve,
    TrivialCurve,
    curve_refutes,
    curve_test,
)
from dpverify.stats.scoring import GuessRule

DELTA = 1e-5


def gdp_profile(mu: float, epsilons: np.ndarray) -> np.ndarray:
    """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Corollary 2.13)."""
    return stats.norm.cdf(-epsilons / mu + mu / 2) - np.exp(epsilons) * stats.norm.cdf(-epsilons / mu - mu / 2)


# -- curves --------------------------------------------------------------------------------------------


def test_gaussian_curve_is_the_normal_trade_off():
    alpha = np.array([0.0, 1e-9, 0.01, 0.3, 0.5, 0.99, 1.0])
    expected = stats.norm.cdf(stats.norm.ppf(1 - alpha) - 1.5)
    np.testing.assert_allclose(GaussianCurve(mu=1.5)(alpha), expected, rtol=1e-9, atol=1e-300)
    x = np.array([1e-12, 1e-3, 0.5])
    np.testing.assert_allclose(GaussianCurve(mu=1.5).inverse_complement(x), stats.norm.cdf(stats.norm.ppf(x) - 1.5))


def test_claimed_run_chooses_the_curve():
    assert ClaimedRun(noise_multiplier=2.0, steps=16).curve() == GaussianCurve(mu=2.0)
    assert ClaimedRun(noise_multiplier=2.0, steps=16, relation="replace_one").curve() == GaussianCurve(mu=4.0)
    assert isinstance(ClaimedRun(noise_multiplier=0.0, steps=3).curve(), TrivialCurve)
    subsampled = ClaimedRun(noise_multiplier=1.0, sampling_rate=0.1, steps=10)
    assert isinstance(subsampled.curve(), ProfileCurve) and subsampled.mu is None
    assert subsampled.curve() is subsampled.curve()  # cached


def test_profile_curve_of_gdp_is_pessimistic_and_close():
    """The envelope of the exact GDP profile is the GDP curve itself (DRS Prop. 2.12): the grid only lowers it."""
    mu = 1.0
    epsilons = np.linspace(0, 12, 3000)
    curve = ProfileCurve(epsilons=epsilons, deltas=gdp_profile(mu, epsilons))
    alpha = np.concatenate([np.geomspace(1e-9, 1, 400), np.linspace(0, 1, 401)])
    exact = GaussianCurve(mu=mu)(alpha)
    assert np.all(curve(alpha) <= exact + 1e-12)
    assert np.max(exact - curve(alpha)) < 2e-3
    np.testing.assert_allclose(curve(curve(alpha)), alpha, atol=3e-3)  # symmetric


def test_profile_curve_is_the_maximum_of_its_lines():
    """Vertices plus interpolation give exactly max(0, 1 − δ − e^ε α, e^−ε (1 − δ − α)) over the grid."""
    rng = np.random.default_rng(5)
    eps = np.sort(rng.uniform(0, 6, 40))
    deltas = np.sort(rng.uniform(0, 0.3, 40))[::-1]
    alpha = rng.uniform(0, 1, 2000)
    lines = np.maximum(1 - deltas - np.exp(eps) * alpha[:, None], np.exp(-eps) * (1 - deltas - alpha[:, None]))
    expected = np.maximum(lines.max(axis=1), 0.0)
    np.testing.assert_allclose(ProfileCurve(epsilons=eps, deltas=deltas)(alpha), expected, atol=1e-12)


def test_privacy_profile_is_two_sided_and_matches_the_accountant():
    kwargs = {"noise_multiplier": 1.0, "sampling_rate": 0.05, "steps": 50}
    eps, deltas = privacy_profile(relation="add_remove", **kwargs)
    assert np.all(np.diff(deltas) <= 1e-15) and deltas[-1] <= 1.001e-12
    at = np.interp(-DELTA, -deltas, eps)  # the ε where δ(ε) crosses DELTA
    assert at == pytest.approx(add_remove_epsilon(delta=DELTA, **kwargs), rel=1e-3)
    full_eps, full_deltas = privacy_profile(noise_multiplier=2.0, sampling_rate=1.0, steps=4, relation="add_remove")
    exact = gdp_profile(1.0, full_eps)  # q = 1: the Gaussian pair, μ = √4/2
    assert np.all(full_deltas >= exact - 1e-12) and np.max(full_deltas - exact) < 1e-3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"noise_multiplier": -1.0, "steps": 1}, r"noise_multiplier must be in \[0, inf\], got -1"),
        ({"noise_multiplier": 1.0, "steps": 0}, r"steps must be >= 1, got 0"),
        ({"noise_multiplier": 1.0, "steps": 1, "sampling_rate": 0.0}, r"sampling_rate must be in \(0, 1\]"),
        ({"noise_multiplier": 1.0, "steps": 1, "relation": "swap"}, r"relation must be one of"),
    ],
)
def test_claimed_run_validates_at_the_door(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClaimedRun(**kwargs)


def test_curves_validate_at_the_door():
    with pytest.raises(ValueError, match=r"mu must be in \[0, inf\], got -1"):
        GaussianCurve(mu=-1.0)
    with pytest.raises(ValueError, match=r"deltas in \[0, 1\]"):
        ProfileCurve(epsilons=np.array([0.0, 1.0]), deltas=np.array([0.5, 2.0]))
    with pytest.raises(TypeError, match="positional"):
        ClaimedRun(1.0, 1.0, 1)  # keyword-only
    with pytest.raises(ValueError, match="curve must be a TradeOffCurve"):
        curve_refutes(10, 5, 5, curve=1.0)


# -- the recursion -------------------------------------------------------------------------------------


def reference_rejected(m: int, guesses: int, correct: int, level: float, inverse) -> bool:
    """The recursion of Mahloujifar et al. written out, one scalar step at a time, no early exit."""
    r, h = level * correct / m, level * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        h_new = max(h, float(inverse(r)))
        r = min(r + i / (guesses - i) * (h_new - h), 1.0)
        h = h_new
    return r + h > guesses / m


def test_recursion_equals_the_reference_loop():
    rng = np.random.default_rng(3)
    m = rng.integers(50, 400, size=60)
    guesses = np.array([rng.integers(1, k + 1) for k in m])
    correct = np.array([rng.integers(g // 2, g + 1) for g in guesses])
    mu = rng.uniform(0.1, 3.0, size=60)
    level = rng.choice([1e-3, 0.05, 0.2], size=60)
    fast = mmc.rejected(m, guesses, correct, level, lambda x, p: special.ndtr(special.ndtri(x) - p), mu)
    slow = [
        reference_rejected(int(a), int(b), int(c), float(d), lambda x, p=p: special.ndtr(special.ndtri(x) - p))
        for a, b, c, d, p in zip(m, guesses, correct, level, mu)
    ]
    assert fast.tolist() == slow and 5 < sum(slow) < 55


# -- the curve test ------------------------------------------------------------------------------------


GRID_GUESSES = np.array([100, 200, 500, 1000, 2000, 5000, 10_000])


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_full_batch_curve_test_is_the_gdp_bound_and_agrees_with_itself(sigma):
    correct = np.array([95, 185, 420, 760, 1300, 3000, 6000])
    claim = ClaimedRun(noise_multiplier=sigma, steps=1)
    confidence = 1 - 0.05 / 7
    result = curve_test(10_000, GRID_GUESSES, correct, claim=claim, delta=DELTA, confidence=confidence)
    fdp = fdp_epsilon_lower_bound(10_000, GRID_GUESSES, correct, delta=DELTA, confidence=confidence)
    assert result.refuted == (result.epsilon >= result.claimed_epsilon)
    assert result.refuted == bool(np.any(curve_refutes(10_000, GRID_GUESSES, correct, curve=claim.curve(), confidence=confidence)))
    assert result.refuted == (result.p_value <= (1 - confidence) * 1.01)
    if not result.refuted:
        assert result.epsilon == pytest.approx(np.max(fdp), abs=1e-6)
        assert result.mu == pytest.approx(1 / result.noise_multiplier)
    assert result.claimed_epsilon == pytest.approx(claim.epsilon(DELTA))


def test_curve_test_outcome_flips_at_the_claim():
    """The same counts refute a strong claim (much noise) and not a weak one; ε outcome is the same member."""
    correct = np.array([95, 185, 420, 760, 1300, 3000, 6000])
    strong, weak = (
        curve_test(10_000, GRID_GUESSES, correct, claim=ClaimedRun(noise_multiplier=s, steps=1), delta=DELTA)
        for s in (4.0, 0.25)
    )
    assert strong.refuted and not weak.refuted
    assert strong.epsilon == pytest.approx(weak.epsilon, abs=1e-5)
    assert weak.claimed_epsilon > weak.epsilon > strong.claimed_epsilon


def test_subsampled_curve_test_is_consistent():
    correct = np.array([90, 180, 400, 700, 1200, 3000, 6000])
    claim = ClaimedRun(noise_multiplier=1.0, sampling_rate=0.01, steps=1000)
    result = curve_test(10_000, GRID_GUESSES, correct, claim=claim, delta=DELTA, confidence=1 - 0.05 / 7)
    assert result.refuted and result.epsilon >= result.claimed_epsilon
    assert result.noise_multiplier <= 1.0 and result.mu is None
    weaker = claim.with_noise(result.noise_multiplier * 0.99)
    assert not curve_refutes(10_000, GRID_GUESSES, correct, curve=weaker.curve(), confidence=1 - 0.05 / 7).any()


@pytest.mark.parametrize("sigma, m, refutable", [(1.0, 100, True), (1.0, 4, False), (0.0, 100, False)])
def test_refutable_says_whether_every_guess_right_would_refute(sigma, m, refutable):
    """Four canaries cannot refute 1-GDP even if every guess is right (p ≈ 0.23); nothing refutes no noise."""
    claim = ClaimedRun(noise_multiplier=sigma, steps=1)
    guesses = np.unique(np.array([m // 4, m // 2, m]))
    result = curve_test(m, guesses, guesses // 2, claim=claim, delta=DELTA)
    assert result.refutable is refutable and not result.refuted
    assert refutable == bool(np.any(curve_refutes(m, guesses, guesses, curve=claim.curve())))


def test_a_claim_without_noise_is_never_refuted():
    result = curve_test(1000, 1000, 1000, claim=ClaimedRun(noise_multiplier=0.0, steps=5), delta=DELTA)
    assert not result.refuted and result.claimed_epsilon == math.inf and result.epsilon > 4


def test_fair_coins_refute_nothing():
    result = curve_test(1000, 100, 50, claim=ClaimedRun(noise_multiplier=10.0, steps=1), delta=DELTA)
    assert not result.refuted and result.epsilon == 0.0 and result.noise_multiplier == math.inf


# -- null simulations: scores from exactly the claimed mechanism (design rule 9) -------------------------

SIMULATIONS = 10_000
LEVEL = 0.05
M = 1000


def two_sided_correct(scores: np.ndarray, members: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Correct guesses per audit and count: ⌈k/2⌉ top scores guessed in, ⌊k/2⌋ bottom guessed out."""
    order = np.argsort(-scores, axis=1)
    ranked = np.take_along_axis(members, order, axis=1)
    top = np.cumsum(ranked, axis=1)
    bottom = np.cumsum(~ranked[:, ::-1], axis=1)
    ups, downs = (counts + 1) // 2, counts // 2
    below = np.where(downs > 0, bottom[:, np.maximum(downs - 1, 0)], 0)
    return top[:, ups - 1] + below


def critical_correct(refutes, counts: np.ndarray) -> np.ndarray:
    """Per guess count k, the fewest correct guesses that refute; k + 1 when none does (checks monotonicity)."""
    ks = np.concatenate([np.full(k + 1, k) for k in counts])
    vs = np.concatenate([np.arange(k + 1) for k in counts])
    refuted = refutes(ks, vs)
    out = []
    for k in counts:
        row = refuted[ks == k]
        assert np.all(np.diff(row.astype(int)) >= 0), "refutation must grow with the correct count"
        out.append(int(np.argmax(row)) if row.any() else k + 1)
    return np.array(out)


def false_rejection_upper_limit(rejections: int) -> float:
    """Clopper–Pearson one-sided 99.9 % upper limit on the false-rejection rate."""
    return float(stats.beta.ppf(0.999, rejections + 1, SIMULATIONS - rejections))


def simulate(draw_scores, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Correct counts (SIMULATIONS × grid) of two-sided guesses on M canaries, members fair coins."""
    rng = np.random.default_rng(seed)
    counts = GuessRule().counts(M)
    chunks = []
    for _ in range(SIMULATIONS // 1000):
        members = rng.random((1000, M)) < 0.5
        chunks.append(two_sided_correct(draw_scores(rng, members), members, counts))
    return counts, np.concatenate(chunks)


def gaussian_scores(mu: float):
    return lambda rng, members: mu * members + rng.standard_normal(members.shape)


def subsampled_scores(sigma: float, q: float, steps: int):
    """The privacy-loss score Σ_t log((1 - q) + q e^{(2x_t - 1)/(2σ²)}) of T subsampled Gaussian steps.

    A member is sampled in each step with probability q and then shifts x_t by 1 (the clip norm).
    """

    def draw(rng, members):
        shape = members.shape + (steps,)
        shifts = (rng.random(shape) < q) & members[..., None]
        x = shifts + sigma * rng.standard_normal(shape)
        return np.log1p(q * np.expm1((2 * x - 1) / (2 * sigma**2))).sum(axis=-1)

    return draw


NULLS = [
    pytest.param(ClaimedRun(noise_multiplier=2.0, steps=1), gaussian_scores(0.5), 1, id="gdp-mu0.5"),
    pytest.param(ClaimedRun(noise_multiplier=1.0, steps=1), gaussian_scores(1.0), 2, id="gdp-mu1"),
    pytest.param(ClaimedRun(noise_multiplier=0.5, steps=1), gaussian_scores(2.0), 3, id="gdp-mu2"),
    pytest.param(
        ClaimedRun(noise_multiplier=2.0, sampling_rate=0.5, steps=2), subsampled_scores(2.0, 0.5, 2), 4, id="subsampled"
    ),
]


@pytest.mark.parametrize("claim, draw_scores, seed", NULLS)
def test_null_simulation_refutes_at_most_the_level(claim, draw_scores, seed):
    """10 000 audits of a mechanism that is exactly the claim, the lead's guess grid with Bonferroni.

    Both tests, the curve test and the Steinke (ε, δ) bound at the claim's ε, must refute with a
    Clopper–Pearson 99.9 % upper limit on the rate at most the 5 % level. Refuted counts are
    found per guess count once (the smallest refuting correct count), then compared with all
    simulated counts at once.
    """
    counts, correct = simulate(draw_scores, seed)
    confidence = GuessRule().corrected_confidence(1 - LEVEL)
    claimed = claim.epsilon(DELTA)
    curve = claim.curve()
    tests = {
        "curve": lambda ks, vs: curve_refutes(M, ks, vs, curve=curve, confidence=confidence),
        "steinke": lambda ks, vs: epsilon_lower_bound(M, ks, vs, delta=DELTA, confidence=confidence) > claimed,
    }
    for name, refutes in tests.items():
        rejections = int(np.sum(np.any(correct >= critical_correct(refutes, counts), axis=1)))
        assert false_rejection_upper_limit(rejections) <= LEVEL, (name, rejections)


@pytest.mark.parametrize(
    "claim, draw_scores",
    [
        pytest.param(ClaimedRun(noise_multiplier=2.0, steps=1), gaussian_scores(1.0), id="gdp-half-noise"),
        pytest.param(
            ClaimedRun(noise_multiplier=2.0, sampling_rate=0.5, steps=2),
            subsampled_scores(2.0 / 3, 0.5, 2),
            id="subsampled-third-noise",
        ),
    ],
)
def test_null_simulation_catches_a_noise_deficit(claim, draw_scores):
    """The same machinery refutes, more often than the level, a mechanism with less noise than claimed.

    So the null simulations above can fail: these claims are within reach of M canaries.
    """
    counts, correct = simulate(draw_scores, seed=11)
    confidence = GuessRule().corrected_confidence(1 - LEVEL)
    curve = claim.curve()
    critical = critical_correct(lambda ks, vs: curve_refutes(M, ks, vs, curve=curve, confidence=confidence), counts)
    assert np.mean(np.any(correct >= critical, axis=1)) > 0.5


@pytest.mark.parametrize("crossing", [0.05, 0.7, 1.0, 3.3, 40.0])
@pytest.mark.parametrize(
    "shape",
    [
        lambda s, c: math.log(c / s),  # smooth
        lambda s, c: 30 * (c**2 / s**2 - 1),  # steep on the refuted side, as a member's p-value falls
        lambda s, c: math.ceil(20 * math.log10(c / s) + 1e-12) / 20,  # steps of a twentieth of a decade
        lambda s, c: 1.0 if s < c else -1.0,  # the decision alone (the one-run test)
    ],
    ids=["smooth", "steep", "steps", "signs"],
)
def test_the_sigma_search_returns_a_refuted_member_within_its_tolerance_of_an_unrefuted_one(shape, crossing):
    """Whatever the margin's shape (refuted exactly from ``crossing`` up, flat stretches at 0 included), the
    search returns a refuted σ less than its tolerance above the crossing, in at most twice the member curves
    bisection would take after bracketing."""
    from dpverify.stats.curves import _SIGMA_SPAN, _SIGMA_TOLERANCE, _weakest_refuted_sigma

    asked = []

    def margin(member):
        asked.append(member.noise_multiplier)
        return shape(member.noise_multiplier, crossing)

    claim = ClaimedRun(noise_multiplier=1.0, steps=1)
    sigma = _weakest_refuted_sigma(claim, margin, margin(claim))
    assert crossing <= sigma < crossing * (1 + _SIGMA_TOLERANCE)
    bracketing = math.ceil(abs(math.log2(crossing))) + 2
    bisection = math.ceil(math.log2(math.log(2) / math.log1p(_SIGMA_TOLERANCE)))
    assert len(asked) <= bracketing + 2 * bisection, asked
    assert _weakest_refuted_sigma(claim, lambda member: 1.0, 1.0) == math.inf
    assert _weakest_refuted_sigma(claim, lambda member: -1.0, -1.0) < 1 / _SIGMA_SPAN
