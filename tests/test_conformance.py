"""Every registered classification implementation passes the conformance suite on a tiny request.

Parametrised over ``registered_implementations()`` with ``task == "classification"`` (built-ins and
anything registered through the entry point group; language models: tests/test_language_conformance.py), ids = names; an implementation whose library is missing is skipped with its reason.
A variant whose bug is an accountant fed the wrong numbers (docs/bugs.md class 8) must *fail* the
claim-matches-request check: that check is how conformance catches it without an audit. Every one, the
reference included, trains the designated models: a zero-initialised softmax regression for hidden width
0 and a model with hidden units for an MLP, as the black box shows.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from dpverify import conformance
from dpverify.contract import DPHyperparameters, Implementation, ImplementationInfo, MLPArchitecture, PrivacyClaim, TrainedModel
from dpverify.registry import registered_implementations
from tests.doubles import NumpyDPSGD

IMPLEMENTATIONS = [impl for impl in registered_implementations() if impl.info.task == "classification"]
ACCOUNTANT_BUG = 8
TARGET_EPSILON = 1.0


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny models train several times faster on one thread (no OpenMP spin on a shared 2-core box)."""
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained_cache():
    return {}


def _available(impl: Implementation) -> Implementation:
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return impl


def _trained(cache, impl, request, key):
    if (impl.info.name, key) not in cache:
        cache[impl.info.name, key] = impl.train(request)
    return cache[impl.info.name, key]


@pytest.fixture(scope="module")
def request_sigma():
    return conformance.small_request()


@pytest.fixture(scope="module")
def request_target(request_sigma):
    return conformance.with_target_epsilon(request_sigma, TARGET_EPSILON)


def test_registry_is_not_empty():
    names = [impl.info.name for impl in IMPLEMENTATIONS]
    assert {"reference-dpsgd", "opacus-ghost", "opacus-hooks"} <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.info.name)
def test_output_contract_and_claim(impl, request_sigma, trained_cache):
    impl = _available(impl)
    trained = _trained(trained_cache, impl, request_sigma, "sigma")
    conformance.check_output_contract(impl, request_sigma, trained)
    conformance.check_hidden_layer(impl, request_sigma, trained)
    if impl.info.bug == ACCOUNTANT_BUG:
        with pytest.raises(AssertionError, match=impl.info.name):
            conformance.check_claim_matches_request(impl, request_sigma, trained)
    else:
        conformance.check_claim_matches_request(impl, request_sigma, trained)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.info.name)
def test_determinism(impl, request_sigma, trained_cache):
    impl = _available(impl)
    conformance.check_determinism(impl, request_sigma, _trained(trained_cache, impl, request_sigma, "sigma"))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.info.name)
def test_calibration(impl, request_target):
    impl = _available(impl)
    trained = conformance.check_calibration(impl, request_target, tolerance=0.01)
    conformance.check_output_contract(impl, request_target, trained)
    if impl.info.bug != ACCOUNTANT_BUG:
        conformance.check_claim_matches_request(impl, request_target, trained)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.info.name)
def test_softmax_regression_is_the_designated_model(impl, request_sigma):
    """Every implementation trains the default profiles' model, a zero-initialised softmax regression
    (hidden width 0), as its black box shows."""
    impl = _available(impl)
    softmax = conformance.softmax_regression_request(request_sigma)
    conformance.check_softmax_regression(impl, softmax, conformance.check_output_contract(impl, softmax))


# --- the suite itself fails where it should ------------------------------------------------------------


class _Fake(Implementation):
    """A numpy-only implementation whose output and claim a test can break on purpose."""

    def __init__(self, *, log_proba=None, claim_changes=None, seeded=True):
        self.info = ImplementationInfo(name="fake-impl", library="numpy")
        self.log_proba = log_proba
        self.claim_changes = claim_changes or {}
        self.seeded = seeded
        self.calls = 0

    def train(self, request):
        self.calls += 1
        hp = request.hyperparameters
        seed = request.seed if self.seeded else self.calls
        weights = np.random.default_rng(seed).standard_normal((request.dimension, request.num_classes))

        def predict(features):
            if self.log_proba is not None:
                return self.log_proba(features, request.num_classes)
            logits = np.asarray(features, dtype=np.float64) @ weights
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        sigma = hp.noise_multiplier if hp.noise_multiplier is not None else 1.0
        fields = dict(
            epsilon=hp.target_epsilon or 1.0,
            delta=hp.delta,
            accountant="fake",
            noise_multiplier=sigma,
            sampling_rate=hp.sampling_rate,
            steps=hp.steps,
        )
        fields.update(self.claim_changes)
        return TrainedModel(predict_log_proba=predict, claim=PrivacyClaim(**fields), device="cpu")


def test_a_small_correct_dpsgd_passes_everything():
    conformance.run_conformance(NumpyDPSGD())


NOT_SOFTMAX = "not a zero-initialised softmax regression"


