"""A reusable conformance suite for implementations under audit (numpy only, no framework).

Any registered implementation, built-in or third party, can be checked against the contract before it is
audited: cheap, deterministic checks on tiny training runs that catch the errors an audit would report
late or not at all (wrong output shapes, outputs that are not log-probabilities, a claim that is not
about the requested run, a target ε missed, seeds that do not decide the run, updates handed over out of
order or in another layout)::

    from dpverify.conformance import run_conformance
    run_conformance(my_implementation)

Every check raises ``AssertionError`` with a message that names the implementation. Each ``check_*``
takes an optional ``trained`` model so a test suite can train once and check several things; the model
is returned so it can be reused.

The model checks (:func:`check_softmax_regression`, :func:`check_hidden_layer`) see only the black box,
as the audit does: a trainer that builds its own model instead of the designated one makes a Dirac
audit blind to the bugs it exists to catch, so a pass must not hide it. A trainer that trains softmax
regression only runs ``run_conformance(impl, architectures=[MLPArchitecture(hidden_width=0)])``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from typing import Callable, Sequence, TypeVar

from dpverify.contract import (
    RELATIONS,
    DPHyperparameters,
    Implementation,
    MLPArchitecture,
    PrivacyClaim,
    Request,
    SequenceModel,
    SequenceRequest,
    TrainedModel,
    TrainingRequest,
)

__all__ = [
    "small_request",
    "check_output_contract",
    "check_claim_matches_request",
    "check_determinism",
    "check_calibration",
    "with_target_epsilon",
    "softmax_regression_request",
    "check_softmax_regression",
    "check_hidden_layer",
    "affinity_defect",
    "HANDS_OVER_EVERY_UPDATE",
    "HANDS_OVER_NO_UPDATES",
    "designated_shapes",
    "check_update_hand_over",
    "hand_over_gap",
    "run_conformance",
]

RequestType = TypeVar("RequestType", bound=Request)

#: |logsumexp(row)| allowed for a row of log-probabilities (float32 log-softmax is good to ~1e-6).
LOGSUMEXP_ATOL = 1e-4
#: float32's machine epsilon (2^-23): the model checks allow float32 arithmetic's rounding, no more.
FLOAT32_EPS = float(np.finfo(np.float32).eps)
#: Input coordinates that no training record of :func:`softmax_regression_request` touches.
UNTOUCHED_COORDINATES = 2
#: Probe pairs (x, y) of the affinity test: each pair is four points, each a row of one batch.
PROBE_PAIRS = 8
#: What :func:`check_update_hand_over` reports of a trainer that passes it.
HANDS_OVER_EVERY_UPDATE = "hands over every update"
HANDS_OVER_NO_UPDATES = "hands over no updates"


def small_request(
    *,
    num_records: int = 100,
    dimension: int = 8,
    hidden_width: int = 16,
    num_classes: int = 4,
    noise_multiplier: float | None = 2.0,
    target_epsilon: float | None = None,
    max_grad_norm: float = 1.0,
    sampling_rate: float = 0.1,
    epochs: int = 1,
    learning_rate: float = 0.5,
    delta: float = 1e-5,
    seed: int = 0,
    data_seed: int = 0,
    feature_scale: float = 1.0,
    device: str = "cpu",
) -> TrainingRequest:
    """A tiny training request (default: 100 records, d = 8, h = 16, C = 4, q = 0.1, 1 epoch = 10 steps,
    σ = 2) that any implementation trains in well under a second.

    Features are Gaussian rows scaled to norm ``feature_scale``, labels uniform, both drawn from
    ``data_seed``; ``seed`` is the training seed. Giving ``target_epsilon`` drops ``noise_multiplier``.
    The defaults make an empty Poisson batch rare ((1 - q)^m ≈ 3e-5 per step), keep q·m an integer, so
    every library's expected batch size is the same, and keep accounting cheap: RDP accountants are
    slowest for σ near 1 and large q."""
    if target_epsilon is not None:
        noise_multiplier = None
    rng = np.random.default_rng(data_seed)
    features = rng.standard_normal((num_records, dimension))
    features *= feature_scale / np.maximum(np.linalg.norm(features, axis=1, keepdims=True), 1e-12)
    labels = rng.integers(0, num_classes, size=num_records)
    return TrainingRequest(
        features=features.astype(np.float32),
        labels=labels.astype(np.int64),
        num_classes=num_classes,
        architecture=MLPArchitecture(hidden_width=hidden_width),
        hyperparameters=DPHyperparameters(
            noise_multiplier=noise_multiplier,
            target_epsilon=target_epsilon,
            max_grad_norm=max_grad_norm,
            sampling_rate=sampling_rate,
            epochs=epochs,
            learning_rate=learning_rate,
            delta=delta,
        ),
        seed=seed,
        device=device,
    )


def _name(impl: Implementation) -> str:
    info = getattr(impl, "info", None)
    return getattr(info, "name", None) or type(impl).__name__


def _train(impl: Implementation, request: Request) -> TrainedModel | SequenceModel:
    """``impl.train(request)``, which must return the request's contract type."""
    trained = impl.train(request)  # type: ignore[arg-type]
    expected = SequenceModel if isinstance(request, SequenceRequest) else TrainedModel
    assert isinstance(trained, expected), (
        f"{_name(impl)}: train() must return a dpverify.contract.{expected.__name__}, got {type(trained).__name__}"
    )
    return trained


