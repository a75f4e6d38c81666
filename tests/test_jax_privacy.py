"""The JAX-Privacy plugin: its claim, calibration, the DP step of each variant on the library's real calls,
the 2.0.0 accumulation check (#287), conformance of both paths, and its refusals.

Tests that need JAX-Privacy skip with a reason where it is not installed (its own environment: see the
README, "Environments"). The statistical checks state their tolerance and error rate.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import dpverify_jaxprivacy
from dpverify.conformance import run_conformance, small_request
from dpverify.seeds import seeds_for
from tests.updates import applied_batches, dirac_request, observed

CORRECT = ("jax-privacy-core", "jax-privacy-keras")
KNOWN_ISSUES = {
    "jax-privacy-keras-accumulation": "https://github.com/google-deepmind/jax_privacy/pull/287",
    "jax-privacy-keras-fixed-batches": "https://github.com/google-deepmind/jax_privacy/issues/84",
}
STEPS = ("no_noise", "no_clipping", "noise_for_mean", "noise_for_clip_norm")


@pytest.fixture(scope="module")
def jax_privacy():
    return pytest.importorskip("jax_privacy", reason="needs JAX-Privacy, which has its own environment: see the README")


def implementation(name):
    """The implementation ``name``; the test skips where the installed release lacks its path (``n/a``)."""
    chosen = next(impl for impl in dpverify_jaxprivacy.implementations() if impl.info.name == name)
    reason = chosen.unavailable_reason()
    if reason is not None and reason.startswith("n/a: "):
        pytest.skip(reason)
    return chosen


def test_listing_does_not_import_jax():
    code = "import sys, dpverify_jaxprivacy as p; p.implementations(); print(sorted(m for m in ('jax', 'keras', 'jax_privacy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_infos():
    infos = {impl.info.name: impl.info for impl in dpverify_jaxprivacy.implementations()}
    for name in CORRECT:
        assert infos[name].expected == "private"
    for name, link in KNOWN_ISSUES.items():
        assert infos[name].expected == "known-issue" and infos[name].issue == link
    for path in ("", "-keras"):
        for step in STEPS:
            info = infos[f"jax-privacy{path}-{step.replace('_', '-')}"]
            assert info.expected == "violation" and info.bug in (1, 2, 3) and info.detectability in ("D1", "D2")
    assert all(info.library == "jax-privacy" and info.extra == "jax-privacy" for info in infos.values())


def test_the_claim_is_the_librarys_pld_account(jax_privacy):
    """The claim agrees with dp_accounting's PLD of the same composition, composed here without the library
    (the library's discretisation 1e-3 is pessimistic: its ε may exceed the finer one by a few thousandths)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from dpverify_jaxprivacy import _accounting

    for sigma, q, steps in ((1.0, 0.1, 50), (3.0, 1.0, 10), (0.8, 0.01, 1000)):
        claim = _accounting.claim(sigma, q, steps, 1e-5)
        direct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        direct.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
        assert claim.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=0.01)
        assert (claim.noise_multiplier, claim.sampling_rate, claim.steps) == (sigma, q, steps)
    assert math.isinf(_accounting.claim(0.0, 0.5, 3, 1e-5).epsilon)


def test_q_is_given_to_the_accountant_as_an_exact_ratio(jax_privacy):
    from dpverify_jaxprivacy import _accounting

    assert _accounting.batch_and_size(1.0) == (1, 1)
    assert _accounting.batch_and_size(0.5) == (1, 2)
    assert _accounting.batch_and_size(0.01) == (1, 100)
    with pytest.raises(ValueError, match="no ratio of integers"):
        _accounting.batch_and_size(1e-12)  # 1/10^12: no denominator up to 1e9


