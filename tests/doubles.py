"""Numpy-only implementations for testing the audit engine itself (not stand-ins for real libraries).

``Memoriser`` is the least private trainer possible: it returns near-certain log-probabilities for the
labels it was given. ``Oblivious`` never looks at its data, so it is perfectly private whatever it claims.
``NumpyDPSGD`` is a small, correct DP-SGD of the designated model for the conformance suite, with the
switches that make it a trainer of its own model or of softmax regression only. ``dirac_scores`` draws the
scores DP-SGD gives Dirac canaries: what k* promises is checked against the one-run audit's decision on them
(``dpverify.stats.power.audit_refutes``), not against k*'s own model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from dpverify.contract import (
    Implementation,
    ImplementationInfo,
    PrivacyClaim,
    TrainedModel,
    TrainingRequest,
    hand_over_kernels,
)
from dpverify.stats.curves import ClaimedRun


@dataclass(frozen=True)
class Rows:
    """A feature matrix in float64 for the doubles' products, kept as each row's one non-zero column
    (``owner``) and its ``value`` when every row has at most one and no two rows share a column (Dirac
    canaries; ``dense`` otherwise). Each entry of a product is then one product plus exact zeros, so
    reading it off the owned rows gives the dense product's very numbers without the dense arithmetic,
    which took half of a simulated 160 000-canary audit's time."""

    columns: int
    dense: np.ndarray | None = None
    owner: np.ndarray | None = None
    value: np.ndarray | None = None

    @classmethod
    def of(cls, features: np.ndarray) -> "Rows":
        nonzero = features != 0
        counts = nonzero.sum(axis=1)
        if counts.max(initial=0) <= 1:
            owner = np.argmax(nonzero, axis=1)  # column 0 for an all-zero row, whose value is 0
            if len(np.unique(owner[counts == 1])) == np.count_nonzero(counts):
                value = features[np.arange(len(features)), owner].astype(np.float64)
                return cls(columns=features.shape[1], owner=owner, value=value)
        return cls(columns=features.shape[1], dense=np.asarray(features, np.float64))

    def squared_norms(self) -> np.ndarray:
        return np.sum(self.dense**2, axis=1) if self.dense is not None else self.value**2

    def times(self, matrix: np.ndarray) -> np.ndarray:
        """``features @ matrix``."""
        return self.dense @ matrix if self.dense is not None else self.value[:, None] * matrix[self.owner]

    def divided_transpose_times(self, divisor: np.ndarray, matrix: np.ndarray) -> np.ndarray:
        """``(features / divisor per row)ᵀ @ matrix``."""
        if self.dense is not None:
            return (self.dense / divisor[:, None]).T @ matrix
        owned = self.value != 0
        result = np.zeros((self.columns, matrix.shape[1]))
        result[self.owner[owned]] = (self.value[owned] / divisor[owned])[:, None] * matrix[owned]
        return result


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


def dirac_scores(rng: np.random.Generator, bits: np.ndarray, *, run: ClaimedRun, noise: float) -> np.ndarray:
    """Inclusion scores of Dirac canaries under DP-SGD, in raw units: a canary owns its coordinate, so its
    score sums its clipped gradient (1) over the steps Poisson sampling takes it in, Binomial(T, q) for a
    member (secret bit +1) and none otherwise, plus the noise of std ``noise`` added on its coordinate at
    every step."""
    participations = rng.binomial(run.steps, run.sampling_rate, size=bits.size) * (bits == 1)
    return participations + noise * math.sqrt(run.steps) * rng.standard_normal(bits.size)


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
    """The claimed mechanism itself, canary by canary, as a softmax regression: Gaussian weights, plus
    ``signal`` × μ on each trained record's label along its own direction (μ = √steps/σ of the claim, exact
    at q = 1). With orthogonal canaries of one norm (the Dirac design) the default inclusion score (label
    minus the mean of the other labels) is then N(μ, 1) for a member and N(0, 1) otherwise. ``signal`` = 1
    is a correct implementation as an audit sees it; < 1 one whose canaries carry less."""

    claimed_epsilon: float = 2.0
    signal: float = 1.0
    info: ImplementationInfo = field(
        default_factory=lambda: ImplementationInfo(name="test-gaussian-mechanism", library="numpy")
    )

    def train(self, request: TrainingRequest) -> TrainedModel:
        claim = claim_for(request, self.claimed_epsilon)
        mu = math.sqrt(claim.steps) / claim.noise_multiplier
        classes = request.num_classes
        features = Rows.of(request.features)
        norms_squared = np.maximum(features.squared_norms(), 1e-300)
        # Each logit of a canary of norm r has standard deviation r·spread; the inclusion score's is 1.
        spread = 1 / math.sqrt(1 + 1 / (classes - 1)) / math.sqrt(float(np.median(norms_squared)) if request.features.size else 1.0)
        rng = np.random.default_rng(request.seed)
        weights = spread * rng.standard_normal((request.dimension, classes))
        weights += features.divided_transpose_times(norms_squared, self.signal * mu * np.eye(classes)[request.labels])

        def predict(queries: np.ndarray) -> np.ndarray:
            logits = Rows.of(queries).times(weights)
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        return TrainedModel(predict_log_proba=predict, claim=claim, device="cpu")