def _log_proba(impl: Implementation, trained: TrainedModel, features: np.ndarray) -> np.ndarray:
    out = trained.predict_log_proba(features)
    assert isinstance(out, np.ndarray), (
        f"{_name(impl)}: predict_log_proba must return a numpy array, got {type(out).__name__}"
    )
    return out


def check_output_contract(
    impl: Implementation, request: TrainingRequest, trained: TrainedModel | None = None
) -> TrainedModel:
    """The black box and the claim have the contract's form.

    Outputs on the canaries, on fresh features of another row count, and on a single row: shape (n, C),
    a float dtype, all finite (a correct implementation on the small request does not diverge), every
    row a log-probability vector (logsumexp within ``LOGSUMEXP_ATOL`` of 0, all entries <= 0). The claim
    is a :class:`PrivacyClaim` for the request's δ, with a known relation, and ``device`` is ``"cpu"`` or
    ``"cuda"`` (``"cpu"`` when CPU was requested)."""
    name = _name(impl)
    trained = trained if trained is not None else _train(impl, request)
    assert isinstance(trained.claim, PrivacyClaim), f"{name}: claim must be a PrivacyClaim, got {trained.claim!r}"
    assert trained.device in ("cpu", "cuda"), f"{name}: device must be 'cpu' or 'cuda', got {trained.device!r}"
    if request.device == "cpu":
        assert trained.device == "cpu", f"{name}: CPU was requested but training reports device {trained.device!r}"

    rng = np.random.default_rng(12345)
    fresh = rng.standard_normal((request.num_records + 3, request.dimension)).astype(np.float32)
    for label, features in (
        ("the canaries", request.features),
        ("fresh features", fresh),
        ("a single row", request.features[:1]),
    ):
        out = _log_proba(impl, trained, features)
        expected_shape = (features.shape[0], request.num_classes)
        assert out.shape == expected_shape, (
            f"{name}: predict_log_proba on {label} returned shape {out.shape}, expected {expected_shape}"
        )
        assert np.issubdtype(out.dtype, np.floating), (
            f"{name}: predict_log_proba on {label} returned dtype {out.dtype}, expected a float dtype"
        )
        bad = ~np.isfinite(out)
        assert not bad.any(), (
            f"{name}: predict_log_proba on {label} returned {int(bad.sum())} non-finite values "
            f"(rows {np.flatnonzero(bad.any(axis=1))[:5].tolist()}...); training diverged or failed"
        )
        values = out.astype(np.float64)
        peak = values.max(axis=1, keepdims=True)
        lse = (peak + np.log(np.exp(values - peak).sum(axis=1, keepdims=True)))[:, 0]
        worst = int(np.argmax(np.abs(lse)))
        assert abs(lse[worst]) <= LOGSUMEXP_ATOL, (
            f"{name}: row {worst} of predict_log_proba on {label} is not a log-probability vector: "
            f"logsumexp = {lse[worst]:.3g} (expected 0 within {LOGSUMEXP_ATOL:g}); return log-softmax outputs"
        )
        assert values.max() <= LOGSUMEXP_ATOL, f"{name}: a log-probability on {label} is positive ({values.max():.3g})"

    claim = trained.claim
    assert claim.delta == request.hyperparameters.delta, (
        f"{name}: the claim is for δ = {claim.delta}, the request asked for δ = {request.hyperparameters.delta}"
    )
    assert claim.relation in RELATIONS, f"{name}: unknown neighbouring relation {claim.relation!r}"
    return trained


