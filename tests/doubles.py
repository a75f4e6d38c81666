"""Numpy-only implementations for testing the audit engine itself (not stand-ins for real libraries).

``Memoriser`` is the least private trainer possible: it returns near-certain log-probabilities for the
labels it was given. ``Oblivious`` never looks at its data, so it is perfectly private whatever it claims.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpverify.contract import Implementation, ImplementationInfo, PrivacyClaim, TrainedModel, TrainingRequest


def claim_for(request: TrainingRequest, epsilon: float) -> PrivacyClaim:
    hp = request.hyperparameters
    return PrivacyClaim(
        epsilon=epsilon,
        delta=hp.delta,
        accountant="test-double",
        noise_multiplier=hp.noise_multiplier if hp.noise_multiplier is not None else 1.0,
        sampling_rate=hp.sampling_rate,
        steps=hp.steps,
    )


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
