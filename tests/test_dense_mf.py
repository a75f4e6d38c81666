"""JAX-Privacy's dense ``matrix_factorization_privatizer`` path (``jax-privacy-dense-mf``): its batches, the noise
it adds in the units the every-update audit reads the claim in, its variants, and 2.0.0's dense privatizer read
past its noising matrix's rows (google-deepmind/jax_privacy PR #338).

The fast tests train a few Dirac records with many input coordinates no record touches: those columns of the
weights move by the privatizer's noise alone, so their updates are the noise each step added, in clip norms
(update · normaliser / (lr · C)). Tests skip where JAX-Privacy is not installed (its own environment).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.updates import applied_batches, dirac_request, observed

pytest.importorskip("jax_privacy", reason="needs JAX-Privacy, which has its own environment: see the README")

from dpverify.stats.correlated import (  # noqa: E402
    STRUCTURE_FIT_LEVEL,
    min_separation_sensitivity,
    scoring_structure,
    structure_fit,
)
from dpverify.stats.events import correlated_release  # noqa: E402
from dpverify_jaxprivacy import _matrix_factorization as dense_mf  # noqa: E402

#: Untouched input coordinates of the noise tests: 3 classes each, 1200 noise series for a T = 8 covariance,
#: whose entries then have a standard error of about 1/√1200 = 0.03.
UNTOUCHED = 400


def implementation(name):
    return next(impl for impl in dense_mf.implementations() if impl.info.name == name)


def run(kind: str, *, sampling_rate: float = 1.0, epochs: int = 8, noise_multiplier: float = 1.0):
    """Train ``kind`` on 4 Dirac records and :data:`UNTOUCHED` untouched coordinates; (its claim, each step's noise
    (series, T) in clip norms read off the untouched columns, the parameters handed over, the request)."""
    records = 4
    request = dirac_request(records=records, sampling_rate=sampling_rate, epochs=epochs, noise_multiplier=noise_multiplier)
    features = np.zeros((records, records + UNTOUCHED), dtype=np.float32)
    features[:, :records] = request.features[:, :records]
    request, handed = observed(dataclasses.replace(request, features=features))
    impl = dense_mf.DenseMatrixFactorization(implementation("jax-privacy-dense-mf").info, kind)
    trained = impl.train(request)
    hp = request.hyperparameters
    weights = np.stack([params[0] for _, params in handed])  # (T + 1, classes, d)
    moved = np.diff(weights, axis=0)[:, :, records:]  # (T, classes, untouched)
    noise = -moved * hp.normaliser(request.num_records) / (hp.learning_rate * hp.max_grad_norm)
    return trained.claim, noise.reshape(hp.steps, -1).T.astype(np.float64), handed, request


def test_the_implementations_are_registered_with_their_classes():
    infos = {impl.info.name: impl.info for impl in dense_mf.implementations()}
    assert infos["jax-privacy-dense-mf"].expected == "private"
    assert (infos["jax-privacy-dense-mf-single-participation"].bug, infos["jax-privacy-dense-mf-mismatched-noising"].bug) == (13, 15)
    finding = infos.pop("jax-privacy-dense-mf-short-noising")
    assert (finding.expected, finding.bug, finding.issue) == ("known-issue", 15, dense_mf.PAST_ROWS_REFUSED)
    assert all(info.expected == "violation" for name, info in infos.items() if name != "jax-privacy-dense-mf")


def test_the_batches_are_the_librarys_fixed_cycle_each_record_every_b_steps():
    """σ = 0, q = 1/2: each step's update is exactly the noiseless step of its group, and each record takes part
    in every other step, always in the same phase (the min-separation the sensitivity is computed for)."""
    request, handed = observed(dirac_request(records=8, sampling_rate=0.5, epochs=3))
    implementation("jax-privacy-dense-mf").train(request)
    batches = applied_batches(request, handed, request.hyperparameters.normaliser(request.num_records))
    for record in range(8):
        steps = [t for t, batch in enumerate(batches) if record in batch]
        assert len(steps) == 3 and np.all(np.diff(steps) == 2), (record, steps)


def test_the_noise_whitened_by_the_claimed_strategy_is_white_with_the_claims_tau():
    """The library's noise, whitened by the claim's C, is i.i.d. N(0, τ²) with τ the audit's
    (:func:`correlated_release`: σ times the every-step sensitivity), which is the library's own min-separation
    sensitivity at q = 1. Each whitened covariance entry is within 0.2 of the identity's (about 6 standard errors)."""
    claim, noise, _, _ = run("correct")
    release = correlated_release(claim)
    structure, tau = release.structure, release.noise_stddev
    assert tau == pytest.approx(dense_mf._noise_sensitivity("correct", 8, 1), rel=1e-5)
    assert tau == pytest.approx(min_separation_sensitivity(structure, min_separation=1), rel=1e-5)
    whitened = noise @ structure.strategy.T / tau
    np.testing.assert_allclose(whitened.T @ whitened / whitened.shape[0], np.eye(8), atol=0.2)
    assert scoring_structure(noise, stated=structure, noise_stddev=tau) == (structure, tau)  # fails w.p. 10⁻³