def _claimed_dpsgd(name: str, claim: PrivacyClaim) -> tuple[float, float, int]:
    """The claim's (σ, q, steps), its numbers or its event's (and its noise structure's steps): the request
    designates DP-SGD's hyperparameters."""
    from dpverify.stats.events import request_numbers

    try:
        return request_numbers(claim)
    except ValueError as exc:
        raise AssertionError(f"{name}: the request designates DP-SGD, but {exc}") from None


def check_claim_matches_request(
    impl: Implementation, request: Request, trained: TrainedModel | SequenceModel | None = None
) -> TrainedModel | SequenceModel:
    """The claim is about the requested run: sampling rate q, exactly ``hyperparameters.steps`` steps,
    and the requested σ (or, with a target ε, some σ > 0: see :func:`check_calibration`). A private run
    (σ > 0) claims a finite ε, a non-private one (σ = 0) an infinite ε."""
    name = _name(impl)
    trained = trained if trained is not None else _train(impl, request)
    claim, hp = trained.claim, request.hyperparameters
    sigma, rate, steps = _claimed_dpsgd(name, claim)
    assert math.isclose(rate, hp.sampling_rate, rel_tol=1e-9) or _takes_no_amplification_beyond(claim, hp.sampling_rate), (
        f"{name}: the claim's sampling rate {rate!r} is not the requested q = {hp.sampling_rate!r} (a claim of "
        "correlated noise that takes no amplification states every record in every step, or in one phase of the "
        "1/q fixed batches)"
    )
    assert steps == hp.steps, (
        f"{name}: the claim accounts for {steps} steps, the request asks for {hp.steps} "
        f"({hp.epochs} epochs × {hp.steps_per_epoch} steps)"
    )
    if hp.noise_multiplier is not None:
        assert math.isclose(sigma, hp.noise_multiplier, rel_tol=1e-9, abs_tol=1e-12), (
            f"{name}: the claim's noise multiplier {sigma!r} is not the requested σ = {hp.noise_multiplier!r}"
        )
    else:
        assert sigma > 0, f"{name}: a target ε was requested but the claim's σ is {sigma}"
    if sigma > 0:
        assert math.isfinite(claim.epsilon), f"{name}: σ = {sigma} > 0 but the claimed ε is infinite"
    else:
        assert math.isinf(claim.epsilon), f"{name}: σ = 0 (no noise) but the claimed ε is {claim.epsilon}, not infinite"
    for key, value in claim.other_epsilons.items():
        assert isinstance(value, float) and value >= 0, f"{name}: other_epsilons[{key!r}] = {value!r} is not an ε"
    return trained


def _takes_no_amplification_beyond(claim: PrivacyClaim, sampling_rate: float) -> bool:
    """Whether a claim of correlated noise at rate 1 reads (:class:`~dpverify.stats.events.CorrelatedRelease`)
    as every record in every step, or in one phase of the 1/q fixed batches the request names (DP-FTRL: each
    epoch one pass over the data in 1/q batches). The first one's sensitivity, the largest ‖CG‖ over gradients
    of norm at most 1 at every step, bounds any participation; the second is the fixed-batch reading of q. A
    cyclic claim of another cycle states a participation the request did not ask for."""
    from dpverify.stats.events import correlated_release

    if claim.noise_structure is None:
        return False
    try:
        release = correlated_release(claim)
    except ValueError:
        return False
    return release.sampling_rate == 1 and (release.cycle == 1 or math.isclose(release.cycle * sampling_rate, 1.0, rel_tol=1e-9))