def _zero_gradient_noise(step, *, sigma, coordinates=200_000):
    """The noise a DP step adds to a zero sum: its standard deviation over ``coordinates`` i.i.d. draws
    (relative standard error 1/√(2·coordinates) = 0.16 %), through the installed release's privatizer."""
    import jax
    import jax.numpy as jnp

    from dpverify_jaxprivacy import _api

    grad = step.clipped_grad(lambda p, x: 0.0 * jnp.sum(p * x), l2_clip_norm=step.clip_norm, rescale_to_unit_norm=True)
    zeros = jnp.zeros(coordinates)
    noisy, _ = _api.add_noise(zeros, _api.noise_state(zeros, jax.random.key(0)), step.noise_stddev(sigma * grad.l2_norm_bound))
    return float(np.std(np.asarray(noisy)))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("correct", 2.0), ("no_noise", 0.0), ("no_clipping", 2.0), ("noise_for_mean", 2.0 / 8), ("noise_for_clip_norm", 2.0 * 0.5)],
)
def test_each_step_adds_the_noise_it_is_built_to(jax_privacy, kind, expected):
    """σ = 2 on the unit-rescaled sum (sensitivity 1): the correct step adds sd 2 and each variant what its
    bug makes it (within 1 %, 6 standard errors)."""
    from dpverify_jaxprivacy._steps import DPStep

    assert _zero_gradient_noise(DPStep(kind=kind, clip_norm=0.5, batch_size=8.0), sigma=2.0) == pytest.approx(expected, rel=0.01, abs=1e-12)


@pytest.mark.parametrize("kind", ["correct", "no_clipping"])
def test_rows_are_clipped_except_in_the_no_clipping_step(jax_privacy, kind):
    """Two records with gradients of norm 3 and 0.1 at C = 0.5: the correct sum is (0.5 + 0.1)/C in unit
    norm; without clipping it is (3 + 0.1)/C, the bound the callable states still 1."""
    import jax.numpy as jnp

    from dpverify_jaxprivacy._steps import DPStep

    step = DPStep(kind=kind, clip_norm=0.5, batch_size=2.0)
    grad = step.clipped_grad(lambda p, x: jnp.sum(p * x), l2_clip_norm=0.5, rescale_to_unit_norm=True)
    total = grad(jnp.zeros(1), jnp.array([[3.0], [0.1]]))
    assert grad.l2_norm_bound == 1.0
    assert float(total[0]) == pytest.approx((3.1 if kind == "no_clipping" else 0.6) / 0.5, rel=1e-5)


@pytest.mark.parametrize("rescale", [True, False])
def test_the_unclipped_sum_states_the_librarys_bound(jax_privacy, rescale):
    """The no-clipping step states the bound the library states for the same arguments (the Keras API
    normalises by its batch size, and its noise is σ times this bound)."""
    import jax.numpy as jnp

    from dpverify_jaxprivacy._steps import DPStep

    def loss(p, x):
        return jnp.sum(p * x)

    bounds = [
        DPStep(kind=kind, clip_norm=0.5, batch_size=8.0)
        .clipped_grad(loss, l2_clip_norm=0.5, rescale_to_unit_norm=rescale, normalize_by=8.0)
        .l2_norm_bound
        for kind in ("correct", "no_clipping")
    ]
    assert bounds[0] == bounds[1] == (1.0 if rescale else 0.5) / 8.0


def test_the_library_calls_are_restored_after_a_keras_fit(jax_privacy):
    from jax_privacy import noise_addition

    from dpverify_jaxprivacy._steps import DPStep, library_calls

    before = (jax_privacy.clipped_grad, noise_addition.gaussian_privatizer)
    with pytest.raises(RuntimeError, match="inside"):
        with library_calls(DPStep(kind="no_noise", clip_norm=1.0, batch_size=1.0)):
            assert jax_privacy.clipped_grad is not before[0]
            raise RuntimeError("inside")
    assert (jax_privacy.clipped_grad, noise_addition.gaussian_privatizer) == before


def test_the_keras_path_takes_each_variants_step(jax_privacy):
    """The Keras API runs the variant's step in ``fit``, not the library's: one full-batch step from zero
    weights is w = -lr·(clipped sum + noise)/B with the same batch and noise key in every run, so against the
    no-noise run each variant's noise is the correct run's times what its bug makes it (1/B for the mean's,
    C for the clip norm's), and the unclipped sum moves the weights far more than the clipped one, by the
    same noise. What the audits of the core variants catch, the Keras path would give the same way."""
    from dpverify_jaxprivacy._keras import KerasCall, train_keras

    for step in STEPS:
        implementation(f"jax-privacy-keras-{step.replace('_', '-')}")
    request = small_request(num_records=8, hidden_width=0, sampling_rate=1.0, noise_multiplier=2.0,
                            max_grad_norm=0.5, feature_scale=10.0)  # fmt: skip
    runs = {kind: train_keras(request, kind, KerasCall()).params for kind in ("correct", *STEPS)}

    def moved(kind, base="no_noise"):
        return np.concatenate([(runs[kind][name] - runs[base][name]).ravel() for name in ("w", "b")])

    noise = moved("correct")
    assert np.linalg.norm(noise) > 0
    tolerance = dict(rtol=1e-3, atol=1e-4 * np.abs(noise).max())
    np.testing.assert_allclose(moved("noise_for_mean"), noise / 8, **tolerance)
    np.testing.assert_allclose(moved("noise_for_clip_norm"), noise * 0.5, **tolerance)
    clipped = np.concatenate([runs["no_noise"][name].ravel() for name in ("w", "b")])
    assert np.linalg.norm(moved("no_clipping", base="correct")) > 5 * np.linalg.norm(clipped)


