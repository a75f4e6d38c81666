"""The every-update score of BandMF's amplified event: cyclic participation every b steps (the strategy's
bands), Poisson-subsampled per participation, mixed over the phase the audit does not see; and the events
it still cannot read, refused with the reason."""

import dp_accounting
import numpy as np
import pytest

from dpverify.contract import PrivacyClaim
from dpverify.stats import correlated
from dpverify.stats.correlated import NoiseStructure, optimal_max_error_coefficients
from dpverify.stats.events import correlated_release


def _claim(event, structure):
    return PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="test", dp_event=event, noise_structure=structure)


def _bandmf_event(sigma, q, rounds):
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds)


def test_the_bandwidth_is_one_more_than_the_largest_lag():
    assert correlated.bandwidth(NoiseStructure.independent(steps=5)) == 1
    assert correlated.bandwidth(NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(3), steps=9)) == 3


def test_bandmfs_amplified_event_reads_as_cyclic_participation_with_tau_sigma_times_the_coefficients_norm():
    """amplified_bandmf_event composes ⌈T/b⌉ Poisson-sampled Gaussians of σ; the plan's noise is σ·‖coef‖."""
    coef = optimal_max_error_coefficients(4)
    structure = NoiseStructure.banded_toeplitz(coef, steps=18)
    release = correlated_release(_claim(_bandmf_event(0.7, 0.25, 5), structure))
    assert (release.cycle, release.sampling_rate) == (4, 0.25)
    assert release.noise_stddev == pytest.approx(0.7 * np.linalg.norm(coef))
    full = correlated_release(_claim(_bandmf_event(0.7, 1.0, 5), structure))
    assert full.cycle == 4 and full.noise_stddev == pytest.approx(release.noise_stddev)


def test_an_event_of_participations_of_several_gaussians_reads_as_cyclic_with_tau_for_the_worst_step():
    """SelfComposedDpEvent(SelfComposedDpEvent(GaussianDpEvent(σ), k), ⌈T/b⌉): a record once every b steps,
    each time k Gaussians of σ (DP-FTRL's tree of depth k restarted every b = 4 steps, k = 3), so the
    largest column's whitened signal is the claimed √k/σ: τ = σ·max‖Ce_i‖/√k, at most the library's σ
    (the tree's columns fall short of √k). Flat, the same k·⌈T/b⌉ Gaussians read as a full batch."""
    structure = NoiseStructure.tree_aggregation(steps=32, restart_period=4)
    node = dp_accounting.GaussianDpEvent(2.0)
    release = correlated_release(_claim(dp_accounting.SelfComposedDpEvent(dp_accounting.SelfComposedDpEvent(node, 3), 8), structure))
    column = float(np.linalg.norm(structure.strategy, axis=0).max())
    assert (release.cycle, release.sampling_rate) == (4, 1.0)
    assert release.noise_stddev == pytest.approx(2.0 * column / np.sqrt(3)) and column < np.sqrt(3)
    assert correlated_release(_claim(dp_accounting.SelfComposedDpEvent(node, 24), structure)).cycle == 1
    sampled = dp_accounting.SelfComposedDpEvent(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.5, node), 3), 8)
    with pytest.raises(ValueError, match="full-batch Gaussian event"):
        correlated_release(_claim(sampled, structure))


@pytest.mark.parametrize(
    "event, reason",
    [
        (_bandmf_event(1.0, 0.5, 18), "at sampling rate 0.5"),  # Poisson at every step of a 4-band strategy: overlapping
        (_bandmf_event(1.0, 0.5, 7), "composes 7 Gaussians"),  # sampled, neither every step nor every 4th
    ],
)
def test_an_event_of_neither_participation_is_refused_with_the_reason(event, reason):
    structure = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(4), steps=18)
    with pytest.raises(ValueError, match="full-batch Gaussian event") as refused:
        correlated_release(_claim(event, structure))
    assert reason in str(refused.value)


def test_independent_noise_at_every_step_reads_as_dp_sgd_at_any_rate():
    release = correlated_release(_claim(_bandmf_event(2.0, 0.1, 6), NoiseStructure.independent(steps=6)))
    assert (release.cycle, release.sampling_rate, release.noise_stddev) == (1, 0.1, pytest.approx(2.0))


def test_the_cyclic_score_is_the_phase_mixture_of_the_decorrelated_scores():
    rng = np.random.default_rng(0)
    structure = NoiseStructure.banded_toeplitz(optimal_max_error_coefficients(2), steps=6)
    released, gradients = rng.normal(size=(5, 6, 3)), rng.normal(size=(5, 6, 3))
    one = correlated.cyclic_log_likelihood_ratio(released, gradients, structure=structure, noise_stddev=1.3, cycle=1, sampling_rate=0.3)
    same = correlated.decorrelated_log_likelihood_ratio(released, gradients, structure=structure, noise_stddev=1.3, sampling_rate=0.3)
    np.testing.assert_allclose(one, same)
    phases = [np.where((np.arange(6) % 2 == j)[None, :, None], gradients, 0.0) for j in (0, 1)]
    each = [correlated.decorrelated_log_likelihood_ratio(released, g, structure=structure, noise_stddev=1.3, sampling_rate=0.3) for g in phases]
    mixed = correlated.cyclic_log_likelihood_ratio(released, gradients, structure=structure, noise_stddev=1.3, cycle=2, sampling_rate=0.3)
    np.testing.assert_allclose(mixed, np.log((np.exp(each[0]) + np.exp(each[1])) / 2))


def test_the_cyclic_score_keeps_its_level_on_pure_noise():
    """Non-members' scores (pure correlated noise) do not depend on the claim being true: their mean
    log-likelihood ratio is negative (−KL) and no more than 1 % of 4000 exceed log 20 (Markov: E[LR] = 1
    bounds that share by 1/20; observed far below)."""
    rng = np.random.default_rng(1)
    coef = optimal_max_error_coefficients(2)
    structure = NoiseStructure.banded_toeplitz(coef, steps=20)
    tau = float(np.linalg.norm(coef))
    noise = tau * rng.standard_normal((4000, 20)) @ np.linalg.inv(structure.strategy).T
    scores = correlated.cyclic_log_likelihood_ratio(noise, np.ones_like(noise), structure=structure, noise_stddev=tau, cycle=2, sampling_rate=0.5)
    assert scores.mean() < 0 and np.mean(scores > np.log(20)) < 0.01
    assert abs(np.mean(np.exp(scores)) - 1) < 0.15  # E[LR] = 1 under the null