def check_determinism(
    impl: Implementation,
    request: TrainingRequest,
    trained: TrainedModel | None = None,
    *,
    atol: float = 1e-6,
    check_seed_matters: bool = True,
) -> TrainedModel:
    """The request's seed decides the run on one device: a second training with the same request gives
    the same outputs (within ``atol``) and the same claim. With ``check_seed_matters`` and σ > 0,
    another seed must give different outputs (a seed that is ignored makes a run irreproducible)."""
    name = _name(impl)
    first = trained if trained is not None else _train(impl, request)
    second = _train(impl, request)
    probe = request.features
    a, b = _log_proba(impl, first, probe), _log_proba(impl, second, probe)
    assert a.shape == b.shape, f"{name}: two runs with seed {request.seed} gave shapes {a.shape} and {b.shape}"
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    assert diff <= atol, (
        f"{name}: two runs with the same seed {request.seed} on {first.device} differ by up to {diff:.3g} "
        f"in log-probability (allowed {atol:g}); seed every random source (init, sampling, noise)"
    )
    assert first.claim == second.claim, f"{name}: two runs with the same seed claim {first.claim} and {second.claim}"
    hp = request.hyperparameters
    if check_seed_matters and (hp.noise_multiplier is None or hp.noise_multiplier > 0):
        other = dataclasses.replace(request, seed=request.seed + 1)
        c = _log_proba(impl, _train(impl, other), probe)
        assert not np.allclose(a, c, rtol=0.0, atol=atol), (
            f"{name}: seeds {request.seed} and {request.seed + 1} gave the same outputs; the seed is ignored"
        )
    return first


def check_calibration(
    impl: Implementation, request: Request, tolerance: float = 0.01, trained: TrainedModel | SequenceModel | None = None
) -> TrainedModel | SequenceModel:
    """With a target ε, the claimed ε is within ``tolerance`` (relative) of it and σ > 0."""
    name = _name(impl)
    target = request.hyperparameters.target_epsilon
    if target is None:
        raise ValueError(f"check_calibration needs a request with target_epsilon (checking {name})")
    trained = trained if trained is not None else _train(impl, request)
    claim = trained.claim
    sigma = _claimed_dpsgd(name, claim)[0]
    assert sigma > 0, f"{name}: calibrated to ε = {target} but the claim's σ is {sigma}"
    assert math.isfinite(claim.epsilon) and abs(claim.epsilon - target) <= tolerance * target, (
        f"{name}: calibrated to ε = {target:g} but claims ε = {claim.epsilon:.6g} "
        f"(allowed {100 * tolerance:g} % off); σ = {sigma:.6g}"
    )
    return trained


def with_target_epsilon(request: RequestType, target_epsilon: float) -> RequestType:
    """``request`` with σ replaced by a target ε (same data, seed and other hyperparameters)."""
    hp = dataclasses.replace(request.hyperparameters, noise_multiplier=None, target_epsilon=target_epsilon)
    return dataclasses.replace(request, hyperparameters=hp)


def softmax_regression_request(request: TrainingRequest) -> TrainingRequest:
    """``request``'s twin for :func:`check_softmax_regression`: softmax regression (hidden width 0, no
    tags), trained without noise (σ = 0) on its records with the last :data:`UNTOUCHED_COORDINATES`
    coordinates set to zero, so no record touches them."""
    if request.dimension <= UNTOUCHED_COORDINATES:
        raise ValueError(
            f"the softmax-regression check needs dimension > {UNTOUCHED_COORDINATES}, got {request.dimension}"
        )
    features = request.features.copy()
    features[:, -UNTOUCHED_COORDINATES:] = 0.0
    hp = dataclasses.replace(request.hyperparameters, noise_multiplier=0.0, target_epsilon=None)
    return dataclasses.replace(
        request,
        features=features,
        architecture=MLPArchitecture(hidden_width=0),
        hyperparameters=hp,
        tags=None,
        num_tags=0,
    )


