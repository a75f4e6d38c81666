"""The correlated-noise structure, its sensitivity, and the decorrelating score (dpverify.stats.correlated).

Statistical checks draw n = 4000 canaries (half members) from one fixed seed and compare a sample mean or
variance with its expected value at 5 standard errors: each check is wrong with probability below 6e-7
under a correct scorer, and the suite's handful of them below 1e-5. At n = 2000 per side a mean's
standard error is 0.022, so a μ of about 2 that is off by 20 % (0.4) sits 18 standard errors away.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpverify.stats.correlated import (
    NoiseStructure,
    _tree_epochs,
    _tree_restart_noise_map,
    bandmf_claimed_mu,
    canary_mu,
    decorrelated_log_likelihood_ratio,
    estimated_structure,
    min_separation_sensitivity,
    optimal_max_error_coefficients,
    scoring_structure,
    sensitivity,
    structure_fit,
    tree_restart_claimed_mu,
    whitened_statistic,
)
from dpverify.stats.scoring import subsampled_gaussian_log_likelihood_ratio

Z = 5.0  # standard errors a statistical check allows: two-sided error 5.7e-7 per check
HALF = 2000  # members, and as many non-members


def _within(value: float, expected: float, standard_error: float) -> bool:
    return abs(value - expected) <= Z * standard_error


def _releases(structure: NoiseStructure, gradients: np.ndarray, member: np.ndarray, tau: float, rng) -> np.ndarray:
    """y = 1{member}·g + τ C⁻¹ Z per canary (rows), K = gradients.shape[2] coordinates each."""
    noise = rng.standard_normal(gradients.shape)
    correlated = np.einsum("ts,msk->mtk", np.linalg.inv(structure.strategy), noise)
    return member[:, None, None] * gradients + tau * correlated


def _bandmf_setting(rng, *, steps=16, bands=4, coordinates=1):
    structure = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(bands), steps=steps)
    m = 2 * HALF
    member = np.repeat([1.0, 0.0], HALF)
    gradients = np.zeros((m, steps, coordinates))
    slot = rng.integers(0, bands, size=m)  # each canary's cyclic group
    for j in range(m):
        direction = rng.standard_normal((steps, coordinates))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        gradients[j, slot[j] :: bands] = direction[slot[j] :: bands]
    return structure, gradients, member


# --- validation at the door -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, message",
    [
        (np.ones((2, 3)), "strategy must be a square"),
        (np.array([[1.0, 0.5], [0.0, 1.0]]), "strategy must be lower-triangular .* row 0, column 1"),
        (np.array([[1.0, 0.0], [np.nan, 1.0]]), "strategy must be finite"),
        (np.array([[1.0, 0.0], [1.0, 0.0]]), "strategy must be invertible, got a zero diagonal entry at step 1"),
        (np.zeros((0, 0)), "strategy must be a square"),
    ],
)
def test_a_bad_strategy_is_refused_with_what_was_wrong(strategy, message):
    with pytest.raises(ValueError, match=message):
        NoiseStructure.dense(strategy)


def test_constructors_refuse_bad_arguments():
    with pytest.raises(ValueError, match="coefficients must number at most steps=3"):
        NoiseStructure.banded_toeplitz([1.0, 0.5, 0.2, 0.1], steps=3)
    with pytest.raises(ValueError, match="coefficients must be a non-empty 1-D array"):
        NoiseStructure.banded_toeplitz([], steps=3)
    with pytest.raises(ValueError, match="restart_warmup needs a restart_period"):
        NoiseStructure.tree_aggregation(steps=8, restart_warmup=2)
    with pytest.raises(ValueError, match="restart_warmup"):
        NoiseStructure.tree_aggregation(steps=8, restart_period=4, restart_warmup=4)
    structure = NoiseStructure.independent(steps=4)
    with pytest.raises(ValueError, match=r"participation must name distinct steps in \[0, 4\)"):
        sensitivity(structure, [1, 4])
    with pytest.raises(ValueError, match="min_separation"):
        min_separation_sensitivity(structure, min_separation=0)
    with pytest.raises(ValueError, match="released and gradients must have one shape"):
        whitened_statistic(np.zeros((3, 4)), np.zeros((3, 5)), structure=structure, noise_stddev=1.0)
    with pytest.raises(ValueError, match="more untouched coordinates than steps"):
        estimated_structure(np.zeros((4, 4)))


def test_the_strategy_is_kept_read_only():
    structure = NoiseStructure.independent(steps=3)
    with pytest.raises(ValueError):
        structure.strategy[0, 0] = 2.0


# --- sensitivity and claimed μ ----------------------------------------------------------------------


def test_banded_sensitivity_is_the_column_norms_over_the_participations():
    coef = optimal_max_error_coefficients(4)
    structure = NoiseStructure.banded_toeplitz(coef, steps=16)
    assert sensitivity(structure, [0]) == pytest.approx(np.linalg.norm(coef))
    # four participations 4 apart: orthogonal columns, so the squares add up
    assert sensitivity(structure, [0, 4, 8, 12]) == pytest.approx(2 * np.linalg.norm(coef))
    assert min_separation_sensitivity(structure, min_separation=4) == pytest.approx(2 * np.linalg.norm(coef))
    # the claim's μ = worst sensitivity / τ with τ = σ·‖coef‖, as the plan scales its noise
    sigma = 1.3
    assert min_separation_sensitivity(structure, min_separation=4) / (sigma * np.linalg.norm(coef)) == pytest.approx(
        bandmf_claimed_mu(noise_multiplier=sigma, steps=16, num_bands=4)
    )


def test_a_participation_pattern_closer_than_the_bands_costs_more_than_accounted():
    structure = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(4), steps=16)
    # min-separation 1 allows adjacent steps, whose columns overlap positively
    assert min_separation_sensitivity(structure, min_separation=1) > 2 * min_separation_sensitivity(
        structure, min_separation=4
    )


def test_the_tree_shows_less_than_its_accountant_counts():
    steps = 16
    structure = NoiseStructure.tree_aggregation(steps=steps, restart_period=8)
    shown = max(sensitivity(structure, [i, 8 + i]) for i in range(8))
    claimed = tree_restart_claimed_mu(noise_multiplier=1.0, epoch_steps=[8, 8])
    assert claimed == pytest.approx(math.sqrt(8))
    assert 0.8 * claimed < shown <= claimed


# --- the scorer on simulated releases ---------------------------------------------------------------


@pytest.mark.parametrize("coordinates", [1, 3])
def test_scores_are_standard_normal_and_shifted_by_mu_under_the_stated_structure(coordinates):
    rng = np.random.default_rng(20261128)
    structure, gradients, member = _bandmf_setting(rng, coordinates=coordinates)
    tau = 1.0
    y = _releases(structure, gradients, member, tau, rng)
    z = whitened_statistic(y, gradients, structure=structure, noise_stddev=tau)
    mu = canary_mu(gradients, structure=structure, noise_stddev=tau)
    inside, outside = z[member == 1], z[member == 0]
    se = 1 / math.sqrt(HALF)
    assert _within(outside.mean(), 0.0, se)
    assert _within(outside.var(), 1.0, math.sqrt(2 / HALF))
    assert _within(inside.var(), 1.0, math.sqrt(2 / HALF))
    assert _within((inside - mu[member == 1]).mean(), 0.0, se)
    # the same check refutes a μ stated 20 % off (a noise scale 20 % off in the claim)
    wrong = canary_mu(gradients, structure=structure, noise_stddev=1.2 * tau)
    assert not _within((inside - wrong[member == 1]).mean(), 0.0, se)
    # and ignoring the correlation (C = I) scores with the wrong variance
    naive = whitened_statistic(y, gradients, structure=NoiseStructure.independent(steps=16), noise_stddev=tau)
    assert not _within(naive[member == 0].var(), 1.0, math.sqrt(2 / HALF))


def test_log_likelihood_ratio_at_full_participation_is_mu_z_minus_half_mu_squared():
    rng = np.random.default_rng(1)
    structure, gradients, member = _bandmf_setting(rng)
    y = _releases(structure, gradients, member, 0.7, rng)
    z = whitened_statistic(y, gradients, structure=structure, noise_stddev=0.7)
    mu = canary_mu(gradients, structure=structure, noise_stddev=0.7)
    llr = decorrelated_log_likelihood_ratio(y, gradients, structure=structure, noise_stddev=0.7)
    np.testing.assert_allclose(llr, mu * z - mu**2 / 2)
    # with orthogonal slot columns the per-step form at q → 1 is the same score
    per_step = decorrelated_log_likelihood_ratio(
        y, gradients, structure=structure, noise_stddev=0.7, sampling_rate=1 - 1e-12
    )
    np.testing.assert_allclose(per_step, llr, atol=1e-6)


def test_poisson_participation_scores_separate_members_by_their_likelihood_ratio():
    """At q = 0.5 a member takes part in each of its slots by a coin flip: the LLR's mean is the KL
    divergence, > 0 for members and < 0 for non-members, and the scores rank them (AUC well above ½)."""
    rng = np.random.default_rng(2)
    structure, gradients, member = _bandmf_setting(rng)
    taken = gradients * (rng.random(gradients.shape[:2]) < 0.5)[:, :, None]
    y = _releases(structure, taken, member, 1.0, rng)
    llr = decorrelated_log_likelihood_ratio(y, gradients, structure=structure, noise_stddev=1.0, sampling_rate=0.5)
    inside, outside = llr[member == 1], llr[member == 0]
    assert inside.mean() > 0 > outside.mean()
    auc = np.mean(inside[:, None] > outside[None, :])
    assert auc > 0.75


def test_independent_noise_reduces_to_todays_score():
    rng = np.random.default_rng(3)
    m, steps, sigma = 50, 12, 0.8
    signal = rng.uniform(0.2, 1.0, size=(m, steps))
    projection = rng.standard_normal((m, steps))
    structure = NoiseStructure.independent(steps=steps)
    for q in (0.1, 1.0):
        np.testing.assert_allclose(
            decorrelated_log_likelihood_ratio(projection, signal, structure=structure, noise_stddev=sigma, sampling_rate=q),
            subsampled_gaussian_log_likelihood_ratio(signal, projection, noise_multiplier=sigma, sampling_rate=q),
        )


def test_the_estimated_structure_scores_like_the_stated_one():
    rng = np.random.default_rng(4)
    structure, gradients, member = _bandmf_setting(rng)
    tau = 1.0
    y = _releases(structure, gradients, member, tau, rng)
    untouched_count = 60 * structure.steps
    untouched = _releases(structure, np.zeros((untouched_count, structure.steps, 1)), np.zeros(untouched_count), tau, rng)
    estimated = estimated_structure(untouched[:, :, 0])
    stated = whitened_statistic(y, gradients, structure=structure, noise_stddev=tau)
    plugged = whitened_statistic(y, gradients, structure=estimated, noise_stddev=1.0)
    assert np.corrcoef(stated, plugged)[0, 1] > 0.98
    mu = canary_mu(gradients, structure=structure, noise_stddev=tau)
    se = 1 / math.sqrt(HALF)
    assert _within(plugged[member == 0].mean(), 0.0, se)
    # the plug-in's variance is about 1 + T/K: allow that beside the sampling error
    assert abs(plugged[member == 0].var() - 1.0) <= Z * math.sqrt(2 / HALF) + 2 * structure.steps / untouched_count
    assert _within((plugged[member == 1] - mu[member == 1]).mean(), 0.0, se + mu.mean() * structure.steps / untouched_count)


def _noise(structure: NoiseStructure, tau: float, coordinates: int, rng) -> np.ndarray:
    """(coordinates, T) series of the noise τC⁻¹Z, as untouched coordinates release it."""
    return tau * rng.standard_normal((coordinates, structure.steps)) @ np.linalg.inv(structure.strategy).T


def test_the_structure_fit_keeps_its_level_on_the_stated_noise():
    """400 fits of 64 series over 16 steps (K = 4T, where the uncorrected χ² rejects 4 times too often at 5 %):
    the count below 0.05 is Binomial(400, 0.05), 20 ± 4.4, and below 0.5 Binomial(400, 0.5), 200 ± 10; each is
    allowed 5 s.e."""
    rng = np.random.default_rng(5)
    structure = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(2), steps=16)
    p = np.array([structure_fit(_noise(structure, 1.5, 64, rng), structure=structure, noise_stddev=1.5).p_value for _ in range(400)])
    assert np.sum(p < 0.05) <= 20 + Z * math.sqrt(400 * 0.05 * 0.95)
    assert _within(np.sum(p < 0.5), 200, math.sqrt(400 * 0.25))


def test_the_structure_fit_refutes_another_strategy_or_scale():
    rng = np.random.default_rng(6)
    stated = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(2), steps=16)
    unbanded = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(16), steps=16)
    assert structure_fit(_noise(unbanded, 1.5, 400, rng), structure=stated, noise_stddev=1.5).p_value < 1e-6
    assert structure_fit(_noise(stated, 1.2, 400, rng), structure=stated, noise_stddev=1.5).p_value < 1e-6
    repeated = _noise(stated, 1.5, 400, rng)
    repeated[:, 12:] = repeated[:, [11]]  # a noise stream that repeats its step 11 (no noise in the differences)
    fit = structure_fit(repeated, structure=stated, noise_stddev=1.5)
    assert fit.statistic == math.inf and fit.p_value == 0 and fit.degrees_of_freedom == 16 * 17 // 2


def test_the_audit_scores_by_the_stated_structure_unless_the_untouched_noise_refutes_it():
    """The stated structure and τ while the untouched noise fits them or is too scarce to estimate from (K < 4T);
    else the estimate, which whitens the noise as it is: Ĉ Σ Ĉᵀ ≈ I (K = 2000, entries within 0.15)."""
    rng = np.random.default_rng(7)
    stated = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(2), steps=16)
    unbanded = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(16), steps=16)
    assert scoring_structure(_noise(stated, 1.5, 2000, rng), stated=stated, noise_stddev=1.5) == (stated, 1.5)
    assert scoring_structure(_noise(unbanded, 1.5, 63, rng), stated=stated, noise_stddev=1.5) == (stated, 1.5)
    estimate, tau = scoring_structure(_noise(unbanded, 1.5, 2000, rng), stated=stated, noise_stddev=1.5)
    inverse = 1.5 * np.linalg.inv(unbanded.strategy)
    assert tau == 1.0 and estimate != stated
    np.testing.assert_allclose(estimate.strategy @ inverse @ inverse.T @ estimate.strategy.T, np.eye(16), atol=0.15)


def test_the_estimate_reads_noise_that_repeats_itself_without_noise():
    """A noise stream that repeats step 11's noise from then on (JAX-Privacy 2.0.0's dense privatizer past its
    noising matrix's rows) refutes the stated structure; the floored estimate scores a member whose gradient
    differs between the repeated steps by 0.01 clip norms far above every non-member."""
    rng = np.random.default_rng(8)
    stated = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(2), steps=16)

    def repeating(count):
        noise = _noise(stated, 1.5, count, rng)
        noise[:, 12:] = noise[:, [11]]
        return noise

    estimate, tau = scoring_structure(repeating(2000), stated=stated, noise_stddev=1.5)
    gradients = np.ones((400, 16))
    gradients[:, 12:] = 1.01
    member = np.arange(400) < 200
    released = member[:, None] * gradients + repeating(400)
    z = whitened_statistic(released, gradients, structure=estimate, noise_stddev=tau)
    assert z[member].min() > z[~member].max()
    stated_z = whitened_statistic(released, gradients, structure=stated, noise_stddev=1.5)
    assert stated_z[member].min() < stated_z[~member].max()  # the stated structure's score does not see it


def test_the_tree_structure_whitens_tf_privacys_residual_noise():
    """The tree's C whitens the noise of its own replayed map: σ·C·L has identity covariance."""
    structure = NoiseStructure.tree_aggregation(steps=13, restart_period=5, restart_warmup=2)
    assert _tree_epochs(13, 5, 2) == [2, 5, 5, 1]
    noise_map = _tree_restart_noise_map(13, _tree_epochs(13, 5, 2))
    whitened = structure.strategy @ noise_map
    np.testing.assert_allclose(whitened @ whitened.T, np.eye(13), atol=1e-10)


