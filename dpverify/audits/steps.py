"""One audit, end to end: canaries, one training run through the contract, scores, guesses, bound, verdict.

The steps every design shares are public, so that other audits (the data-dependent designs in
:mod:`dpverify.audits.data_dependent`, a language-model audit) reuse them rather than copy them:
:func:`audit_through_contract` (train, claim, score, conclude) and its parts :func:`result_fields`,
:func:`train_through_contract`, :func:`query_black_box`, :func:`claimed_epsilon`, :func:`guess_and_bound`,
:func:`decide_verdict`, :func:`concluded_result` and :func:`error_result`; :func:`draw_membership`. A
step that fails raises :class:`AuditFailure`, which the audit turns into verdict ``error``.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dpverify.stats.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.canaries.synthetic import make_canaries
from dpverify.config import AuditConfig
from dpverify.contract import Implementation, PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.results import AuditResult
from dpverify.stats.scoring import (
    GuessRule,
    count_correct,
    guesses_from_scores,
    loss_scores,
    mean_comparison_scores,
    self_comparison_scores,
)

Progress = Callable[[str], None]

#: Largest m :func:`canaries_needed` looks at; past it the δ term 2mδ of Theorem 1 dominates anyway.
MAX_CANARIES = 10_000_000


def resolve_device(device: str) -> str:
    """``auto`` means CUDA when torch sees a GPU, else CPU. Importing torch happens only here, lazily."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def audit_ceiling(config: AuditConfig, m: int | None = None) -> float:
    """ε_O of this audit: the largest ε_L its guess rule could report, every guess correct."""
    m = config.audit_size if m is None else m
    counts = config.guess_rule.counts(m)
    confidence = config.guess_rule.corrected_confidence(config.confidence)
    return float(np.max(epsilon_lower_bound(m, counts, counts, delta=config.hyperparameters.delta, confidence=confidence)))