def check_softmax_regression(
    impl: Implementation, request: TrainingRequest, trained: TrainedModel | None = None
) -> TrainedModel:
    """``hidden_width=0`` trains the designated model, a softmax regression whose weights start at zero,
    as its black box shows. ``request`` is a :func:`softmax_regression_request`.

    Two exact properties of that model, whatever the data: (1) the class differences of the
    log-probabilities, g(x) = log p(x)[1:] − log p(x)[0] = (W[1:] − W[0]) x + b[1:] − b[0], are affine in
    x, so on random probes x, y the defect g(x + y) − g(x) − g(y) + g(0) is zero; a hidden layer with a
    nonlinearity makes it of the order of the outputs. (2) Trained without noise from zero weights,
    every update of W is a sum of rows (p − y) xᵀ, so a coordinate that no record touches keeps its
    weights at exactly zero (for SGD, momentum and per-coordinate optimisers like Adam alike), and an
    input along it answers as input 0 does; a random initialisation (or an MLP) answers otherwise. Both
    allow float32 rounding only, see :func:`_roundoff`: run them on the CPU (the requests' default), not
    on a GPU that multiplies in TF32's 10-bit mantissa."""
    name = _name(impl)
    if not request.architecture.is_softmax_regression or request.hyperparameters.noise_multiplier != 0:
        raise ValueError(f"check_softmax_regression needs a softmax_regression_request(...) (checking {name})")
    untouched = np.flatnonzero(~request.features.any(axis=0))
    if not untouched.size:
        raise ValueError(f"check_softmax_regression needs a coordinate no record touches (checking {name})")
    trained = trained if trained is not None else _train(impl, request)
    defect, tolerance = affinity_defect(lambda x: _log_proba(impl, trained, x), request)
    assert defect <= tolerance, (
        f"{name}: the model is not a zero-initialised softmax regression: responses are not affine in the input "
        f"(defect {defect:.3g}, float32 rounding allows {tolerance:.3g}) — does the trainer build its own model "
        "instead of the requested architecture (hidden_width=0)?"
    )
    radius = _typical_norm(request)
    probes = np.zeros((1 + 2 * untouched.size, request.dimension), dtype=np.float32)
    for row, coordinate in enumerate(untouched):
        probes[1 + 2 * row, coordinate], probes[2 + 2 * row, coordinate] = radius, -radius
    out = _log_proba(impl, trained, probes).astype(np.float64)
    moved = np.abs(out[1:] - out[0]).max(axis=1)
    tolerance = _roundoff(request.dimension, out)
    worst = int(np.argmax(moved))
    assert moved[worst] <= tolerance, (
        f"{name}: the model is not a zero-initialised softmax regression: input coordinate "
        f"{untouched[worst // 2]}, which no training record touches, moves the log-probabilities by "
        f"{moved[worst]:.3g} (float32 rounding allows {tolerance:.3g}) after training without noise — does "
        "the trainer initialise the weights randomly, or build its own model instead of the requested "
        "architecture (hidden_width=0)?"
    )
    return trained


def check_hidden_layer(impl: Implementation, request: TrainingRequest, trained: TrainedModel | None = None) -> TrainedModel:
    """``hidden_width=h >= 1`` trains a model with hidden units: its responses are not affine in the input
    (the defect of :func:`check_softmax_regression` exceeds float32 rounding). A ReLU layer of h units
    between random probes bends the response by the order of the outputs; only a model without a
    nonlinearity, or with every unit dead on every probe, passes for affine."""
    name = _name(impl)
    width = request.architecture.hidden_width
    if width == 0:
        raise ValueError(f"check_hidden_layer needs a request with hidden_width >= 1 (checking {name})")
    trained = trained if trained is not None else _train(impl, request)
    defect, tolerance = affinity_defect(lambda x: _log_proba(impl, trained, x), request)
    assert defect > tolerance, (
        f"{name}: hidden_width={width} was requested but the responses are affine in the input (defect "
        f"{defect:.3g}, within float32 rounding {tolerance:.3g}): the model has no working hidden units — does "
        "the trainer build softmax regression (or a network without a nonlinearity) instead of the requested MLP?"
    )
    return trained


def _typical_norm(request: TrainingRequest) -> float:
    """The median norm of the request's records (1 if they are all zero): the probes' scale."""
    norm = float(np.median(np.linalg.norm(request.features, axis=1)))
    return norm if norm > 0 else 1.0


def _roundoff(dimension: int, log_probs: np.ndarray) -> float:
    """What float32 arithmetic may change in a combination of eight class-difference log-probabilities.

    Each log-probability carries at most about (d + 8) roundings of size ε₃₂·S, S = 1 + max |log p|: a
    float32 dot product of d terms for its logit (Higham's γ_d), the bias, the probe's own sum x + y
    and the log-softmax. The defect sums eight of them (four points, two classes each); a further
    factor 8 covers cancellation inside the dot products, which the black box cannot show."""
    scale = 1.0 + float(np.max(np.abs(log_probs)))
    return 64.0 * (dimension + 8) * FLOAT32_EPS * scale


