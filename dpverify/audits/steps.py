"""The steps every audit shares, whatever its canaries and task: the lowest floor of :mod:`dpverify.audits`.

A design (:mod:`~dpverify.audits.classification`, :mod:`~dpverify.audits.data_dependent`,
:mod:`~dpverify.audits.language`) builds its request and its scorer from these steps:
:func:`audit_streams` (seeds), :func:`membership_before_training` / :func:`membership_after_training` (the
secret bits, drawn when the design's relation needs them), :func:`present_pair` (Algorithm 2's "show the
trained or the fresh value"), then :func:`audit_through_contract` (train, score, claim, conclude) with its
parts :func:`train_and_score` (:func:`train_through_contract`, :func:`query_black_box`),
:func:`conclude_runs` (:func:`claimed_epsilon`, :func:`guess_and_bound`, :func:`decide_verdict`,
:func:`concluded_result`) and :func:`error_result`. A step
that fails raises :class:`AuditFailure`, which the audit turns into verdict ``error``. Nothing here knows a
design by name, and nothing here imports a design.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator, Protocol

import numpy as np

from dpverify.config import OBSERVATIONS
from dpverify.contract import DPHyperparameters, Implementation, PrivacyClaim, Request, StepProgress, TrainedModel, TrainingRequest
from dpverify.results import POWER_STEP, AuditResult, beside_verdict
from dpverify.stats.accounting import optimistic_epsilon
from dpverify.stats.bounds import epsilon_lower_bound
from dpverify.stats.curves import (
    ClaimedRun,
    GaussianCurve,
    combined_curve_test,
    combined_refutes,
    curve_refutes,
    curve_test,
)
from dpverify.stats.looks import POOLED_LOOKS, look_schedule
from dpverify.stats.power import AuditPower, judge, measure_power, one_run_deficit
from dpverify.stats.scoring import GuessRule, correct_counts

Progress = Callable[[str], None]


class AuditSettings(Protocol):
    """What the shared steps read of a design's config (:class:`dpverify.config.AuditConfig`,
    :class:`dpverify.audits.language.LanguageAuditConfig`)."""

    design: str
    confidence: float
    seed: int
    timeout: float | None
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
    """``auto`` means CUDA when torch sees a GPU, else CPU; ``cuda`` without a GPU is a ``ValueError``
    (never a silent run on the CPU under a CUDA label). Importing torch happens only here, lazily."""
    if device == "cpu":
        return device
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if device == "cuda" and not available:
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU here; use 'auto' (CUDA when available) or 'cpu'")
    return "cuda" if available else "cpu"


def split_confidence(confidence: float) -> tuple[float, float]:
    """``(Steinke's, the curve test's)`` confidence: the audit's level is split evenly between the (ε, δ)
    test and the curve test (Bonferroni), so a verdict from either keeps ``confidence``; each then splits
    its share across the guess grid."""
    alpha = (1.0 - confidence) / 2.0
    return 1.0 - alpha, 1.0 - alpha


def pooled_looks(config: AuditSettings) -> list[tuple[int, float]]:
    """The looks at the audit's pooled runs, ``[(runs, confidence), ...]`` (:data:`~dpverify.stats.looks.POOLED_LOOKS`)."""
    return look_schedule(getattr(config, "pooled_runs", 1), config.confidence, looks=POOLED_LOOKS)


def final_look_confidence(config: AuditSettings) -> float:
    """The confidence of the audit's last look, on all its runs: the one a pass is decided at."""
    return pooled_looks(config)[-1][1]


def audit_ceiling(config: AuditSettings, m: int | None = None, *, delta: float | None = None) -> float:
    """ε_O of this audit: the largest ε_L its (ε, δ) test could report at its last look, every guess correct,
    at ``delta`` (the claim's; the requested δ before there is a claim)."""
    m = config.audit_size if m is None else m
    delta = config.hyperparameters.delta if delta is None else delta
    counts = config.guess_rule.counts(m)
    confidence = config.guess_rule.corrected_confidence(split_confidence(final_look_confidence(config))[0])
    return float(np.max(epsilon_lower_bound(m, counts, counts, delta=delta, confidence=confidence)))


def curve_test_can_refute(
    config: AuditSettings, m: int | None = None, *, sizes: tuple[int, ...] | None = None, mu: float = 0.0
) -> bool:
    """Whether every guess right would let the curve test refute the μ-GDP curve, by default even a perfectly
    private mechanism's (μ = 0: f(α) = 1 − α). When it cannot, no claimed curve is within this audit's reach;
    when it can, some claims are, whatever their ε, so an audit above its ceiling ε_O may still decide.
    Pooled runs are asked what the audit will ask them: each run's counts, combined; ``sizes`` (each run's
    canaries) defaults to ``(m,)`` when m is given, else to the config's own split."""
    if sizes is None:
        sizes = getattr(config, "canaries_per_run", (config.audit_size,)) if m is None else (m,)
    confidence = config.guess_rule.corrected_confidence(split_confidence(final_look_confidence(config))[1])
    curve = GaussianCurve(mu=mu)
    if len(sizes) == 1:
        counts = config.guess_rule.counts(sizes[0])
        return bool(np.any(curve_refutes(sizes[0], counts, counts, curve=curve, confidence=confidence)))
    counts = config.guess_rule.run_counts(sizes)
    return bool(np.any(combined_refutes(sizes, counts, counts, curve=curve, confidence=confidence)))