@dataclass
class NumpyDPSGD(Implementation):
    """DP-SGD in numpy on the designated model: Poisson batches, per-record clipping, Gaussian noise σ·C,
    the designated normaliser, plain SGD, each step reported to ``request.progress``; softmax regression from zero weights, or a ReLU MLP from a
    seeded uniform ±1/√fan-in init (torch's default). Its claim is the full-batch Gaussian mechanism's ε of
    the steps (:func:`claim_for`'s accountant, valid for any q), at the requested or calibrated σ.

    ``own_hidden_width`` trains that MLP whatever was requested: a trainer that builds its own model.
    ``softmax_only`` refuses an MLP, as a trainer that only does softmax regression would. It hands its
    parameters to ``request.observe_update`` before the first step and after each, unless
    ``hands_over_updates`` is false. ``fixed_batches`` takes each epoch's 1/q steps from a fresh shuffle cut
    into batches of ⌈N·q⌉ (the last one short), as a data loader does, instead of Poisson batches
    (docs/bugs.md class 9), and still claims what its accountant states for Poisson sampling."""

    own_hidden_width: int | None = None
    softmax_only: bool = False
    hands_over_updates: bool = True
    fixed_batches: bool = False
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-numpy-dpsgd", library="numpy"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        hp = request.hyperparameters
        width = request.architecture.hidden_width if self.own_hidden_width is None else self.own_hidden_width
        if self.softmax_only and width:
            raise ValueError(f"{self.info.name} trains softmax regression only (hidden_width=0), got hidden_width={width}")
        sigma = hp.noise_multiplier
        if sigma is None:
            sigma = _calibrated_sigma(hp.target_epsilon, steps=hp.steps, delta=hp.delta)
        rng = np.random.default_rng(request.seed)
        params = _initial_parameters(width, request.dimension, request.num_classes, rng)
        features = request.features.astype(np.float64)
        onehot = np.eye(request.num_classes)[request.labels]
        self._hand_over(request, 0, params)
        for step in range(1, hp.steps + 1):
            batch = self._batch(request, step, rng)
            grads = _per_record_gradients(params, features[batch], onehot[batch])
            norms = np.sqrt(sum((g.reshape(len(batch), int(np.prod(g.shape[1:]))) ** 2).sum(axis=1) for g in grads))
            factors = np.minimum(1.0, hp.max_grad_norm / np.maximum(norms, 1e-12))
            for p, g in zip(params, grads):
                noisy = np.tensordot(factors, g, axes=1) + rng.normal(0.0, sigma * hp.max_grad_norm, p.shape)
                p -= hp.learning_rate * noisy / hp.normaliser(request.num_records)
            self._hand_over(request, step, params)
            if request.progress is not None:
                request.progress(step, hp.steps)
        epsilon = ClaimedRun(noise_multiplier=sigma, steps=hp.steps).epsilon(hp.delta)
        claim = PrivacyClaim(
            epsilon=epsilon,
            delta=hp.delta,
            accountant="full-batch GDP",
            noise_multiplier=sigma,
            sampling_rate=hp.sampling_rate,
            steps=hp.steps,
        )

        def predict(batch: np.ndarray) -> np.ndarray:
            logits = _forward(params, np.asarray(batch, dtype=np.float64))[-1]
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        return TrainedModel(predict_log_proba=predict, claim=claim, device="cpu")


    def _batch(self, request: TrainingRequest, step: int, rng: np.random.Generator) -> np.ndarray:
        hp = request.hyperparameters
        if not self.fixed_batches:
            return np.flatnonzero(rng.random(request.num_records) < hp.sampling_rate)
        k = hp.steps_per_epoch
        if (step - 1) % k == 0:
            size = math.ceil(request.num_records / k)
            self._epoch = np.array_split(rng.permutation(request.num_records), range(size, request.num_records, size))
        return self._epoch[(step - 1) % k]

    def _hand_over(self, request: TrainingRequest, step: int, params: list[np.ndarray]) -> None:
        if self.hands_over_updates:
            hand_over_kernels(request, step, lambda: params)


