"""The steps every audit shares, whatever its canaries and task: the lowest floor of :mod:`dpverify.audits`.

A design (:mod:`~dpverify.audits.classification`, :mod:`~dpverify.audits.data_dependent`,
:mod:`~dpverify.audits.language`) builds its request and its scorer from these steps:
:func:`audit_streams` (seeds), :func:`membership_before_training` / :func:`membership_after_training` (the
secret bits, drawn when the design's relation needs them), :func:`present_pair` (Algorithm 2's "show the
trained or the fresh value"), then :func:`audit_through_contract` (train, claim, score, conclude) with its
parts :func:`train_through_contract`, :func:`query_black_box`, :func:`claimed_epsilon`,
:func:`guess_and_bound`, :func:`decide_verdict`, :func:`concluded_result` and :func:`error_result`. A step
that fails raises :class:`AuditFailure`, which the audit turns into verdict ``error``. Nothing here knows a
design by name, and nothing here imports a design.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from dpverify.contract import DPHyperparameters, Implementation, PrivacyClaim, Request, TrainedModel
from dpverify.results import AuditResult
from dpverify.stats.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.stats.scoring import GuessRule, count_correct, guesses_from_scores

Progress = Callable[[str], None]


class AuditSettings(Protocol):
    """What the shared steps read of a design's config (:class:`dpverify.config.AuditConfig`,
    :class:`dpverify.audits.language.LanguageAuditConfig`)."""

    design: str
    confidence: float
    seed: int
    guess_rule: GuessRule
    hyperparameters: DPHyperparameters

    @property
    def relation(self) -> str: ...

    @property
    def audit_size(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...

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


def audit_ceiling(config: AuditSettings, m: int | None = None) -> float:
    """ε_O of this audit: the largest ε_L its guess rule could report, every guess correct."""
    m = config.audit_size if m is None else m
    counts = config.guess_rule.counts(m)
    confidence = config.guess_rule.corrected_confidence(config.confidence)
    return float(np.max(epsilon_lower_bound(m, counts, counts, delta=config.hyperparameters.delta, confidence=confidence)))


def canaries_needed(config: AuditSettings, claimed_epsilon: float) -> int | None:
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


def result_fields(implementation: Implementation, config: AuditSettings, m: int) -> dict[str, Any]:
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


def error_result(fields: dict[str, Any], config: AuditSettings, failure: AuditFailure, *, device: str, clock: AuditClock) -> AuditResult:
    """Verdict ``error``: the audit could not run because ``failure`` happened."""
    return AuditResult(
        **fields,
        claimed_epsilon=math.nan,
        epsilon_lower_bound=math.nan,
        guesses=0,
        correct=0,
        optimal_epsilon=audit_ceiling(config, fields["m"]),
        verdict="error",
        device=failure.device or device,
        seconds=clock.seconds(),
        auditor_seconds=clock.auditor_seconds,
        error=f"{fields['implementation']}: {failure.cause}",
    )


def train_through_contract(implementation: Implementation, request: Request, *, returns: type = TrainedModel) -> Any:
    """``implementation.train(request)``, checked to return a ``returns`` (the contract's black-box type:
    :class:`TrainedModel`, or :class:`~dpverify.contract.SequenceModel` for a language model) with a claim."""
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


def decide_verdict(config: AuditSettings, lower_bound: float, claimed: float, m: int) -> tuple[str, int | None]:
    """``(verdict, canaries needed)``: violation when ε_L exceeds the claim, undecided when the claim is
    at or above this audit's ceiling ε_O (with the m that would decide it), else pass."""
    if lower_bound > claimed:
        return "violation", None
    if claimed >= audit_ceiling(config, m):
        return "undecided", canaries_needed(config, claimed)
    return "pass", None


def concluded_result(
    fields: dict[str, Any],
    config: AuditSettings,
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
    config: AuditSettings,
    request: Request,
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


def membership_before_training(relation: str, rng: np.random.Generator, m: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``(bits drawn now or None, which of the m records to train on)``, by the relation the design tests.

    add/remove: the bits are drawn before training and S_i = +1 puts record i in the training set.
    replace-one (Algorithm 2): every record is trained on and the bits are drawn after training
    (:func:`membership_after_training`), so the trainer cannot depend on them."""
    if relation == "add_remove":
        drawn = draw_membership(rng, m)
        return drawn, drawn == 1
    return None, np.ones(m, dtype=bool)


def membership_after_training(drawn_before: np.ndarray | None, rng: np.random.Generator, m: int) -> np.ndarray:
    """The secret bits once the model is trained: those drawn before training, or m drawn now."""
    return drawn_before if drawn_before is not None else draw_membership(rng, m)


def present_pair(membership: np.ndarray, trained: np.ndarray, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shown, other)``: S_i = +1 presents record i's trained value and S_i = −1 its fresh one (Algorithm
    2, lines 5–7). The values are labels, rows of tags or likelihoods; ``membership`` (m,) broadcasts over
    their trailing axes. Any score of (shown, other) then obeys Theorem 1 in the replace-one relation."""
    picks_trained = (membership == 1).reshape(membership.shape + (1,) * (np.ndim(trained) - 1))
    return np.where(picks_trained, trained, fresh), np.where(picks_trained, fresh, trained)