def canaries_needed(config: AuditSettings, claimed_epsilon: float, *, delta: float | None = None) -> int | None:
    """Smallest m whose ceiling exceeds ``claimed_epsilon`` (None when no m up to MAX_CANARIES does)."""
    if not math.isfinite(claimed_epsilon):
        return None
    low, high = config.audit_size, config.audit_size
    while audit_ceiling(config, high, delta=delta) <= claimed_epsilon:
        low, high = high, high * 2
        if high > MAX_CANARIES:
            return None
    while high - low > max(1, low // 100):
        mid = (low + high) // 2
        low, high = (low, mid) if audit_ceiling(config, mid, delta=delta) > claimed_epsilon else (mid, high)
    return high


@dataclass(frozen=True)
class Undecidable:
    """Why an audit could only end undecided, known before any training: ``setting`` is what sets its reach
    (``m``, the canaries or records; ``runs``, a two-world audit's runs per world), ``value`` its value and
    ``needed`` the smallest value that would decide (``None``: none up to the search's limit, ``limit``);
    ``alternative``, another fix where there is one."""

    setting: str
    value: int
    needed: int | None
    limit: int
    reason: str
    alternative: str | None = None

    def message(self, *, spelled: str | None = None) -> str:
        """The refusal in words, ending with the fix: the setting ``spelled`` as the face takes it (``--m ``,
        ``--set runs=``; by default ``m=``)."""
        spelled = f"{self.setting}=" if spelled is None else spelled
        if self.needed is None:
            fix = f"no {self.setting} up to {self.limit:,} can decide it"
        else:
            fix = f"use {spelled}{self.needed} or more"
        alternative = f", or {self.alternative}" if self.alternative else ""
        return f"{self.reason}, so the audit could only end undecided; {fix}{alternative}"


@dataclass(frozen=True)
class DesignatedClaim:
    """What an audit asks the implementation to claim, known before training: ``epsilon``, the least ε a
    claim at it may state (the target ε, or the ε of the run a noise multiplier designates: exact at q = 1,
    where the run is μ-GDP; 0 at q < 1, where dpverify's accountant bounds ε only from above), in words as
    ``what``; ``expected``, the ε to size the audit for (dpverify's accountant's at q < 1); and the GDP
    ``mu`` of the designated run at q = 1 (``None`` at q < 1), where a target ε designates the μ-GDP run
    whose ε it is."""

    epsilon: float
    what: str
    expected: float
    mu: float | None = None


def designated_claim(config: AuditSettings) -> DesignatedClaim | None:
    """:class:`DesignatedClaim` of ``config``'s privacy target in its design's relation; ``None`` for
    non-private training (σ = 0 or ε = ∞), which no audit refutes and which is run on purpose."""
    hp = config.hyperparameters
    if hp.target_epsilon is not None:
        if hp.sampling_rate < 1:
            return target_claim(hp.target_epsilon)
        run = ClaimedRun(noise_multiplier=1.0 / _full_batch_mu(hp.target_epsilon, hp.delta), steps=1, relation=config.relation)
        return target_claim(hp.target_epsilon, mu=run.mu)
    if not hp.noise_multiplier:
        return None
    run = ClaimedRun(noise_multiplier=hp.noise_multiplier, sampling_rate=hp.sampling_rate, steps=hp.steps, relation=config.relation)
    epsilon = run.epsilon(hp.delta)
    if run.mu is None:
        return DesignatedClaim(
            0.0, f"any ε (σ = {hp.noise_multiplier:g} at q = {hp.sampling_rate:g}: ε ≤ {epsilon:.3f} by dpverify's accountant)", epsilon
        )
    return DesignatedClaim(epsilon, f"the designated run's ε = {epsilon:.3f} (σ = {hp.noise_multiplier:g})", epsilon, run.mu)


#: Largest m the search for the canaries a curve test needs looks at: its cost grows with m (0.4 s at 10⁴).
CURVE_SEARCH_LIMIT = 2**14


def smallest_deciding(decides: Callable[[int], bool], *, start: int, limit: int) -> int | None:
    """The smallest count above ``start`` for which ``decides`` (growing with the count) holds, to within
    1 %, or ``None`` when none up to ``limit`` does."""
    low, high = start, max(start * 2, start + 1)
    while not decides(high):
        low, high = high, high * 2
        if high > limit:
            return None
    while high - low > max(1, low // 100):
        middle = (low + high) // 2
        low, high = (low, middle) if decides(middle) else (middle, high)
    return high


def target_claim(epsilon: float, *, mu: float | None = None) -> DesignatedClaim:
    """:class:`DesignatedClaim` of a target ε (of a μ-GDP run when ``mu`` is given)."""
    return DesignatedClaim(epsilon, f"the target ε = {epsilon:g}", epsilon, mu)


def _full_batch_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP run is ``epsilon``-DP at ``delta`` (add/remove; ε grows with μ)."""
    from scipy.optimize import brentq

    def excess(log_mu: float) -> float:
        return ClaimedRun(noise_multiplier=math.exp(-log_mu), steps=1).epsilon(delta) - epsilon

    return math.exp(brentq(excess, math.log(1e-6), math.log(1e3), xtol=1e-8))


def one_run_undecidable(config: AuditSettings, *, run_sizes: tuple[int, ...] | None = None) -> Undecidable | None:
    """Why a one-run audit under ``config`` could only end undecided, before training, or ``None``: its
    designated claim (:func:`designated_claim`) is at or above its ceiling ε_O and its curve test cannot
    refute the designated curve (any curve unless σ is given at q = 1). ``run_sizes``: the canaries of each
    pooled run (default: the config's own split, or one run of all m)."""
    claim = designated_claim(config)
    if claim is None:
        return None
    m = config.audit_size
    sizes = run_sizes or getattr(config, "canaries_per_run", (m,))
    ceiling = audit_ceiling(config)
    if claim.epsilon < ceiling or curve_test_can_refute(config, sizes=sizes, mu=claim.mu or 0.0):
        return None

    def curve_decides(canaries: int) -> bool:
        """Whether ``canaries``, split over as many runs as now, could refute the designated curve."""
        share, extra = divmod(canaries, len(sizes))
        split = tuple(share + (run < extra) for run in range(len(sizes)))
        return min(split) >= 1 and curve_test_can_refute(config, sizes=split, mu=claim.mu or 0.0)

    by_epsilon = canaries_needed(config, claim.expected)
    curve_limit = min(by_epsilon or MAX_CANARIES, CURVE_SEARCH_LIMIT)
    by_curve = None  # searched only for a known curve, and only where it could beat the (ε, δ) test
    if claim.mu is not None and m < curve_limit and curve_decides(curve_limit):
        by_curve = smallest_deciding(curve_decides, start=m, limit=curve_limit)
    needed = min((n for n in (by_epsilon, by_curve) if n is not None), default=None)
    return Undecidable(
        setting="m",
        value=m,
        needed=needed,
        limit=MAX_CANARIES if claim.mu is None else CURVE_SEARCH_LIMIT,
        alternative="lower the target ε" if config.hyperparameters.target_epsilon is not None else "raise the noise multiplier",
        reason=f"m = {m} canaries can show at most ε_O = {ceiling:.3f} (confidence {config.confidence:.4g}), not above "
        f"{claim.what}, and too few to refute the claimed mechanism's trade-off curve",
    )


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


class ObservationMissing(AuditFailure):
    """The trainer did not hand over what the audit's adversary observes (every update): the audit did not
    run, and says so as verdict ``undecided`` (design rule 16), never a pass nor an error."""


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
        observed=OBSERVATIONS[getattr(config, "observe", "final_model")],
    )


def error_result(fields: dict[str, Any], config: AuditSettings, failure: AuditFailure, *, device: str, clock: AuditClock) -> AuditResult:
    """Verdict ``error``: the audit could not run because ``failure`` happened; verdict ``undecided``,
    with the reason in ``not_run``, when the failure is that the trainer did not hand over what the
    audit's adversary observes (:class:`ObservationMissing`)."""
    cause = f"{fields['implementation']}: {failure.cause}"
    missing = isinstance(failure, ObservationMissing)
    return AuditResult(
        **fields,
        claimed_epsilon=math.nan,
        epsilon_lower_bound=math.nan,
        guesses=0,
        correct=0,
        optimal_epsilon=audit_ceiling(config, fields["m"]),
        verdict="undecided" if missing else "error",
        device=failure.device or device,
        seconds=clock.seconds(),
        auditor_seconds=clock.auditor_seconds,
        error=None if missing else cause,
        not_run=cause if missing else None,
    )


class _TimeUp(BaseException):
    """Raised inside training when its time limit passes (a BaseException, so a trainer's own
    ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupt the block with :class:`_TimeUp` after ``seconds`` (wall clock), by ``SIGALRM``: the
    main thread of a POSIX process only, as pytest-timeout's signal method; elsewhere, no limit."""
    usable = seconds is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def time_up(signum: int, frame: Any) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, time_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def train_through_contract(
    implementation: Implementation, request: Request, *, returns: type = TrainedModel, timeout: float | None = None
) -> Any:
    """``implementation.train(request)`` within ``timeout`` seconds, checked to return a ``returns`` (the
    contract's black-box type: :class:`TrainedModel`, or :class:`~dpverify.contract.SequenceModel` for a
    language model) with a claim."""
    try:
        with time_limit(timeout):
            trained = implementation.train(request)
    except _TimeUp:
        raise AuditFailure(
            f"training ran past the audit's time limit of {timeout:g} s (raise it with --dp-audit-timeout, "
            "the marker's timeout=, or a profile for a faster machine)"
        ) from None
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


def claimed_run(claim: PrivacyClaim, relation: str) -> ClaimedRun:
    """The mechanism ``claim`` describes, in ``relation``: its σ, q and steps, whose whole trade-off curve
    the claim asserts (design rule 9)."""
    return ClaimedRun(
        noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate, steps=claim.steps, relation=relation
    )


def claim_inconsistency(claim: PrivacyClaim) -> str | None:
    """Why the stated ε cannot hold for the run the claim itself describes, or ``None``.

    A claim whose ε is below the least ε of its own (σ, q, steps) in its own relation is refuted by its own
    numbers, with certainty: it is not silently tested at the larger value (design rule 8). The least ε is
    a certified lower bound (:func:`~dpverify.stats.accounting.optimistic_epsilon`; the exact GDP ε at
    q = 1), so no correct accountant, however tight, is refuted; the pessimistic ε the audit tests with is
    an upper bound, and would refute correct claims of tighter accountants than ours."""
    if not math.isfinite(claim.epsilon):
        return None
    run = claimed_run(claim, claim.relation)
    if run.mu is not None:  # full batch: exactly Gaussian DP
        least, source = run.epsilon(claim.delta), "the exact Gaussian-DP accountant"
    else:
        source = "dpverify's optimistic PLD accountant"
        least = optimistic_epsilon(
            noise_multiplier=claim.noise_multiplier,
            sampling_rate=claim.sampling_rate,
            steps=claim.steps,
            delta=claim.delta,
            relation=claim.relation,
        )
    if claim.epsilon >= least:
        return None
    return (
        f"{claim.accountant} states {claim.relation} ε = {claim.epsilon:.4g} at δ = {claim.delta:g}, but the run it "
        f"describes (σ = {claim.noise_multiplier:.4g}, q = {claim.sampling_rate:g}, {claim.steps} steps) has "
        f"at least {claim.relation} ε = {least:.4g} by {source}: the claim contradicts its own numbers"
    )


def claimed_epsilon(trained: TrainedModel | ScoredRun, relation: str) -> tuple[float, str]:
    """:func:`claim_in_relation` of a trained model's or a scored run's claim; a claim that cannot be
    converted fails."""
    claim = trained.claim
    if math.isnan(claim.epsilon):
        raise AuditFailure("its claim states ε = nan", device=trained.device)
    try:
        return claim_in_relation(claim, relation)
    except Exception as exc:
        raise AuditFailure(f"its claim could not be converted to {relation}: {exc}", device=trained.device) from exc


@dataclass(frozen=True)
class GuessOutcome:
    """Every count of the guess rule: ``bound_by_guesses`` holds (guesses, correct, Steinke ε_L) per count;
    ``guesses``, ``correct`` and ``epsilon_lower_bound`` are the row with the largest ε_L."""

    guesses: int
    correct: int
    epsilon_lower_bound: float
    bound_by_guesses: tuple[tuple[int, int, float], ...]

    @property
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``(guesses, correct)`` of every count, as arrays."""
        rows = np.array([row[:2] for row in self.bound_by_guesses], dtype=np.int64).reshape(-1, 2)
        return rows[:, 0], rows[:, 1]


def guess_and_bound(
    scores: np.ndarray, membership: np.ndarray, *, guess_rule: GuessRule, confidence: float, delta: float
) -> GuessOutcome:
    """Guess from ``scores`` with every count of ``guess_rule``, count the correct guesses against the
    secret bits ``membership`` (±1) and keep the count with the largest ε_L; each count's bound is at the
    rule's Bonferroni-corrected ``confidence``, so the maximum keeps ``confidence``."""
    m = int(scores.shape[0])
    counts = guess_rule.counts(m)
    corrects = correct_counts(scores, membership, counts, sides=guess_rule.sides)
    confidence = guess_rule.corrected_confidence(confidence)
    bounds = np.atleast_1d(epsilon_lower_bound(m, counts, corrects, delta=delta, confidence=confidence))
    rows = tuple((int(k), int(c), float(b)) for k, c, b in zip(counts, corrects, bounds))
    guesses, correct, lower_bound = max(rows, key=lambda row: row[2])
    return GuessOutcome(guesses, correct, lower_bound, rows)


@dataclass(frozen=True)
class CurveOutcome:
    """The curve test of one audit (:func:`dpverify.stats.curves.curve_test`) on every guess count:
    ``refuted`` the claimed curve, ``epsilon`` the ε at the claim's δ of the weakest refuted member of the
    claim's family (σ at fixed q, steps), ``claimed_epsilon`` the claimed curve's own ε at that δ,
    ``p_value`` the smallest tail bound (to compare with the per-count level), ``mu`` the refuted GDP μ at
    q = 1; ``decidable``: whether every guess correct would refute the claimed curve; ``runs``: how many
    independent runs it combined."""

    refuted: bool
    epsilon: float
    claimed_epsilon: float
    p_value: float
    mu: float | None
    decidable: bool
    runs: int


def curve_outcome(
    outcome: GuessOutcome,
    run: ClaimedRun,
    *,
    scores: np.ndarray,
    membership: np.ndarray,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    confidence: float,
    delta: float,
) -> CurveOutcome:
    """The curve test of ``run`` at ``confidence`` split over the guess grid: on ``outcome``'s counts for
    one run; for R pooled runs (``scores`` and ``membership`` run after run, ``run_sizes`` long), each run
    guesses on its own scores and :func:`~dpverify.stats.curves.combined_curve_test` combines them."""
    per_count = guess_rule.corrected_confidence(confidence)
    if len(run_sizes) == 1:
        guesses, correct = outcome.counts
        result = curve_test(run_sizes[0], guesses, correct, claim=run, delta=delta, confidence=per_count)
    else:
        guesses = guess_rule.run_counts(run_sizes)
        parts = np.split(np.arange(scores.shape[0]), np.cumsum(run_sizes)[:-1])
        correct = np.array([correct_counts(scores[i], membership[i], row, sides=guess_rule.sides) for i, row in zip(parts, guesses)])
        result = combined_curve_test(run_sizes, guesses, correct, claim=run, delta=delta, confidence=per_count)
    return CurveOutcome(
        result.refuted, result.epsilon, result.claimed_epsilon, result.p_value, result.mu, result.refutable, len(run_sizes)
    )


def decide_verdict(
    config: AuditSettings, lower_bound: float, claimed: float, m: int, *, delta: float, curve: CurveOutcome | None = None
) -> tuple[str, int | None]:
    """``(verdict, canaries needed)``: violation when ε_L exceeds the claim or the curve test refutes the
    claimed curve; undecided when neither test could ever refute it at this m (the claim at or above the
    ceiling ε_O at the claim's ``delta``, and the curve out of reach), with the m that would decide the
    (ε, δ) test; else pass. A NaN claim or ε_L is an :class:`AuditFailure`, never a verdict."""
    if math.isnan(claimed) or math.isnan(lower_bound):
        raise AuditFailure(f"cannot decide on claimed ε = {claimed} and ε_L = {lower_bound}")
    if lower_bound > claimed or (curve is not None and curve.refuted):
        return "violation", None
    if claimed >= audit_ceiling(config, m, delta=delta) and (curve is None or not curve.decidable):
        return "undecided", canaries_needed(config, claimed, delta=delta)
    return "pass", None


@dataclass(frozen=True)
class TestedRuns:
    """Both tests of an audit's pooled runs at one ``confidence`` (a look's share, :mod:`dpverify.stats.looks`):
    the (ε, δ) test's ``outcome``, the curve test's ``curve``, the ``verdict`` they give (with ``needed``
    canaries when undecided), the claim's mechanism ``run``, its δ and the runs' sizes."""

    outcome: GuessOutcome
    curve: CurveOutcome
    verdict: str
    needed: int | None
    confidence: float
    run: ClaimedRun
    delta: float
    run_sizes: tuple[int, ...]


def test_runs(
    config: AuditSettings,
    trained: ScoredRun,
    scores: np.ndarray,
    membership: np.ndarray,
    *,
    claimed: float,
    run_sizes: tuple[int, ...],
    confidence: float,
) -> TestedRuns:
    """Both tests of ``scores`` against ``membership`` at ``confidence`` (split evenly between them) and the
    verdict they give; ``claimed`` is :func:`claimed_epsilon` of ``trained`` (any run: pooled runs make one
    claim). Both tests use the δ the claim holds at (design rule 8)."""
    m = int(sum(run_sizes))
    delta = trained.claim.delta
    steinke_confidence, curve_confidence = split_confidence(confidence)
    outcome = guess_and_bound(scores, membership, guess_rule=config.guess_rule, confidence=steinke_confidence, delta=delta)
    run = claimed_run(trained.claim, config.relation)
    curve = curve_outcome(
        outcome,
        run,
        scores=scores,
        membership=membership,
        run_sizes=run_sizes,
        guess_rule=config.guess_rule,
        confidence=curve_confidence,
        delta=delta,
    )
    verdict, needed = decide_verdict(config, outcome.epsilon_lower_bound, claimed, m, delta=delta, curve=curve)
    return TestedRuns(outcome, curve, verdict, needed, confidence, run, delta, run_sizes)


def concluded_result(
    fields: dict[str, Any],
    config: AuditSettings,
    trained: ScoredRun,
    scores: np.ndarray,
    membership: np.ndarray,
    tested: TestedRuns,
    *,
    claim: tuple[float, str],
    clock: AuditClock,
    test_accuracy: float | None = None,
    not_designated: str | None = None,
) -> AuditResult:
    """The audit's result from its runs' ``tested`` verdict: the claim check and the power beside it; ``claim``
    is :func:`claimed_epsilon` of ``trained`` in the design's relation. A claim that contradicts its own
    numbers is a violation whatever the scores. ``not_designated``: why a run's black box is not the
    designated model (see :class:`ScoredRun`)."""
    m = int(sum(tested.run_sizes))
    claimed, derivation = claim
    outcome, curve, verdict, needed, delta = tested.outcome, tested.curve, tested.verdict, tested.needed, tested.delta
    failures: list[tuple[str, str]] = []
    # The claim check can only turn a verdict into a violation: should it fail, the tests' verdict stands.
    inconsistency = beside_verdict("claim check", lambda: claim_inconsistency(trained.claim), failures)
    # An every-update score is a likelihood ratio over the steps, not the participation sum k*'s model
    # simulates: its power is not stated rather than predicted from the wrong distribution.
    every_update = getattr(config, "observe", "final_model") == "every_update"
    verdict, power = power_beside_verdict(
        verdict,
        lambda: None if every_update else measure_power(
            tested.run,
            scores,
            membership,
            smallest_deficit=lambda fraction: one_run_deficit(
                tested.run,
                fraction=fraction,
                run_sizes=tested.run_sizes,
                guess_rule=config.guess_rule,
                claimed_epsilon=claimed,
                delta=delta,
                confidences=split_confidence(tested.confidence),
            ),
            expected_signal=expected_signal(config),
            not_designated=not_designated,
            deficit_stated=deficit_modelled(config),
        ),
        failures,
    )
    if inconsistency:
        verdict, needed, derivation = "violation", None, f"{derivation}. {inconsistency}"
    return AuditResult(
        **{**fields, "delta": delta, "m": m},
        claimed_epsilon=claimed,
        library_epsilon=trained.claim.epsilon,
        claim_derivation=derivation,
        claim_consistent=inconsistency is None,
        epsilon_lower_bound=outcome.epsilon_lower_bound,
        curve_epsilon_lower_bound=curve.epsilon,
        curve_claimed_epsilon=curve.claimed_epsilon,
        curve_refuted=curve.refuted,
        curve_p_value=curve.p_value,
        curve_mu=curve.mu,
        curve_runs=curve.runs,
        guesses=outcome.guesses,
        correct=outcome.correct,
        optimal_epsilon=audit_ceiling(config, m, delta=delta),
        canaries_needed=needed,
        verdict=verdict,
        device=trained.device,
        seconds=clock.seconds(),
        auditor_seconds=clock.auditor_seconds,
        scores=scores,
        membership=membership,
        bound_by_guesses=outcome.bound_by_guesses,
        test_accuracy=test_accuracy,
        power=power,
        auxiliary_failures=tuple(failures),
    )


def power_beside_verdict(
    verdict: str, measure: Callable[[], AuditPower | None], failures: list[tuple[str, str]]
) -> tuple[str, AuditPower | None]:
    """``(verdict, power)`` once the power ``measure`` gives is weighed (:func:`~dpverify.stats.power.judge`).
    Power is measured after the verdict is decided: a failure there is added to ``failures`` and leaves the
    verdict as it was, except a pass, which must state its power (design rule 13) and is ``undecided``."""
    before = len(failures)
    power = beside_verdict(POWER_STEP, measure, failures)
    if len(failures) > before:
        return ("undecided" if verdict == "pass" else verdict), None
    return judge(verdict, power)


#: The signal fraction Dirac canaries carry in the designated softmax regression in a correct implementation,
#: inclusion design at full batch: 0.96 to 1.0 in every bundled library (benchmarks/results/dirac.md), 0.97 to
#: 1.02 for reference-dpsgd at claimed ε 2 to 16; Dirac token canaries in the zero-initialised transformer
#: 0.97 to 1.06 in both Opacus modes (benchmarks/results/language-separation.md); the layer designs 0.89 to
#: 1.05 (medians over 5 seeds, Opacus ghost and hooks, TF-Privacy's fast clipping:
#: benchmarks/results/layer-designs.md, layer-designs-tf.md). A pass whose interval lies below half of it
#: could not see what the design promises.
DIRAC_SIGNAL_FLOOR = 0.5


def deficit_modelled(config: AuditSettings) -> bool:
    """Whether k* is stated for ``config``'s design: Dirac canaries in softmax regression, the inclusion
    design, where a canary's score is its participations times its clipped gradient plus the noise
    (:mod:`dpverify.stats.power`), checked against real noise deficits (benchmarks/results/kstar-validation.md)."""
    architecture = getattr(config, "architecture", None)
    return (
        getattr(config, "design", None) == "inclusion"
        and getattr(getattr(config, "canaries", None), "mode", None) == "dirac"
        and getattr(architecture, "hidden_width", None) == 0
    )


def expected_signal(config: AuditSettings) -> float | None:
    """The least signal fraction a correct implementation's scores carry in ``config``'s design, where it is
    measured: Dirac canaries in softmax regression, Dirac token canaries in the zero-initialised
    transformer or a layer design's owning canaries, the inclusion design, at full batch (where the claimed
    μ is exact) get :data:`DIRAC_SIGNAL_FLOOR`. Elsewhere ``None``: the pair design carries about 0.76 at the
    quick profile but 0.17 in a drawn configuration of reference-dpsgd, so no floor is known there."""
    canaries, architecture = getattr(config, "canaries", None), getattr(config, "architecture", None)
    hyperparameters = getattr(config, "hyperparameters", None)
    dirac = getattr(canaries, "mode", None) == "dirac" and (
        getattr(architecture, "hidden_width", None) == 0 or getattr(architecture, "init", None) == "dirac"
    )
    layer = getattr(architecture, "layer", None) is not None  # its canaries own the layer (config checks)
    if (
        getattr(config, "design", None) == "inclusion"
        and (dirac or layer)
        and getattr(hyperparameters, "sampling_rate", None) == 1.0
    ):
        return DIRAC_SIGNAL_FLOOR
    return None


#: Turns the trained black box into ``(scores, membership, test accuracy or None)``.
Scorer = Callable[[TrainedModel], "tuple[np.ndarray, np.ndarray, float | None]"]


@dataclass(frozen=True)
class ScoredRun:
    """One training run, trained and scored, as it leaves the process it ran in (the model stays there):
    the scorer's scores, secret bits and test accuracy, and the run's claim and device (what
    :func:`claimed_epsilon` and :func:`concluded_result` read). ``not_designated`` says how the black box
    showed that it is not the model the request designated (:func:`designated_model_defect`), or is ``None``."""

    scores: np.ndarray
    membership: np.ndarray
    test_accuracy: float | None
    claim: PrivacyClaim
    device: str
    not_designated: str | None = None


def designated_model_defect(trained: TrainedModel, request: Request) -> str | None:
    """Why ``trained`` is not the softmax regression ``request`` designates (``hidden_width=0``), from its
    black box alone, or ``None`` (also for any other model): a softmax regression's class differences of
    log-probabilities are affine in the input, exactly (:func:`dpverify.conformance.affinity_defect`);
    a trainer that builds its own model answers otherwise, and its Dirac canaries then carry a fraction of
    the signal the design promises."""
    if not isinstance(request, TrainingRequest) or not request.architecture.is_softmax_regression:
        return None
    from dpverify.conformance import affinity_defect

    def log_proba(probes: np.ndarray) -> np.ndarray:
        return query_black_box(trained, probes, expected_shape=(probes.shape[0], request.num_classes))

    defect, tolerance = affinity_defect(log_proba, request)
    if defect <= tolerance:
        return None
    return (
        f"the model is not the designated zero-initialised softmax regression: its responses are not affine in "
        f"the input (defect {defect:.3g}, float32 rounding allows {tolerance:.3g}); does the trainer build its own "
        "model instead of the requested architecture (hidden_width=0)?"
    )


def train_and_score(
    implementation: Implementation,
    request: Request,
    score: Scorer,
    *,
    timeout: float | None,
    clock: AuditClock,
    say: Progress,
    returns: type = TrainedModel,
) -> ScoredRun:
    """Train ``implementation`` on ``request`` within ``timeout`` seconds and ``score`` its black box (the
    auditor's time on ``clock``, the black box's answers excluded)."""
    trained = train_through_contract(implementation, request, returns=returns, timeout=timeout)
    say("querying the black box")
    scoring_started, answering = time.perf_counter(), clock.black_box_seconds
    scores, membership, accuracy = score(_TimedBlackBoxes(trained, clock))
    not_designated = designated_model_defect(trained, request)
    clock.auditor_seconds += time.perf_counter() - scoring_started - (clock.black_box_seconds - answering)
    return ScoredRun(scores, membership, accuracy, trained.claim, trained.device, not_designated)


def each_pooled_run(
    config: Any,
    one_run: Callable[..., tuple[Request, Scorer]],
    *,
    device: str,
    clock: AuditClock,
    step_progress: StepProgress | None,
    say: Progress,
) -> Iterator[tuple[Request, Scorer]]:
    """Each of ``config.pooled_runs`` runs' request and scorer from ``one_run(config, run, device=...,
    step_progress=...)``, made only when its turn comes: holding every run's canaries at once would cost R
    times one run's (10 GB for the classification gpu profile). With several runs, each is said ("training
    run 2 of 4") before it trains, so its steps read as its own; making them counts as the auditor's time."""
    for run in range(config.pooled_runs):
        started = time.perf_counter()
        prepared = one_run(config, run, device=device, step_progress=step_progress)
        clock.auditor_seconds += time.perf_counter() - started
        if config.pooled_runs > 1:
            say(f"training run {run + 1} of {config.pooled_runs}")
        yield prepared


def audit_through_contract(
    implementation: Implementation,
    config: AuditSettings,
    runs: Iterable[tuple[Request, Scorer]],
    *,
    m: int,
    clock: AuditClock,
    say: Progress,
    device: str,
    returns: type = TrainedModel,
) -> AuditResult:
    """:func:`train_and_score` each run's request, one after the other, and :func:`conclude_runs`;
    ``returns`` is the black-box type the request's contract promises."""

    def scored() -> Iterator[ScoredRun]:
        for request, score in runs:
            yield train_and_score(implementation, request, score, timeout=config.timeout, clock=clock, say=say, returns=returns)
        say("testing the claim")

    return conclude_runs(implementation, config, scored(), m=m, clock=clock, device=device)


def conclude_runs(
    implementation: Implementation, config: AuditSettings, scored: Iterable[ScoredRun], *, m: int, clock: AuditClock, device: str
) -> AuditResult:
    """Convert each scored run's claim to the design's relation and test the runs together at the looks of
    :data:`~dpverify.stats.looks.POOLED_LOOKS`: the first look that refutes the claim ends the audit (the
    runs not yet trained are not), else the last decides on all of them. Any :class:`AuditFailure` on the
    way (raised while ``scored`` is drawn too) ends as verdict ``error``. ``device`` is where training was
    asked to run.

    Pooling R independent runs is one audit of their R·m canaries: a canary changes only its own run, and
    the runs share nothing, so the joint output is exactly as private for that canary as its run (the
    claim's (ε, δ) and curve hold canary by canary, which is all both tests assume). The runs must make
    the same claim; one that differs is an error, not a choice of which to test. The looks' shares of the
    level add up to it (union bound), so stopping at a refutation keeps the audit's confidence."""
    fields = result_fields(implementation, config, m)
    schedule = pooled_looks(config)
    early_looks = dict(schedule[:-1])
    try:
        pooled: list[ScoredRun] = []
        for index, run in enumerate(scored):
            claim = claimed_epsilon(run, config.relation)
            if not pooled:
                first_claim = claim
            elif _claimed_numbers(run.claim) != _claimed_numbers(pooled[0].claim):  # the ε in the relation follows
                raise AuditFailure(
                    f"pooled run {index + 1} claimed {run.claim}, run 1 claimed {pooled[0].claim}; pooled runs of "
                    "one audit must make the same claim",
                    device=run.device,
                )
            pooled.append(run)
            if len(pooled) in early_looks:
                tested = _tested(config, pooled, first_claim, early_looks[len(pooled)])
                if tested.verdict == "violation":
                    getattr(scored, "close", lambda: None)()
                    return _pooled_result(fields, config, pooled, first_claim, tested, clock)
        tested = _tested(config, pooled, first_claim, schedule[-1][1])
        return _pooled_result(fields, config, pooled, first_claim, tested, clock)
    except AuditFailure as failure:
        return error_result(fields, config, failure, device=device, clock=clock)


def _tested(config: AuditSettings, pooled: list[ScoredRun], claim: tuple[float, str], confidence: float) -> TestedRuns:
    """:func:`test_runs` of the ``pooled`` runs so far at a look's ``confidence``."""
    return test_runs(
        config,
        pooled[0],
        np.concatenate([run.scores for run in pooled]),
        np.concatenate([run.membership for run in pooled]),
        claimed=claim[0],
        run_sizes=tuple(len(run.scores) for run in pooled),
        confidence=confidence,
    )


def _pooled_result(
    fields: dict[str, Any], config: AuditSettings, pooled: list[ScoredRun], claim: tuple[float, str], tested: TestedRuns, clock: AuditClock
) -> AuditResult:
    """:func:`concluded_result` of the ``pooled`` runs the look that decided ``tested`` saw."""
    return concluded_result(
        fields,
        config,
        pooled[0],
        np.concatenate([run.scores for run in pooled]),
        np.concatenate([run.membership for run in pooled]),
        tested,
        claim=claim,
        clock=clock,
        test_accuracy=pooled[0].test_accuracy if len(pooled) == 1 else None,
        not_designated=next((run.not_designated for run in pooled if run.not_designated), None),
    )


def until_failure(items: Iterable[Any]) -> tuple[list[Any], AuditFailure | None]:
    """The items up to the first :class:`AuditFailure`, and that failure (``None``: none): what a task of
    runs returns from a worker, so that the runs before a failure come back with it."""
    done: list[Any] = []
    try:
        for item in items:
            done.append(item)
    except AuditFailure as failure:
        return done, failure
    return done, None


def in_task_order(results: Generator[tuple[list[Any], AuditFailure | None], None, None]) -> Generator[Any, None, None]:
    """The items of :func:`until_failure` tasks in order, as ``results`` (an executor's map) gives them,
    raising a task's failure after the items before it; the tasks not reached are cancelled."""
    try:
        for items, failure in results:
            yield from items
            if failure is not None:
                raise failure
    finally:
        results.close()


def _claimed_numbers(claim: PrivacyClaim) -> tuple:
    return (claim.epsilon, claim.delta, claim.noise_multiplier, claim.sampling_rate, claim.steps, claim.relation)


def draw_membership(rng: np.random.Generator, m: int) -> np.ndarray:
    """m secret bits S_i, uniform over {−1, +1} (int8)."""
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=m)


def audit_streams(seed: int, *, run: int = 0) -> tuple[np.random.Generator, np.random.Generator, int]:
    """``(canary rng, membership rng, trainer's seed)``: independent streams spawned from one audit seed,
    so the same seed repeats the whole audit. Pooled run ``run`` ≥ 1 spawns from the seed's child
    ``2 + run``, a stream run 0's three children never touch."""
    root = np.random.SeedSequence(seed) if run == 0 else np.random.SeedSequence(seed, spawn_key=(2 + run,))
    canary_seq, membership_seq, training_seq = root.spawn(3)
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
