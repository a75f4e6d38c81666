"""One audit, end to end: canaries, one training run through the contract, scores, guesses, bound, verdict."""

from __future__ import annotations

import math
import time
import traceback
from typing import Callable

import numpy as np

from dpverify.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.canaries import make_canaries
from dpverify.config import AuditConfig
from dpverify.contract import Implementation, PrivacyClaim, TrainedModel, TrainingRequest
from dpverify.results import AuditResult
from dpverify.scoring import (
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
    m = config.canaries.m if m is None else m
    counts = config.guess_rule.counts(m)
    confidence = config.guess_rule.corrected_confidence(config.confidence)
    return float(np.max(epsilon_lower_bound(m, counts, counts, delta=config.hyperparameters.delta, confidence=confidence)))


def canaries_needed(config: AuditConfig, claimed_epsilon: float) -> int | None:
    """Smallest m whose ceiling exceeds ``claimed_epsilon`` (None when no m up to MAX_CANARIES does)."""
    if not math.isfinite(claimed_epsilon):
        return None
    low, high = config.canaries.m, config.canaries.m
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
    from dpverify import accounting

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


def run_audit(implementation: Implementation, config: AuditConfig, *, progress: Progress | None = None) -> AuditResult:
    """Audit ``implementation`` once under ``config``; never raises for a failing implementation.

    A failure in training, in the black box or in the claim ends as verdict ``error``. Seeds: one
    :class:`numpy.random.SeedSequence` from ``config.seed`` spawns the canaries', the membership bits' and
    the trainer's streams, so the same seed repeats the whole audit on the same device.
    """
    say = progress or (lambda message: None)
    started = time.perf_counter()
    device = resolve_device(config.device)  # may import torch once: the trainer's cost, not the auditor's
    auditor_started = time.perf_counter()
    canary_seq, membership_seq, training_seq = np.random.SeedSequence(config.seed).spawn(3)
    canaries = make_canaries(config.canaries, rng=np.random.default_rng(canary_seq))
    membership_rng = np.random.default_rng(membership_seq)
    m = canaries.m
    if config.design == "inclusion":
        membership = membership_rng.choice(np.array([-1, 1], dtype=np.int8), size=m)
        trained_on = membership == 1
    else:
        membership = None  # drawn after training (Algorithm 2), so the trainer cannot depend on it
        trained_on = np.ones(m, dtype=bool)
    request = TrainingRequest(
        features=canaries.features[trained_on],
        labels=canaries.labels[trained_on],
        num_classes=canaries.num_classes,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=int(training_seq.generate_state(1)[0] % 2**31),
        device=device,
    )
    auditor_seconds = time.perf_counter() - auditor_started
    base = dict(
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

    def failed(cause: str, *, ran_on: str = device) -> AuditResult:
        return AuditResult(
            **base,
            claimed_epsilon=math.nan,
            epsilon_lower_bound=0.0,
            guesses=0,
            correct=0,
            optimal_epsilon=audit_ceiling(config),
            verdict="error",
            device=ran_on,
            seconds=time.perf_counter() - started,
            auditor_seconds=auditor_seconds,
            error=f"{implementation.info.name}: {cause}",
        )

    say(f"training {implementation.info.name} on {request.num_records} of {m} canaries ({device})")
    try:
        trained = implementation.train(request)
    except Exception as exc:  # the implementation's failure is the audit's verdict, not a crash
        return failed(f"training raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
    if not isinstance(trained, TrainedModel) or not isinstance(trained.claim, PrivacyClaim):
        return failed(f"train() must return a dpverify.contract.TrainedModel with a PrivacyClaim, got {trained!r}")
    say("querying the black box")
    try:
        log_probs = np.asarray(trained.predict_log_proba(canaries.features), dtype=np.float64)
    except Exception as exc:
        return failed(f"predict_log_proba raised {type(exc).__name__}: {exc}", ran_on=trained.device)
    expected_shape = (m, canaries.num_classes)
    if log_probs.shape != expected_shape:
        return failed(
            f"predict_log_proba returned shape {log_probs.shape}, expected {expected_shape} (canaries × classes)",
            ran_on=trained.device,
        )
    if not np.all(np.isfinite(log_probs)):
        rows = int(np.count_nonzero(~np.isfinite(log_probs).all(axis=1)))
        return failed(
            f"predict_log_proba returned NaN or infinite values in {rows} of {m} rows (did training diverge? "
            "try a smaller learning_rate)",
            ran_on=trained.device,
        )
    try:
        claimed_epsilon, derivation = claim_in_relation(trained.claim, config.relation)
    except Exception as exc:
        return failed(f"its claim could not be converted to {config.relation}: {exc}", ran_on=trained.device)

    scoring_started = time.perf_counter()
    if membership is None:
        membership = membership_rng.choice(np.array([-1, 1], dtype=np.int8), size=m)
    if config.design == "pair":
        # S = +1 presents the trained label, S = -1 the fresh one (Algorithm 2, lines 5-7).
        shown, other = (
            np.where(membership == 1, canaries.labels, canaries.comparison_labels),
            np.where(membership == 1, canaries.comparison_labels, canaries.labels),
        )
    else:
        shown, other = canaries.labels, canaries.comparison_labels
    if config.score_kind == "self_comparison":
        scores = self_comparison_scores(log_probs, shown, other)
    elif config.score_kind == "mean_comparison":
        scores = mean_comparison_scores(log_probs, shown)
    else:
        scores = loss_scores(log_probs, shown)
    counts = config.guess_rule.counts(m)
    corrects = np.array([count_correct(guesses_from_scores(scores, int(k), sides=config.guess_rule.sides), membership) for k in counts])
    bound_kwargs = dict(delta=config.hyperparameters.delta, confidence=config.guess_rule.corrected_confidence(config.confidence))
    bounds = np.atleast_1d(epsilon_lower_bound(m, counts, corrects, **bound_kwargs))
    rows = [(int(k), int(c), float(b)) for k, c, b in zip(counts, corrects, bounds)]
    guesses, correct, lower_bound = max(rows, key=lambda row: row[2])
    fdp_bound = float(fdp_epsilon_lower_bound(m, guesses, correct, **bound_kwargs))
    ceiling = audit_ceiling(config)
    if lower_bound > claimed_epsilon:
        verdict, needed = "violation", None
    elif claimed_epsilon >= ceiling:
        verdict, needed = "undecided", canaries_needed(config, claimed_epsilon)
    else:
        verdict, needed = "pass", None
    auditor_seconds += time.perf_counter() - scoring_started
    return AuditResult(
        **base,
        claimed_epsilon=claimed_epsilon,
        library_epsilon=trained.claim.epsilon,
        claim_derivation=derivation,
        epsilon_lower_bound=lower_bound,
        fdp_epsilon_lower_bound=fdp_bound,
        guesses=guesses,
        correct=correct,
        optimal_epsilon=ceiling,
        canaries_needed=needed,
        verdict=verdict,
        device=trained.device,
        seconds=time.perf_counter() - started,
        auditor_seconds=auditor_seconds,
        scores=scores,
        membership=membership,
        bound_by_guesses=tuple(rows),
    )