def affinity_defect(log_proba: Callable[[np.ndarray], np.ndarray], request: TrainingRequest) -> tuple[float, float]:
    """max |g(x + y) − g(x) − g(y) + g(0)| over :data:`PROBE_PAIRS` Gaussian pairs of the records' typical
    norm (g: class differences of ``log_proba``, see :func:`check_softmax_regression`), and its float32
    allowance. The audit asks it of every softmax-regression black box too: a model that is not the
    designated one makes a Dirac audit blind."""
    rng = np.random.default_rng(2024)
    x, y = rng.standard_normal((2, PROBE_PAIRS, request.dimension))
    scale = _typical_norm(request)  # once: a pass over every record (0.7 s on the 2-core CPU at the gpu profile)
    x *= scale / np.linalg.norm(x, axis=-1, keepdims=True)
    y *= scale / np.linalg.norm(y, axis=-1, keepdims=True)
    x, y = x.astype(np.float32), y.astype(np.float32)
    probes = np.concatenate([np.zeros((1, request.dimension), np.float32), x, y, x + y])
    out = np.asarray(log_proba(probes)).astype(np.float64)
    g = out[:, 1:] - out[:, :1]
    g_zero, g_x, g_y, g_sum = g[0], g[1 : 1 + PROBE_PAIRS], g[1 + PROBE_PAIRS : 1 + 2 * PROBE_PAIRS], g[1 + 2 * PROBE_PAIRS :]
    defect = float(np.max(np.abs(g_sum - g_x - g_y + g_zero)))
    return defect, _roundoff(request.dimension, out)


def designated_shapes(request: TrainingRequest) -> list[tuple[int, ...]]:
    """The shapes of the designated model's parameters in the order of
    :attr:`~dpverify.contract.Request.observe_update`: layer by layer, weight (outputs, inputs) then bias
    (outputs,); the tag head (UniAud++) after the main head."""
    d, h, c = request.dimension, request.architecture.hidden_width, request.num_classes
    layers = [(c, d)] if request.architecture.is_softmax_regression else [(h, d), (c, h)]
    if request.num_tags:
        layers.append((request.num_tags, h))
    return [shape for outputs, inputs in layers for shape in ((outputs, inputs), (outputs,))]


def check_update_hand_over(impl: Implementation, request: TrainingRequest) -> str:
    """A trainer that hands its updates over (:attr:`~dpverify.contract.Request.observe_update`) hands over
    the parameters before the first step and after each, steps 0..T in order, each a tuple of float arrays
    of :func:`designated_shapes`, copies (unchanged after they were handed over); for softmax regression the
    first are zero and the last are the black box's model (log-softmax(x Wᵀ + b) within float32 rounding).
    Returns :data:`HANDS_OVER_EVERY_UPDATE`, or :data:`HANDS_OVER_NO_UPDATES` for a trainer that never calls
    it: that is no failure (its audits read the final model, and its every-update audits do not run)."""
    name = _name(impl)
    handed: list[tuple[int, tuple, tuple[np.ndarray, ...]]] = []

    def observe(step: int, parameters) -> None:
        snapshot = tuple(np.array(p, copy=True) for p in parameters) if isinstance(parameters, (tuple, list)) else ()
        handed.append((step, parameters, snapshot))

    trained = _train(impl, dataclasses.replace(request, observe_update=observe))
    if not handed:
        return HANDS_OVER_NO_UPDATES
    steps = request.hyperparameters.steps
    order = [step for step, _, _ in handed]
    assert order == list(range(steps + 1)), (
        f"{name}: observe_update was called for steps {order[:12]}{'...' if len(order) > 12 else ''}; expected "
        f"0 (before the first step), then 1..{steps} after each DP step, in order"
    )
    expected = designated_shapes(request)
    for step, parameters, snapshot in handed:
        assert isinstance(parameters, (tuple, list)) and all(isinstance(p, np.ndarray) for p in parameters), (
            f"{name}: observe_update({step}, ...) must be given a tuple of numpy arrays, got {type(parameters).__name__}"
        )
        shapes = [p.shape for p in parameters]
        assert shapes == expected, (
            f"{name}: the parameters handed over after step {step} have shapes {shapes}, expected {expected} "
            "(each weight as (outputs, inputs): transpose a Keras or JAX kernel)"
        )
        assert all(np.issubdtype(p.dtype, np.floating) for p in parameters), f"{name}: parameters must be float arrays"
        assert all(np.array_equal(p, q) for p, q in zip(parameters, snapshot)), (
            f"{name}: the parameters handed over after step {step} changed later: hand over copies, not the "
            "training buffers"
        )
    if request.architecture.is_softmax_regression and not request.num_tags:
        weight, bias = (p.astype(np.float64) for p in handed[-1][1])
        assert not np.any(handed[0][1][0]) and not np.any(handed[0][1][1]), (
            f"{name}: softmax regression starts at zero, but the parameters handed over before the first step are not"
        )
        logits = request.features.astype(np.float64) @ weight.T + bias
        out = _log_proba(impl, trained, request.features).astype(np.float64)
        gap, tolerance = hand_over_gap(logits, out, dimension=request.dimension)
        assert gap <= tolerance, (
            f"{name}: the last parameters handed over are not the returned model's: their log-probabilities "
            f"differ by {gap:.3g} (float32 rounding allows {tolerance:.3g})"
        )
    return HANDS_OVER_EVERY_UPDATE