# --- the libraries' own numbers ---------------------------------------------------------------------


def test_sensitivities_match_jax_privacys():
    pytest.importorskip("jax_privacy", reason="the cross-check with JAX-Privacy runs in the jax environment")
    from jax_privacy.experimental import accounting
    from jax_privacy.matrix_factorization import sensitivity as jp_sensitivity
    from jax_privacy.matrix_factorization import toeplitz

    steps, close = 12, {"rel": 1e-5}  # JAX computes in float32
    for bands in (1, 3, 4):
        coef = np.asarray(toeplitz.optimal_max_error_strategy_coefs(bands))
        np.testing.assert_allclose(optimal_max_error_coefficients(bands), coef, rtol=1e-6)
        structure = NoiseStructure.banded_toeplitz(coef, steps=steps)
        np.testing.assert_allclose(structure.strategy, np.asarray(toeplitz.materialize_lower_triangular(coef, steps)), rtol=1e-6)
        for k in (None, 2):
            assert min_separation_sensitivity(structure, min_separation=bands, max_participations=k) == pytest.approx(
                jp_sensitivity.get_sensitivity_banded(structure.strategy, bands, k), **close
            )
        normalised = NoiseStructure.banded_toeplitz(coef / np.linalg.norm(coef), steps=steps, column_normalize=True)
        streaming = toeplitz.inverse_as_streaming_matrix(coef / np.linalg.norm(coef), column_normalize_for_n=steps)
        np.testing.assert_allclose(np.linalg.inv(normalised.strategy), np.asarray(streaming.materialize(steps)), atol=1e-6)
        event = accounting.amplified_bandmf_event(noise_multiplier=1.5, iterations=steps, num_bands=bands, sampling_prob=1.0)
        assert bandmf_claimed_mu(noise_multiplier=1.5, steps=steps, num_bands=bands) == pytest.approx(
            math.sqrt(event.count) / 1.5
        )
    rng = np.random.default_rng(5)
    dense = NoiseStructure.dense(np.tril(rng.standard_normal((steps, steps))) + 3 * np.eye(steps))
    tree = NoiseStructure.tree_aggregation(steps=steps, restart_period=4)
    for structure in (dense, tree):
        for min_sep, k in ((1, None), (3, 2), (5, None)):
            assert min_separation_sensitivity(structure, min_separation=min_sep, max_participations=k) == pytest.approx(
                jp_sensitivity.get_min_sep_sensitivity_upper_bound(structure.strategy, min_sep, k), **close
            )
    assert max(sensitivity(dense, [i]) for i in range(steps)) == pytest.approx(
        float(jp_sensitivity.single_participation_sensitivity(dense.strategy)), **close
    )