def canaries_needed(config: AuditConfig, claimed_epsilon: float) -> int | None:
    """Smallest m whose ceiling exceeds ``claimed_epsilon`` (None when no m up to MAX_CANARIES does)."""
    if not math.isfinite(claimed_epsilon):
        return None
    low, high = config.audit_size, config.audit_size
    while audit_ceiling(config, high) <= claimed_epsilon:
        low, high = high, high * 2
        if high > MAX_CANARIES:
            return None
    while high - low > max(1, low // 100):
        mid = (low + high) // 2
        low, high = (low, mid) if audit_ceiling(config, mid) > claimed_epsilon else (mid, high)
    return high


def claim_in_relation(claim: PrivacyClaim, relation: str) -> tuple[float, str]:
    """The claimed run's ε in ``relation``, and how it was obtained.

    The same relation: the claim as stated. Otherwise the ε of the Poisson-subsampled Gaussian with the
    claim's (σ, q, steps, δ) in that relation, by our own upper-bounding PLD accountant (never below the
    library's own ε). This trusts that the claim's numbers are those the run used; the inclusion design
    tests the library's ε as stated, without that assumption.
    """
    if claim.relation == relation:
        return claim.epsilon, f"as stated by {claim.accountant}"
    from dpverify.stats import accounting

    convert = accounting.replace_one_epsilon if relation == "replace_one" else accounting.add_remove_epsilon
    derived = convert(
        noise_multiplier=claim.noise_multiplier,
        sampling_rate=claim.sampling_rate,
        steps=claim.steps,
        delta=claim.delta,
    )
    return max(float(derived), claim.epsilon), (
        f"{relation} ε of the claimed run (σ={claim.noise_multiplier:.4g}, q={claim.sampling_rate:g}, "
        f"steps={claim.steps}) by dpverify's PLD accountant; {claim.accountant} states "
        f"{claim.relation} ε = {claim.epsilon:.4g}"
    )


class AuditFailure(Exception):
    """A step of an audit failed because of the implementation under audit (its training, black box or
    claim); ``device`` is where it ran, when known. The audit reports it as verdict ``error``."""

    def __init__(self, cause: str, *, device: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.device = device


@dataclass
class AuditClock:
    """When the audit started, and how many of its seconds were the auditor's own work."""

    started: float
    auditor_seconds: float = 0.0
    black_box_seconds: float = 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self.started


class _TimedBlackBoxes:
    """``trained`` whose black boxes add their seconds to ``clock.black_box_seconds``: answering queries is
    the trained model's work, not the auditor's (canaries, scores, guesses and the bound)."""

    def __init__(self, trained: Any, clock: AuditClock) -> None:
        self._trained, self._clock = trained, clock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._trained, name)
        if not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self._clock.black_box_seconds += time.perf_counter() - started

        return timed


def result_fields(implementation: Implementation, config: AuditConfig, m: int) -> dict[str, Any]:
    """The :class:`AuditResult` fields every outcome of this audit shares."""
    return dict(
        implementation=implementation.info.name,
        expected=implementation.info.expected,
        detectability=implementation.info.detectability,
        design=config.design,
        relation=config.relation,
        delta=config.hyperparameters.delta,
        confidence=config.confidence,
        m=m,
        seed=config.seed,
        config=config.to_dict(),
    )


def error_result(fields: dict[str, Any], config: AuditConfig, failure: AuditFailure, *, device: str, clock: AuditClock) -> AuditResult:
    """Verdict ``error``: the audit could not run because ``failure`` happened."""
    return AuditResult(
        **fields,
        claimed_epsilon=math.nan,
        epsilon_lower_bound=0.0,
        guesses=0,
        correct=0,
        optimal_epsilon=audit_ceiling(config, fields["m"]),
        verdict="error",
        device=failure.device or device,
        seconds=clock.seconds(),
        auditor_seconds=clock.auditor_seconds,
        error=f"{fields['implementation']}: {failure.cause}",
    )


def train_through_contract(implementation: Implementation, request: Any, *, returns: type = TrainedModel) -> Any:
    """``implementation.train(request)``, checked to return a ``returns`` (the contract's black-box type:
    :class:`TrainedModel`, or :class:`dpverify.audits.language.SequenceModel` for a language model) with a claim."""
    try:
        trained = implementation.train(request)
    except Exception as exc:  # the implementation's failure is the audit's verdict, not a crash
        raise AuditFailure(f"training raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}") from exc
    if not isinstance(trained, returns) or not isinstance(getattr(trained, "claim", None), PrivacyClaim):
        expected = f"{returns.__module__}.{returns.__qualname__}"
        raise AuditFailure(f"train() must return a {expected} with a PrivacyClaim, got {trained!r}")
    return trained


def query_black_box(
    trained: TrainedModel, features: np.ndarray, *, expected_shape: tuple[int, int], head: str = "predict_log_proba"
) -> np.ndarray:
    """The black box ``head`` of ``trained`` on ``features`` as float64, checked for shape and finiteness."""
    predict = getattr(trained, head)
    if predict is None:
        raise AuditFailure(f"returned no {head} black box; the request asked for it", device=trained.device)
    try:
        log_probs = np.asarray(predict(features), dtype=np.float64)
    except Exception as exc:
        raise AuditFailure(f"{head} raised {type(exc).__name__}: {exc}", device=trained.device) from exc
    if log_probs.shape != expected_shape:
        raise AuditFailure(
            f"{head} returned shape {log_probs.shape}, expected {expected_shape} (records × outputs)",
            device=trained.device,
        )
    if not np.all(np.isfinite(log_probs)):
        rows = int(np.count_nonzero(~np.isfinite(log_probs).all(axis=1)))
        raise AuditFailure(
            f"{head} returned NaN or infinite values in {rows} of {expected_shape[0]} rows (did training diverge? "
            "try a smaller learning_rate)",
            device=trained.device,
        )
    return log_probs


def claimed_epsilon(trained: TrainedModel, relation: str) -> tuple[float, str]:
    """:func:`claim_in_relation` of the trained model's claim; a claim that cannot be converted fails."""
    try:
        return claim_in_relation(trained.claim, relation)
    except Exception as exc:
        raise AuditFailure(f"its claim could not be converted to {relation}: {exc}", device=trained.device) from exc


@dataclass(frozen=True)
class GuessOutcome:
    """The best row of the guess rule: ``guesses`` made, ``correct`` among them, their ε_L (Theorem 1) and
    the f-DP ε_L at the same count; ``bound_by_guesses`` holds (guesses, correct, ε_L) for every count."""

    guesses: int
    correct: int
    epsilon_lower_bound: float
    fdp_epsilon_lower_bound: float
    bound_by_guesses: tuple[tuple[int, int, float], ...]


def guess_and_bound(
    scores: np.ndarray, membership: np.ndarray, *, guess_rule: GuessRule, confidence: float, delta: float
) -> GuessOutcome:
    """Guess from ``scores`` with every count of ``guess_rule``, count the correct guesses against the
    secret bits ``membership`` (±1) and keep the count with the largest ε_L; each count's bound is at the
    rule's Bonferroni-corrected ``confidence``, so the maximum keeps ``confidence``."""
    m = int(scores.shape[0])
    counts = guess_rule.counts(m)
    corrects = np.array([count_correct(guesses_from_scores(scores, int(k), sides=guess_rule.sides), membership) for k in counts])
    bound_kwargs = dict(delta=delta, confidence=guess_rule.corrected_confidence(confidence))
    bounds = np.atleast_1d(epsilon_lower_bound(m, counts, corrects, **bound_kwargs))
    rows = tuple((int(k), int(c), float(b)) for k, c, b in zip(counts, corrects, bounds))
    guesses, correct, lower_bound = max(rows, key=lambda row: row[2])
    fdp_bound = float(fdp_epsilon_lower_bound(m, guesses, correct, **bound_kwargs))
    return GuessOutcome(guesses, correct, lower_bound, fdp_bound, rows)


def decide_verdict(config: AuditConfig, lower_bound: float, claimed: float, m: int) -> tuple[str, int | None]:
    """``(verdict, canaries needed)``: violation when ε_L exceeds the claim, undecided when the claim is
    at or above this audit's ceiling ε_O (with the m that would decide it), else pass."""
    if lower_bound > claimed:
        return "violation", None
    if claimed >= audit_ceiling(config, m):
        return "undecided", canaries_needed(config, claimed)
    return "pass", None


def concluded_result(
    fields: dict[str, Any],
    config: AuditConfig,
    trained: TrainedModel,
    scores: np.ndarray,
    membership: np.ndarray,
    *,
    claim: tuple[float, str],
    clock: AuditClock,
    test_accuracy: float | None = None,
) -> AuditResult:
    """Guesses, bound and verdict of ``scores`` against ``membership``, as the audit's result; ``claim`` is
    :func:`claimed_epsilon` of ``trained`` in the design's relation."""
    m = fields["m"]
    claimed, derivation = claim
    outcome = guess_and_bound(
        scores, membership, guess_rule=config.guess_rule, confidence=config.confidence, delta=config.hyperparameters.delta
    )
    verdict, needed = decide_verdict(config, outcome.epsilon_lower_bound, claimed, m)
    return AuditResult(
        **fields,
        claimed_epsilon=claimed,
        library_epsilon=trained.claim.epsilon,
        claim_derivation=derivation,
        epsilon_lower_bound=outcome.epsilon_lower_bound,
        fdp_epsilon_lower_bound=outcome.fdp_epsilon_lower_bound,
        guesses=outcome.guesses,
        correct=outcome.correct,
        optimal_epsilon=audit_ceiling(config, m),
        canaries_needed=needed,
        verdict=verdict,
        device=trained.device,
        seconds=clock.seconds(),
        auditor_seconds=clock.auditor_seconds,
        scores=scores,
        membership=membership,
        bound_by_guesses=outcome.bound_by_guesses,
        test_accuracy=test_accuracy,
    )


#: Turns the trained black box into ``(scores, membership, test accuracy or None)``.
Scorer = Callable[[TrainedModel], "tuple[np.ndarray, np.ndarray, float | None]"]


def audit_through_contract(
    implementation: Implementation,
    config: AuditConfig,
    request: TrainingRequest,
    score: Scorer,
    *,
    m: int,
    clock: AuditClock,
    say: Progress,
    returns: type = TrainedModel,
) -> AuditResult:
    """Train ``implementation`` on ``request``, convert its claim to the design's relation, ``score`` the
    black box (the auditor's time, the black box's answers excluded) and conclude; any :class:`AuditFailure` on the way
    ends as verdict ``error``. ``returns`` is the black-box type the request's contract promises."""
    fields = result_fields(implementation, config, m)
    try:
        trained = train_through_contract(implementation, request, returns=returns)
        claim = claimed_epsilon(trained, config.relation)
        say("querying the black box")
        scoring_started, answering = time.perf_counter(), clock.black_box_seconds
        scores, membership, accuracy = score(_TimedBlackBoxes(trained, clock))
        clock.auditor_seconds += time.perf_counter() - scoring_started - (clock.black_box_seconds - answering)
        return concluded_result(
            fields, config, trained, scores, membership, claim=claim, clock=clock, test_accuracy=accuracy
        )
    except AuditFailure as failure:
        return error_result(fields, config, failure, device=request.device, clock=clock)


def draw_membership(rng: np.random.Generator, m: int) -> np.ndarray:
    """m secret bits S_i, uniform over {−1, +1} (int8)."""
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=m)