def test_the_core_step_is_traced_once_for_runs_of_other_sizes_and_noise(jax_privacy):
    """Runs whose size, normaliser and σ differ but whose padded batch has the same shape share one traced
    step (a trace costs seconds, a step of this size milliseconds): the noise's stddev and the update's scale
    are the traced step's arguments, never its constants."""
    from dpverify_jaxprivacy import _core

    _core._traced_step.cache_clear()
    for num_records, sigma in ((60, 1.0), (50, 3.0)):
        request = small_request(num_records=num_records, sampling_rate=1.0, noise_multiplier=sigma)
        _core.train_core(request, "correct", sigma)
    assert _core._traced_step.cache_info().currsize == 1


@pytest.mark.parametrize("name", CORRECT + ("jax-privacy-keras-fixed-batches",))
def test_conformance(jax_privacy, name):
    run_conformance(implementation(name))


def test_the_config_accepts_noise_for_the_physical_batch(jax_privacy):
    """#287 without training: with 8 accumulation steps the smallest σ DPKerasConfig accepts is what its check
    computes at the physical batch, far below the library's own calibration at the accumulated batch (1.0.0's
    config as 2.0.0's)."""
    from dpverify_jaxprivacy import _accounting
    from dpverify_jaxprivacy._keras import smallest_accepted_noise

    n, batch, k, steps = 1024, 16, 8, 80
    sigma = smallest_accepted_noise(
        epsilon=2.0, delta=1e-5, clipping_norm=1.0, batch_size=batch, accumulation=k, train_steps=steps, train_size=n
    )
    own = _accounting.calibrate_noise_multiplier(2.0, batch * k, n, steps, 1e-5)
    assert sigma < 0.8 * own
    assert _accounting.epsilon(sigma, batch * k, n, steps, 1e-5) > 2.0 * 1.5


def test_the_accumulating_run_claims_the_physical_batchs_q(jax_privacy):
    """#287 in training: the claim states the physical batch's q (the conformance check that the claim's q is
    the run's fails). 2.0.0 only: 1.0.0's fit has no Poisson sampling to accumulate."""
    request = small_request(num_records=128, target_epsilon=2.0, sampling_rate=1.0, epochs=1)
    trained = implementation("jax-privacy-keras-accumulation").train(request)
    assert trained.claim.sampling_rate == pytest.approx(1 / 8) and trained.claim.steps == 8
    assert trained.claim.epsilon <= 2.0 + 0.1  # the config's check allows 0.1 above its target


def test_tags_and_a_fractional_batch_are_refused_with_the_fix(jax_privacy):
    import dataclasses

    tagged = dataclasses.replace(
        small_request(), tags=np.zeros((100, 1), np.int64), num_tags=2
    )
    with pytest.raises(RuntimeError, match="jax-privacy-core: .*no UniAud\\+\\+ tags"):
        implementation("jax-privacy-core").train(tagged)
    request = small_request(num_records=10, sampling_rate=0.25)  # qN = 2.5: no whole batch size
    with pytest.raises(RuntimeError, match=r"jax-privacy-keras: .*whole batch size.*2\.5"):
        implementation("jax-privacy-keras").train(request)