def test_the_tree_matches_tf_privacys_aggregator_and_accountant():
    pytest.importorskip("tensorflow_privacy", reason="the cross-check with TF-Privacy runs in the torch environment")
    import tensorflow as tf
    from tensorflow_privacy.privacy.analysis import tree_aggregation_accountant
    from tensorflow_privacy.privacy.dp_query import restart_query, tree_aggregation_query

    steps, period, coordinates = 11, 4, 20000
    query = restart_query.RestartQuery(
        tree_aggregation_query.TreeResidualSumQuery.build_l2_gaussian_query(
            1.0, 1.0, [tf.TensorSpec([coordinates])], noise_seed=7
        ),
        restart_query.PeriodicRoundRestartIndicator(period=period),
    )
    state = query.initial_global_state()
    zero = [tf.zeros([coordinates])]
    noise = []
    for _ in range(steps):
        released, state, _ = query.get_noised_result(zero, state)
        noise.append(released[0].numpy())
    noise = np.array(noise, dtype=np.float64)  # steps × coordinates: the updates' noise at σ = 1
    whitened = NoiseStructure.tree_aggregation(steps=steps, restart_period=period).strategy @ noise
    covariance = whitened @ whitened.T / coordinates
    # each entry's standard error is about 1/√K = 0.007 (√2/√K on the diagonal)
    np.testing.assert_allclose(covariance, np.eye(steps), atol=Z * math.sqrt(2 / coordinates))

    orders = [2.0, 8.0]
    rdp = tree_aggregation_accountant.compute_rdp_tree_restart(1.3, [4, 4, 3], orders)
    mu = tree_restart_claimed_mu(noise_multiplier=1.3, epoch_steps=[4, 4, 3])
    np.testing.assert_allclose(rdp, [a * mu**2 / 2 for a in orders])