def audit_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, int]:
    """``(canary rng, membership rng, trainer's seed)``: independent streams spawned from one audit seed,
    so the same seed repeats the whole audit."""
    canary_seq, membership_seq, training_seq = np.random.SeedSequence(seed).spawn(3)
    return (
        np.random.default_rng(canary_seq),
        np.random.default_rng(membership_seq),
        int(training_seq.generate_state(1)[0] % 2**31),
    )


def membership_before_training(design: str, rng: np.random.Generator, m: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``(bits drawn now or None, canaries to train on)``. Inclusion: the bits are drawn before training
    and pick the training set. Pair: every canary is trained on and the bits are drawn after training
    (Algorithm 2), so the trainer cannot depend on them."""
    if design == "inclusion":
        drawn = draw_membership(rng, m)
        return drawn, drawn == 1
    return None, np.ones(m, dtype=bool)


def run_audit(implementation: Implementation, config: AuditConfig, *, progress: Progress | None = None) -> AuditResult:
    """Audit ``implementation`` once under ``config``; never raises for a failing implementation.

    A failure in training, in the black box or in the claim ends as verdict ``error``. Seeds: one
    :class:`numpy.random.SeedSequence` from ``config.seed`` spawns the canaries', the membership bits' and
    the trainer's streams, so the same seed repeats the whole audit on the same device. Data-dependent
    designs run :func:`dpverify.audits.data_dependent.run_data_audit`; a language-model implementation runs
    :func:`dpverify.audits.language.run_language_audit` with this config's privacy target, level, seed and device.
    """
    if implementation.info.task == "language":
        from dpverify.audits.language import language_config_like, run_language_audit

        return run_language_audit(implementation, language_config_like(config), progress=progress)
    if not isinstance(config, AuditConfig):
        raise TypeError(
            f"{implementation.info.name} trains a classifier; audit it with a dpverify.config.AuditConfig, "
            f"got {type(config).__name__}"
        )
    if config.is_data_dependent:
        from dpverify.audits.data_dependent import run_data_audit

        return run_data_audit(implementation, config, progress=progress)
    say = progress or (lambda message: None)
    clock = AuditClock(time.perf_counter())
    device = resolve_device(config.device)  # may import torch once: the trainer's cost, not the auditor's
    auditor_started = time.perf_counter()
    canary_rng, membership_rng, training_seed = audit_streams(config.seed)
    canaries = make_canaries(config.canaries, rng=canary_rng)
    m = canaries.m
    drawn_before, trained_on = membership_before_training(config.design, membership_rng, m)
    request = TrainingRequest(
        features=canaries.features[trained_on],
        labels=canaries.labels[trained_on],
        num_classes=canaries.num_classes,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
    )
    clock.auditor_seconds = time.perf_counter() - auditor_started

    def score(trained: TrainedModel) -> tuple[np.ndarray, np.ndarray, None]:
        log_probs = query_black_box(trained, canaries.features, expected_shape=(m, canaries.num_classes))
        membership = drawn_before if drawn_before is not None else draw_membership(membership_rng, m)
        if config.design == "pair":
            # S = +1 presents the trained label, S = -1 the fresh one (Algorithm 2, lines 5-7).
            shown, other = (
                np.where(membership == 1, canaries.labels, canaries.comparison_labels),
                np.where(membership == 1, canaries.comparison_labels, canaries.labels),
            )
        else:
            shown, other = canaries.labels, canaries.comparison_labels
        if config.score_kind == "self_comparison":
            return self_comparison_scores(log_probs, shown, other), membership, None
        if config.score_kind == "mean_comparison":
            return mean_comparison_scores(log_probs, shown), membership, None
        return loss_scores(log_probs, shown), membership, None

    say(f"training {implementation.info.name} on {request.num_records} of {m} canaries ({device})")
    return audit_through_contract(implementation, config, request, score, m=m, clock=clock, say=say)
