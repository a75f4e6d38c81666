"""Numpy-only implementations for testing the audit engine itself (not stand-ins for real libraries).

``Memoriser`` is the least private trainer possible: it returns near-certain log-probabilities for the
labels it was given. ``Oblivious`` never looks at its data, so it is perfectly private whatever it claims.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.stats.curves import ClaimedRun


def claim_for(request: TrainingRequest, epsilon: float) -> PrivacyClaim:
    """A claim of ``epsilon`` for a run it describes consistently: σ is calibrated so that the full-batch
    Gaussian mechanism of the request's steps is exactly ``epsilon``-DP at δ (with q < 1 the described
    run is more private still), so the audit's statistics, not the claim check, decide."""
    hp = request.hyperparameters
    return PrivacyClaim(
        epsilon=epsilon,
        delta=hp.delta,
        accountant="test-double",
        noise_multiplier=_calibrated_sigma(epsilon, steps=hp.steps, delta=hp.delta),
        sampling_rate=hp.sampling_rate,
        steps=hp.steps,
    )


@functools.lru_cache(maxsize=None)  # a two-world audit asks it once per run, always the same
def _calibrated_sigma(epsilon: float, *, steps: int, delta: float) -> float:
    if math.isinf(epsilon):
        return 0.0

    def excess(log_sigma: float) -> float:
        return ClaimedRun(noise_multiplier=math.exp(log_sigma), steps=steps).epsilon(delta) - epsilon

    return math.exp(optimize.brentq(excess, math.log(1e-3), math.log(1e6), xtol=1e-10)) * (1 + 1e-9)


def uniform_log_probs(n: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    logits = rng.standard_normal((n, num_classes))
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


@dataclass
class Memoriser(Implementation):
    claimed_epsilon: float = 1.0
    info: ImplementationInfo = field(
        default_factory=lambda: ImplementationInfo(
            name="test-memoriser", library="numpy", expected="violation", breaks="no noise at all", detectability="D1"
        )
    )
    requests: list = field(default_factory=list)

    def train(self, request: TrainingRequest) -> TrainedModel:
        self.requests.append(request)
        seen = {row.tobytes(): label for row, label in zip(request.features, request.labels)}
        rng = np.random.default_rng(request.seed)

        def predict(features: np.ndarray) -> np.ndarray:
            out = uniform_log_probs(len(features), request.num_classes, rng)
            for i, row in enumerate(features):
                if row.tobytes() in seen:
                    out[i] = np.log(1e-6 / (request.num_classes - 1))
                    out[i, seen[row.tobytes()]] = np.log1p(-1e-6)
            return out

        return TrainedModel(predict_log_proba=predict, claim=claim_for(request, self.claimed_epsilon), device="cpu")


@dataclass
class Oblivious(Implementation):
    claimed_epsilon: float = 1.0
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-oblivious", library="numpy"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        rng = np.random.default_rng(request.seed)
        return TrainedModel(
            predict_log_proba=lambda features: uniform_log_probs(len(features), request.num_classes, rng),
            claim=claim_for(request, self.claimed_epsilon),
            device="cpu",
        )


@dataclass
class Broken(Implementation):
    """Fails in the way ``mode`` says: raise, nan, shape, or a non-TrainedModel return."""

    mode: str = "raise"
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-broken", library="numpy"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        if self.mode == "raise":
            raise RuntimeError("optimizer exploded")
        if self.mode == "return":
            return {"epsilon": 1.0}  # type: ignore[return-value]
        n_classes = request.num_classes

        def predict(features: np.ndarray) -> np.ndarray:
            if self.mode == "nan":
                return np.full((len(features), n_classes), np.nan)
            return np.zeros((len(features), n_classes + 1))

        return TrainedModel(predict_log_proba=predict, claim=claim_for(request, 1.0), device="cpu")


@dataclass
class GaussianMechanism(Implementation):
    """The claimed mechanism itself, canary by canary: a trained record's label gains ``signal`` × μ on its
    logit, μ = √steps/σ of the claim (exact at q = 1), over independent Gaussian logits scaled so that the
    default inclusion score (label minus the mean of the other labels) is N(μ, 1) for a member and N(0, 1)
    otherwise. ``signal`` = 1 is a correct implementation as an audit sees it; < 1 one whose canaries carry
    less (a model that is not the designated one)."""

    claimed_epsilon: float = 2.0
    signal: float = 1.0
    info: ImplementationInfo = field(
        default_factory=lambda: ImplementationInfo(name="test-gaussian-mechanism", library="numpy")
    )

    def train(self, request: TrainingRequest) -> TrainedModel:
        claim = claim_for(request, self.claimed_epsilon)
        mu = math.sqrt(claim.steps) / claim.noise_multiplier
        classes = request.num_classes
        scale = 1 / math.sqrt(1 + 1 / (classes - 1))
        seen = {row.tobytes(): label for row, label in zip(request.features, request.labels)}
        rng = np.random.default_rng(request.seed)

        def predict(features: np.ndarray) -> np.ndarray:
            logits = scale * rng.standard_normal((len(features), classes))
            for i, row in enumerate(features):
                if row.tobytes() in seen:
                    logits[i, seen[row.tobytes()]] += self.signal * mu
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        return TrainedModel(predict_log_proba=predict, claim=claim, device="cpu")