def test_a_trainer_that_builds_its_own_model_fails_with_the_likely_cause():
    """Asked for softmax regression, it trains a 64-unit MLP: its shapes are right, its responses bend."""
    with pytest.raises(AssertionError, match=f"test-numpy-dpsgd: the model is {NOT_SOFTMAX}: responses are not affine .* "
                       "does the trainer build its own model instead of the requested architecture"):
        conformance.run_conformance(NumpyDPSGD(own_hidden_width=64))


def test_a_randomly_initialised_softmax_regression_fails():
    """Affine, but a coordinate no record touches moves its answers: its weights did not start at zero."""
    softmax = conformance.softmax_regression_request(conformance.small_request())
    with pytest.raises(AssertionError, match=f"fake-impl: the model is {NOT_SOFTMAX}: input coordinate [67], which no "
                       "training record touches"):
        conformance.check_softmax_regression(_Fake(), softmax)


def test_softmax_regression_for_a_requested_mlp_fails():
    with pytest.raises(AssertionError, match="fake-impl: hidden_width=16 was requested but the responses are affine"):
        conformance.check_hidden_layer(_Fake(), conformance.small_request(hidden_width=16))


def test_a_softmax_only_trainer_runs_the_suite_on_softmax_regression():
    softmax_only = NumpyDPSGD(softmax_only=True)
    conformance.run_conformance(softmax_only, architectures=[MLPArchitecture(hidden_width=0)])
    with pytest.raises(ValueError, match="trains softmax regression only"):
        conformance.run_conformance(softmax_only)  # the default asks for an MLP too


def test_the_model_checks_refuse_requests_they_cannot_judge():
    request = conformance.small_request()
    with pytest.raises(ValueError, match="needs a softmax_regression_request"):
        conformance.check_softmax_regression(NumpyDPSGD(), request)
    with pytest.raises(ValueError, match="hidden_width >= 1"):
        conformance.check_hidden_layer(NumpyDPSGD(), conformance.small_request(hidden_width=0))
    with pytest.raises(ValueError, match="dimension > 2"):
        conformance.softmax_regression_request(conformance.small_request(dimension=2))
    for architectures in ([], [0]):
        with pytest.raises(ValueError, match="architectures must be one or more MLPArchitecture"):
            conformance.run_conformance(NumpyDPSGD(), architectures=architectures)


@pytest.mark.parametrize(
    "log_proba, message",
    [
        (lambda x, c: np.zeros((x.shape[0], c + 1)), "shape"),
        (lambda x, c: np.zeros((x.shape[0], c), dtype=np.int64), "dtype"),
        (lambda x, c: np.full((x.shape[0], c), np.nan), "non-finite"),
        (lambda x, c: np.zeros((x.shape[0], c)), "logsumexp"),  # logits, not log-probabilities
        (lambda x, c: [[0.0] * c] * x.shape[0], "numpy array"),
    ],
    ids=["shape", "dtype", "nan", "not-normalised", "list"],
)
def test_output_contract_catches(log_proba, message):
    fake = _Fake(log_proba=log_proba)
    with pytest.raises(AssertionError, match=f"fake-impl.*{message}"):
        conformance.check_output_contract(fake, conformance.small_request())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"steps": 5}, "steps"),
        ({"sampling_rate": 0.2}, "sampling rate"),
        ({"noise_multiplier": 1.5}, "noise multiplier"),
        ({"epsilon": float("inf")}, "infinite"),
    ],
)
def test_claim_check_catches(changes, message):
    with pytest.raises(AssertionError, match=f"fake-impl.*{message}"):
        conformance.check_claim_matches_request(_Fake(claim_changes=changes), conformance.small_request())