def hand_over_gap(logits: np.ndarray, log_probs: np.ndarray, *, dimension: int) -> tuple[float, float]:
    """max |log-softmax(``logits``) − ``log_probs``| over some records of ``dimension`` features, where
    ``logits`` are those of the last softmax-regression parameters a trainer handed over and ``log_probs`` its
    black box's answers, and the float32 rounding that allows (:func:`_roundoff`): a larger gap says the
    parameters handed over are not the returned model's. The every-update audit asks it too."""
    logits = np.asarray(logits, dtype=np.float64)
    mine = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return float(np.max(np.abs(mine - log_probs))), _roundoff(dimension, log_probs)


def run_conformance(
    impl: Implementation,
    *,
    request: TrainingRequest | None = None,
    target_epsilon: float = 1.0,
    architectures: Sequence[MLPArchitecture] | None = None,
) -> str:
    """All checks on ``request`` (default :func:`small_request`) with the first of ``architectures``, on its
    target-ε twin (:func:`with_target_epsilon`), and on every architecture the output contract and the
    model check (:func:`check_softmax_regression` on the :func:`softmax_regression_request` twin,
    :func:`check_hidden_layer` for an MLP), and :func:`check_update_hand_over` on the softmax-regression twin
    (on ``request`` when the trainer trains no softmax regression); returns what that check reports.

    ``architectures`` are the models the implementation trains: by default the request's MLP and softmax
    regression (the model of the default profiles); a trainer that only trains softmax regression gives
    ``[MLPArchitecture(hidden_width=0)]``. The checks speak the classification contract; a language-model
    implementation (``info.task == "language"``) is refused with a ``ValueError`` naming its suite,
    :func:`dpverify.language_conformance.run_language_conformance`."""
    if impl.info.task != "classification":
        raise ValueError(
            f"{impl.info.name} trains a {impl.info.task} model; these checks cover the classification contract "
            "(TrainingRequest -> TrainedModel): run dpverify.language_conformance.run_language_conformance"
        )
    request = request if request is not None else small_request()
    if architectures is None:
        architectures = (request.architecture, MLPArchitecture(hidden_width=0))
    architectures = tuple(dict.fromkeys(architectures))  # the default's two are one for a softmax request
    if not architectures or not all(isinstance(a, MLPArchitecture) for a in architectures):
        raise ValueError(f"architectures must be one or more MLPArchitecture, got {architectures!r}")
    request = dataclasses.replace(request, architecture=architectures[0])
    trained = check_output_contract(impl, request)
    check_claim_matches_request(impl, request, trained)
    check_determinism(impl, request, trained)
    calibrated_request = with_target_epsilon(request, target_epsilon)
    calibrated = check_calibration(impl, calibrated_request)
    check_output_contract(impl, calibrated_request, calibrated)
    check_claim_matches_request(impl, calibrated_request, calibrated)
    for architecture in architectures:
        if architecture.is_softmax_regression:
            softmax = softmax_regression_request(request)
            check_softmax_regression(impl, softmax, check_output_contract(impl, softmax))
        elif architecture == request.architecture:
            check_hidden_layer(impl, request, trained)
        else:
            twin = dataclasses.replace(request, architecture=architecture)
            check_hidden_layer(impl, twin, check_output_contract(impl, twin))
    softmax_trained = any(architecture.is_softmax_regression for architecture in architectures)
    return check_update_hand_over(impl, softmax_regression_request(request) if softmax_trained else request)