def test_the_single_participation_variant_adds_the_noise_of_one_participation():
    """Its whitened noise has variance (largest column norm / ‖C·1‖)² of the claim's: 0.15 at 8 steps and 2 bands."""
    claim, noise, _, _ = run("single_participation")
    release = correlated_release(claim)
    structure, tau = release.structure, release.noise_stddev
    whitened = noise @ structure.strategy.T / tau
    expected = (np.linalg.norm(structure.strategy, axis=0).max() / np.linalg.norm(structure.strategy.sum(axis=1))) ** 2
    assert np.mean(whitened**2) == pytest.approx(expected, rel=0.15)


def test_the_mismatched_variant_draws_noise_another_strategy_correlates():
    """Whitened by the claimed C its noise has covariance W Wᵀ, W = C·C_full⁻¹ with C_full the unbanded
    strategy the noising matrix inverts (each entry within 0.2), not the identity the claim states."""
    claim, noise, _, _ = run("mismatched_noising")
    release = correlated_release(claim)
    structure, tau = release.structure, release.noise_stddev
    whitened = noise @ structure.strategy.T / tau
    mixing = structure.strategy @ np.linalg.inv(np.asarray(dense_mf._toeplitz(8, 8), dtype=np.float64))
    covariance = whitened.T @ whitened / whitened.shape[0]
    np.testing.assert_allclose(covariance, mixing @ mixing.T, atol=0.2)
    assert np.abs(mixing @ mixing.T - np.eye(8)).max() > 0.3  # 0.4: farther from white than the tolerance
    assert structure_fit(noise, structure=structure, noise_stddev=tau).p_value < STRUCTURE_FIT_LEVEL  # scored as it is


def test_release_2_0_0s_dense_privatizer_repeats_its_last_row_past_the_noising_matrix():
    """The finding (the module docstring of :mod:`dpverify_jaxprivacy._matrix_factorization`): a noising matrix of
    ⌈T/2⌉ rows on a T-step run. From step ⌈T/2⌉ on the privatizer reads its last row again with the same key, so
    every later step adds the very noise of step ⌈T/2⌉ − 1; the first half's noise differs step to step. A
    release that refuses to read past the rows (PR #338: an IndexError) fails this test, which then says what to update."""
    from jax_privacy import noise_addition

    from dpverify_jaxprivacy._jax import jnp

    rows = dense_mf._noising_matrix("short_noising", 8)
    assert rows.shape == (4, 4)
    privatizer = noise_addition.matrix_factorization_privatizer(rows, stddev=1.0, prng_key=0)
    zero = jnp.zeros(16)
    state = privatizer.init(zero)
    noises = []
    for _ in range(8):
        try:
            noise, state = privatizer.update(zero, state)
        except IndexError:
            pytest.fail("this release refuses to read past the noising matrix's rows (PR #338): the finding is fixed, "
                        "so update docs/bugs.md class 15 and dpverify_jaxprivacy._matrix_factorization's docstring")  # fmt: skip
        noises.append(np.asarray(noise))
    assert all(not np.array_equal(a, b) for a, b in zip(noises[:3], noises[1:4]))
    assert all(np.array_equal(noises[3], later) for later in noises[4:])


def test_a_rate_that_is_no_whole_cycle_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="sampling_rate must be 1/b for a whole b"):
        dense_mf.cycle_length(0.3)


def audit_config(seed: int):
    """The default gate's every-update audit of correlated noise at the quick profile (q = 1, a record in every one
    of 32 steps, target ε = 4 at δ = 1e-5: σ = 1.081, claimed μ = 0.925; 16 runs of 500 Dirac canaries, one-sided)
    at confidence 0.99: a true claim is refuted with probability at most 1 %."""
    from dpverify.config import every_update_config

    return every_update_config("quick", {"device": "cpu"}, correlated=True).with_overrides(confidence=0.99, seed=seed)


@pytest.mark.slow
def test_the_library_path_passes_its_every_update_audit():
    """Refuted with probability at most 1 %; it passed on 5 of 5 seeds at 8 runs (benchmarks/results/dense-mf.md),
    its scores carrying ρ 0.90–0.94 of the claimed μ (numpy ceiling 1.00). About 15 CPU-s with the trace."""
    from dpverify.audits import run_audit

    result = run_audit(implementation("jax-privacy-dense-mf"), audit_config(seed=0))
    assert result.verdict == "pass" and not result.curve_refuted, result.summary()
    assert result.observed == "every update"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jax-privacy-dense-mf-single-participation", "jax-privacy-dense-mf-mismatched-noising"])
def test_each_variant_is_refuted_by_its_every_update_audit(name):
    """Both were refuted on 5 of 5 seeds at 8 runs (benchmarks/results/dense-mf.md): the single-participation
    stddev leaves a true μ of 7.5 against the claimed 1, the mismatched noising matrix one of 3.1, of which the
    claimed strategy's score reaches 2.7 (numpy ceiling). About 5 CPU-s each once traced."""
    from dpverify.audits import run_audit

    result = run_audit(implementation(name), audit_config(seed=0))
    assert result.verdict == "violation" and result.curve_refuted, result.summary()