@pytest.mark.parametrize(
    "event, sampling_rate, holds",
    [
        (lambda dp: dp.GaussianDpEvent(2.0), 0.1, True),  # every record in every step: no amplification taken
        (lambda dp: dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(2.0)), 5), 0.1, True),
        (lambda dp: dp.SelfComposedDpEvent(dp.GaussianDpEvent(2.0), 5), 0.5, True),  # one phase of the 2 fixed batches
        (lambda dp: dp.SelfComposedDpEvent(dp.GaussianDpEvent(2.0), 5), 0.1, False),  # one phase in 2, not of 10
        (lambda dp: dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.2, dp.GaussianDpEvent(2.0)), 5), 0.1, False),
    ],
    ids=["full-batch", "cyclic-poisson-at-q", "cyclic-of-the-fixed-batches", "cyclic-of-another-cycle", "poisson-at-2q"],
)
def test_a_correlated_claim_takes_the_requested_amplification_or_none(event, sampling_rate, holds):
    """10 steps of a 2-band strategy: a full-batch claim bounds any participation; a cyclic one states a
    record in one phase of 2, which is the request's when it names 2 fixed batches (q = 1/2) or samples at its q."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dpverify.stats.correlated import NoiseStructure

    claim = PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="fake", dp_event=event(dp_accounting),
                         noise_structure=NoiseStructure.banded_toeplitz([1.0, 0.5], steps=10))

    class Correlated(_Fake):
        def train(self, request):
            return dataclasses.replace(super().train(request), claim=claim)

    request = conformance.small_request(sampling_rate=sampling_rate, epochs=round(10 * sampling_rate))
    if holds:
        conformance.check_claim_matches_request(Correlated(), request)
    else:
        with pytest.raises(AssertionError, match=f"sampling rate .* is not the requested q = {sampling_rate} .*fixed batches"):
            conformance.check_claim_matches_request(Correlated(), request)


def test_determinism_catches_an_ignored_or_unused_seed():
    with pytest.raises(AssertionError, match="fake-impl.*same seed"):
        conformance.check_determinism(_Fake(seeded=False), conformance.small_request())

    class Constant(_Fake):
        def train(self, request):
            return super().train(conformance.small_request(seed=0))

    with pytest.raises(AssertionError, match="fake-impl.*the seed is ignored"):
        conformance.check_determinism(Constant(), conformance.small_request())


def test_calibration_check_catches_a_missed_target():
    request = conformance.with_target_epsilon(conformance.small_request(), 2.0)
    with pytest.raises(AssertionError, match="fake-impl.*claims ε = 2.06"):
        conformance.check_calibration(_Fake(claim_changes={"epsilon": 2.06}), request)  # 3 % over
    conformance.check_calibration(_Fake(claim_changes={"epsilon": 1.985}), request)  # 0.75 % under: fine
    with pytest.raises(ValueError, match="target_epsilon"):
        conformance.check_calibration(_Fake(), conformance.small_request())


def test_small_request_is_valid_and_tiny():
    request = conformance.small_request()
    assert request.features.shape == (100, 8) and request.features.dtype == np.float32
    assert np.allclose(np.linalg.norm(request.features, axis=1), 1.0, atol=1e-6)
    assert request.hyperparameters.steps == 10
    assert conformance.small_request(target_epsilon=3.0).hyperparameters == DPHyperparameters(
        target_epsilon=3.0, sampling_rate=0.1, epochs=1, learning_rate=0.5
    )
    twin = conformance.with_target_epsilon(request, 3.0)
    assert twin.features is request.features and twin.hyperparameters.target_epsilon == 3.0


# --- every released update ---------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.info.name)
def test_every_bundled_trainer_hands_over_every_update(impl, request_sigma):
    impl = _available(impl)
    softmax = conformance.softmax_regression_request(request_sigma)
    assert conformance.check_update_hand_over(impl, softmax) == conformance.HANDS_OVER_EVERY_UPDATE


def test_a_trainer_that_hands_over_nothing_is_reported_not_failed():
    assert conformance.run_conformance(NumpyDPSGD(hands_over_updates=False)) == conformance.HANDS_OVER_NO_UPDATES


def test_a_trainer_that_hands_over_its_updates_passes_with_any_model():
    trainer = NumpyDPSGD()
    assert conformance.run_conformance(trainer) == conformance.HANDS_OVER_EVERY_UPDATE
    assert conformance.check_update_hand_over(trainer, conformance.small_request()) == conformance.HANDS_OVER_EVERY_UPDATE
    assert conformance.designated_shapes(conformance.small_request()) == [(16, 8), (16,), (4, 16), (4,)]


class _HandsOver(_Fake):
    """A softmax regression whose zero start and trained weights it hands over as ``mistake`` says."""

    def __init__(self, mistake=None):
        super().__init__()
        self.mistake = mistake

    def train(self, request):
        trained = super().train(request)
        d, c, steps = request.dimension, request.num_classes, request.hyperparameters.steps
        rng = np.random.default_rng(request.seed)
        weight, bias = rng.standard_normal((c, d)), rng.standard_normal(c)
        live = [np.zeros((c, d)), np.zeros(c)]
        for step in range(steps + 1):
            if step == steps:
                live[0][:], live[1][:] = weight, bias
            if self.mistake == "skips a step" and step == 2:
                continue
            if self.mistake == "keras layout":
                request.observe_update(step, (live[0].T.copy(), live[1].copy()))
            elif self.mistake == "live buffers":
                request.observe_update(step, tuple(live))
            else:
                request.observe_update(step, (live[0].copy(), live[1].copy()))
            if self.mistake == "live buffers":
                live[0] += 1.0

        def predict(features):
            x = np.asarray(features, np.float64)
            logits = x @ weight.T + bias + (x[:, :c] if self.mistake == "another model" else 0.0)
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        return TrainedModel(predict_log_proba=predict, claim=trained.claim, device="cpu")


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("skips a step", "called for steps \\[0, 1, 3"),
        ("keras layout", "shapes \\[\\(6, 4\\), \\(4,\\)\\], expected \\[\\(4, 6\\), \\(4,\\)\\].*transpose"),
        ("live buffers", "changed later: hand over copies"),
        ("another model", "not the returned model's"),
    ],
)
def test_the_hand_over_check_catches(mistake, message):
    request = conformance.softmax_regression_request(conformance.small_request(dimension=6))
    assert conformance.check_update_hand_over(_HandsOver(), request) == conformance.HANDS_OVER_EVERY_UPDATE
    with pytest.raises(AssertionError, match=f"fake-impl: .*{message}"):
        conformance.check_update_hand_over(_HandsOver(mistake), request)