def _initial_parameters(width: int, dimension: int, num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    if width == 0:
        return [np.zeros((dimension, num_classes)), np.zeros(num_classes)]
    shapes = [((dimension, width), dimension), ((width,), dimension), ((width, num_classes), width), ((num_classes,), width)]
    return [rng.uniform(-1.0, 1.0, shape) / math.sqrt(fan_in) for shape, fan_in in shapes]


def _forward(params: list[np.ndarray], features: np.ndarray) -> list[np.ndarray]:
    """The layers' outputs: [logits] for softmax regression, [hidden, logits] for the MLP."""
    if len(params) == 2:
        return [features @ params[0] + params[1]]
    hidden = np.maximum(features @ params[0] + params[1], 0.0)
    return [hidden, hidden @ params[2] + params[3]]


def _per_record_gradients(params: list[np.ndarray], features: np.ndarray, onehot: np.ndarray) -> list[np.ndarray]:
    """Each record's cross-entropy gradient, parameter by parameter (a leading record axis)."""
    outputs = _forward(params, features)
    logits = outputs[-1]
    error = np.exp(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)) - onehot
    if len(params) == 2:
        return [features[:, :, None] * error[:, None, :], error]
    hidden = outputs[0]
    back = (error @ params[2].T) * (hidden > 0)
    return [features[:, :, None] * back[:, None, :], back, hidden[:, :, None] * error[:, None, :], error]


def event_claim(*, noise_multiplier: float, steps: int, delta: float, relation: str) -> PrivacyClaim:
    """A claim of the full-batch Gaussian mechanism stated as a dp_accounting event, as JAX-Privacy states its
    runs, with its exact GDP ε in ``relation`` (which every dp_accounting release can state, whether or not
    it accounts that relation)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(1.0, dp_accounting.GaussianDpEvent(noise_multiplier)), steps
    )
    epsilon = ClaimedRun(noise_multiplier=noise_multiplier, steps=steps, relation=relation).epsilon(delta)
    return PrivacyClaim(epsilon=epsilon, delta=delta, accountant="test-event", relation=relation, dp_event=event)


@dataclass
class WorldGaussianMechanism(Implementation):
    """The full-batch Gaussian mechanism on a worst-case-record world (:func:`~dpverify.canaries.worlds.
    worst_case_record_worlds`), exactly: each of T steps sums the records' clipped gradients along the
    target's direction (+1 for the target with label 1, −1 with label 0, 0 for any other record, as a null
    record gives) and adds N(0, ``noise_multiplier``²); the black box's logit of class 1 at the target is the
    sum over the steps, in units of its noise. So the worlds' scores are N(k√T/σ, 1) apart in the
    probit scale for the k clip norms one record moves a step: GDP μ = √T/σ for a record added, 2√T/σ for
    a label flipped. It claims the event of the same mechanism at ``claimed_noise`` in ``relation``."""

    noise_multiplier: float
    claimed_noise: float
    relation: str
    info: ImplementationInfo = field(
        default_factory=lambda: ImplementationInfo(name="test-world-gaussian-mechanism", library="numpy")
    )

    def train(self, request: TrainingRequest) -> TrainedModel:
        hp = request.hyperparameters
        at_target = request.features[:, 0] != 0  # the world's x* lies on the first axis, its base points off it
        per_step = float(np.sum(np.where(request.labels[at_target] == 1, 1.0, -1.0)))
        rng = np.random.default_rng(request.seed)
        noise = self.noise_multiplier * math.sqrt(hp.steps)
        logit = (hp.steps * per_step + noise * rng.standard_normal()) / noise

        def predict(queries: np.ndarray) -> np.ndarray:
            logits = np.zeros((len(queries), 2))
            logits[:, 1] = logit
            return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)

        claim = event_claim(noise_multiplier=self.claimed_noise, steps=hp.steps, delta=hp.delta, relation=self.relation)
        return TrainedModel(predict_log_proba=predict, claim=claim, device="cpu")