# --- every released update ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORRECT + ("jax-privacy-keras-fixed-batches",))
def test_every_update_is_handed_over_and_is_the_dp_step_on_its_batch(jax_privacy, name):
    """Softmax regression on 4 Dirac records, q = 1/4, 2 epochs, σ = 0: the observer gets steps 0..8 as
    [(C, d), (C,)] (kernels transposed), and each difference is exactly −lr · the clipped gradients of the
    step's batch over the normaliser (qN = 1 for Poisson batches, B = 1 for fixed ones). The core path's and
    the fixed path's batches are their samplers'; the Keras API draws its Poisson batches inside fit."""
    from dpverify_jaxprivacy import _api
    from dpverify_jaxprivacy._keras import ShuffledBatches

    request, handed = observed(dirac_request())
    implementation(name).train(request)
    batches = [b.tolist() for b in applied_batches(request, handed, normaliser=1.0)]
    hp, seeds = request.hyperparameters, seeds_for(request.seed)
    if name == "jax-privacy-core":
        sampled = _api.poisson_batches(
            num_examples=request.num_records, sampling_prob=hp.sampling_rate, iterations=hp.steps, rng=seeds.sampling
        )
        assert batches == [sorted(b) for b in sampled]
    elif name == "jax-privacy-keras-fixed-batches":
        data = ShuffledBatches(request.features, request.labels, batch_size=1, steps=hp.steps, seed=seeds.sampling)
        assert batches == [sorted(b) for b in data.batches.tolist()]
        assert sorted(sum(batches[:4], [])) == sorted(sum(batches[4:], [])) == [0, 1, 2, 3]  # each record once an epoch


def test_fixed_batches_are_full_and_the_remainder_sits_out(jax_privacy):
    """N = 5 at q = 1/2: B = round(2.5) = 2, each epoch two full batches of a random order and one record
    left out; exactly the request's 6 steps; the claim is the library's Poisson account at q = B/N = 0.4.
    Why not Keras' own batching: fit(x, y, batch_size=2) on 5 records hands over a short last batch, which
    the library's train step refuses."""
    import keras

    from dpverify_jaxprivacy._api import keras_api

    request, handed = observed(dirac_request(records=5, sampling_rate=0.5, epochs=3))
    trained = implementation("jax-privacy-keras-fixed-batches").train(request)
    moved = [np.flatnonzero(np.any(b[0] != a[0], axis=0)).tolist() for (_, a), (_, b) in zip(handed, handed[1:])]
    assert [len(m) for m in moved] == [2] * 6
    for epoch in (moved[0:2], moved[2:4], moved[4:6]):
        assert len(set(sum(epoch, []))) == 4  # four records, one sat out
    assert trained.claim.sampling_rate == 0.4 and trained.claim.steps == 6

    config = keras_api.DPKerasConfig(
        epsilon=100.0, delta=1e-5, clipping_norm=1.0, batch_size=2, gradient_accumulation_steps=1, train_steps=3,
        train_size=5, noise_multiplier=2.0,
    )
    model = keras_api.make_private(keras.Sequential([keras.Input(shape=(6,)), keras.layers.Dense(3)]), config)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="batch size in the DP parameters is not equal to the batch size of the actual data"):
        model.fit(request.features, request.labels, batch_size=2, epochs=1, verbose=0)


def test_at_q_1_the_fixed_batch_is_the_full_batch(jax_privacy):
    """The one-run audits' q = 1: B = N = 130 (which no microbatch of 128 divides), every step applies every
    record's clipped gradient over N, and the claim is the Poisson account at q = 1."""
    request, handed = observed(dirac_request(records=130, sampling_rate=1.0, epochs=2))
    trained = implementation("jax-privacy-keras-fixed-batches").train(request)
    assert [b.size for b in applied_batches(request, handed, normaliser=130.0)] == [130, 130]
    assert (trained.claim.sampling_rate, trained.claim.steps) == (1.0, 2)


def test_the_matrix_factorization_paths_are_not_applicable_before_2_0_0(jax_privacy, monkeypatch):
    """The BandMF plan and the dense privatizer path call 2.0.0's API: on 1.0.0 they are ``n/a`` with what they
    need (the release gate then skips them), never an ImportError in the audit."""
    from dpverify_jaxprivacy import _releases

    correlated = [impl for impl in dpverify_jaxprivacy.implementations() if "-mf" in impl.info.name or "bandmf" in impl.info.name]
    assert {impl.info.name for impl in correlated} >= {"jax-privacy-bandmf", "jax-privacy-dense-mf"}
    assert all(impl.unavailable_reason() is None for impl in correlated)
    monkeypatch.setattr(_releases, "installed_version", lambda: (1,))
    for impl in correlated:
        reason = impl.unavailable_reason()
        assert reason.startswith(f"n/a: {impl.info.name} needs ") and "first in JAX-Privacy 2.0.0" in reason, reason
