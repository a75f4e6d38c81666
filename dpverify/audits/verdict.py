"""The verdict of an audit's runs: both tests (the (ε, δ) test over the guess grid and the curve test) at each
look of the pooled runs (:func:`conclude_runs`, :data:`~dpverify.stats.looks.POOLED_LOOKS`), the verdict
they give (:func:`decide_verdict`), and the result with the claim check and the power measured beside it
(:func:`concluded_result`); :func:`audit_through_contract` trains, scores and concludes. A design
(:mod:`~dpverify.audits.classification`, :mod:`~dpverify.audits.data_dependent`,
:mod:`~dpverify.audits.language`) builds its requests and scorer and hands them here; nothing here knows a
design by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from dpverify.audits.claims import claimed_numbers, claim_inconsistency, claimed_epsilon, claimed_run
from dpverify.audits.planning import (
    AuditSettings,
    Progress,
    audit_ceiling,
    canaries_needed,
    pooled_looks,
)
from dpverify.audits.training import (
    AuditClock,
    AuditFailure,
    ClaimContradictsItself,
    NotRun,
    ScoredRun,
    Scorer,
    train_and_score,
)
from dpverify.config import OBSERVATIONS
from dpverify.contract import Implementation, Request, TrainedModel
from dpverify.results import POWER_STEP, AuditResult, audit_result, beside_verdict
from dpverify.stats.bounds import epsilon_lower_bound
from dpverify.stats.decision import AuditDecision, audit_decision
from dpverify.stats.power import AuditPower, judge, measure_power, one_run_catches, one_run_deficit
from dpverify.stats.update_power import every_update_catches
from dpverify.stats.scoring import GuessRule, correct_counts


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
    with the reason in ``not_run``, when the audit could not test the claim (:class:`NotRun`: the trainer did
    not hand over what the audit's adversary observes, or the claim cannot be tested in the design's relation);
    verdict ``violation`` when the claim, untestable there, contradicts its own numbers."""
    cause = f"{fields['implementation']}: {failure.cause}"
    if isinstance(failure, ClaimContradictsItself):  # refuted by its own numbers, not by the scores
        return audit_result(
            fields,
            verdict="violation",
            device=failure.device or device,
            seconds=clock.seconds(),
            optimal_epsilon=audit_ceiling(config, fields["m"]),
            auditor_seconds=clock.auditor_seconds,
            claim_derivation=failure.cause,
            claim_consistent=False,
        )
    missing = isinstance(failure, NotRun)
    return audit_result(
        fields,
        verdict="undecided" if missing else "error",
        device=failure.device or device,
        seconds=clock.seconds(),
        optimal_epsilon=audit_ceiling(config, fields["m"]),
        auditor_seconds=clock.auditor_seconds,
        error=None if missing else cause,
        not_run=cause if missing else None,
    )


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


def curve_outcome(outcome: GuessOutcome, decision: AuditDecision, *, scores: np.ndarray, membership: np.ndarray) -> CurveOutcome:
    """The curve test of ``decision`` as the audit reports it: on ``outcome``'s counts for one run; for R
    pooled runs (``scores`` and ``membership`` run after run), each run guesses on its own scores and the
    runs' tests are combined (:meth:`~dpverify.stats.decision.AuditDecision.curve_test`)."""
    _, correct = outcome.counts
    result = decision.curve_test(correct, _run_correct(decision, scores, membership)(np.arange(1))[:, 0])
    runs = len(decision.run_sizes)
    return CurveOutcome(result.refuted, result.epsilon, result.claimed_epsilon, result.p_value, result.mu, result.refutable, runs)


def _run_correct(decision: AuditDecision, scores: np.ndarray, membership: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Each run's correct guesses on its own scores, (R, 1, K) for the one audit ``scores`` holds (run after
    run), as :class:`~dpverify.stats.decision.AuditDecision` asks for them (only where it needs them)."""
    rule = decision.guess_rule

    def run_correct(rows: np.ndarray) -> np.ndarray:
        parts = np.split(np.arange(scores.shape[0]), np.cumsum(decision.run_sizes)[:-1])
        per_run = [correct_counts(scores[i], membership[i], row, sides=rule.sides) for i, row in zip(parts, decision.run_counts)]
        return np.array(per_run)[:, None, :]

    return run_correct


def decide_verdict(
    config: AuditSettings, lower_bound: float, claimed: float, *, delta: float, curve: CurveOutcome, decidable: bool
) -> tuple[str, int | None]:
    """``(verdict, canaries needed)``: violation when ε_L exceeds the claim or the curve test refutes the
    claimed curve; undecided when neither test could ever refute it at the audit's m with its share of the level
    (``decidable`` false: :class:`~dpverify.stats.decision.AuditDecision`), with the m that would decide
    the (ε, δ) test at the claim's ``delta``; else pass. A NaN claim or ε_L is an :class:`AuditFailure`,
    never a verdict."""
    if math.isnan(claimed) or math.isnan(lower_bound):
        raise AuditFailure(f"cannot decide on claimed ε = {claimed} and ε_L = {lower_bound}")
    if lower_bound > claimed or curve.refuted:
        return "violation", None
    if not decidable:
        return "undecided", canaries_needed(config, claimed, delta=delta)
    return "pass", None


@dataclass(frozen=True)
class LookOutcome:
    """Both tests of an audit's pooled runs at one look (:mod:`dpverify.stats.looks`): the runs' ``scores``
    and ``membership`` end to end, the (ε, δ) test's ``outcome``, the curve test's ``curve``, the
    ``verdict`` they give (with ``needed`` canaries when undecided) and the ``decision`` they were made by
    (the claim's mechanism, its δ, the runs' sizes, the look's confidence and each test's share of it)."""

    scores: np.ndarray
    membership: np.ndarray
    outcome: GuessOutcome
    curve: CurveOutcome
    verdict: str
    needed: int | None
    decision: AuditDecision


def tested_at_look(config: AuditSettings, pooled: list[ScoredRun], *, claimed: float, confidence: float) -> LookOutcome:
    """Both tests of the ``pooled`` runs so far at ``confidence``, shared by the level rule
    (:func:`~dpverify.stats.decision.audit_decision`), and the verdict they give; ``claimed`` is
    :func:`claimed_epsilon` of the runs' claim (pooled runs make one). Both tests use the δ the claim holds
    at (design rule 8)."""
    scores, membership, decision = _decision_at_look(config, pooled, claimed=claimed, confidence=confidence)
    outcome = guess_and_bound(
        scores, membership, guess_rule=config.guess_rule, confidence=decision.reported_confidences[0], delta=decision.delta
    )
    curve = curve_outcome(outcome, decision, scores=scores, membership=membership)
    verdict, needed = decide_verdict(
        config, outcome.epsilon_lower_bound, claimed, delta=decision.delta, curve=curve, decidable=decision.decidable
    )
    return LookOutcome(scores, membership, outcome, curve, verdict, needed, decision)


def refuted_at_look(config: AuditSettings, pooled: list[ScoredRun], *, claimed: float, confidence: float) -> bool:
    """Whether :func:`tested_at_look`'s verdict is a violation, decided by the same decision at the same
    levels (:meth:`~dpverify.stats.decision.AuditDecision.refutes`) without the curve test's search for
    the weakest refuted member: an early look that does not stop the audit needs no more."""
    scores, membership, decision = _decision_at_look(config, pooled, claimed=claimed, confidence=confidence)
    correct = correct_counts(scores, membership, decision.counts, sides=config.guess_rule.sides)
    return bool(decision.refutes(np.asarray(correct)[None, :], _run_correct(decision, scores, membership))[0])


def _decision_at_look(config: AuditSettings, pooled: list[ScoredRun], *, claimed: float, confidence: float):
    """The ``pooled`` runs' scores and membership end to end, and the :class:`AuditDecision` of the claim's
    mechanism in the design's relation at this look's ``confidence``."""
    scores = np.concatenate([run.scores for run in pooled])
    membership = np.concatenate([run.membership for run in pooled])
    claim = pooled[0].claim
    decision = audit_decision(
        claimed_run(claim, config.relation),
        run_sizes=tuple(len(run.scores) for run in pooled),
        guess_rule=config.guess_rule,
        claimed_epsilon=claimed,
        delta=claim.delta,
        confidence=confidence,
    )
    return scores, membership, decision


def concluded_result(
    fields: dict[str, Any],
    config: AuditSettings,
    pooled: list[ScoredRun],
    tested: LookOutcome,
    *,
    claim: tuple[float, str],
    clock: AuditClock,
) -> AuditResult:
    """The audit's result from the verdict ``tested`` gave on the ``pooled`` runs its look saw: the claim
    check and the power beside it; ``claim`` is :func:`claimed_epsilon` of the runs' claim in the design's
    relation. A claim that contradicts its own numbers is a violation whatever the scores. A run whose black
    box is not the designated model (see :class:`ScoredRun`) is passed to the power's judgement."""
    trained = pooled[0]
    not_designated = next((run.not_designated for run in pooled if run.not_designated), None)
    scores, membership = tested.scores, tested.membership
    decision = tested.decision
    m, delta = int(sum(decision.run_sizes)), decision.delta
    claimed, derivation = claim
    outcome, curve, verdict, needed = tested.outcome, tested.curve, tested.verdict, tested.needed
    failures: list[tuple[str, str]] = []
    # The claim check can only turn a verdict into a violation: should it fail, the tests' verdict stands.
    inconsistency = beside_verdict("claim check", lambda: claim_inconsistency(trained.claim), failures)
    simulated = dict(
        run_sizes=decision.run_sizes,
        guess_rule=config.guess_rule,
        claimed_epsilon=claimed,
        delta=delta,
        confidence=decision.confidence,
    )
    verdict, power = power_beside_verdict(
        verdict,
        lambda: measure_power(
            decision.run,
            scores,
            membership,
            **_deficit_question(config, tested, simulated),
            expected_signal=expected_signal(config),
            not_designated=not_designated,
            refuted=verdict == "violation",
        ),
        failures,
    )
    if inconsistency:
        verdict, needed, derivation = "violation", None, f"{derivation}. {inconsistency}"
    return audit_result(
        fields,
        verdict=verdict,
        device=trained.device,
        seconds=clock.seconds(),
        delta=delta,
        m=m,
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
        auditor_seconds=clock.auditor_seconds,
        scores=scores,
        membership=membership,
        bound_by_guesses=outcome.bound_by_guesses,
        test_accuracy=trained.test_accuracy if len(pooled) == 1 else None,
        power=power,
        auxiliary_failures=tuple(failures),
    )


def _deficit_question(config: AuditSettings, tested: LookOutcome, simulated: dict[str, Any]) -> dict[str, Callable[[float], Any]]:
    """What :func:`~dpverify.stats.power.measure_power` asks of a noise deficit: k* where its model is
    validated (:func:`deficit_modelled`); elsewhere only whether a LARGEST_DEFICIT-fold deficit is caught, by
    the one-run model or, for an every-update audit, by its own simulated audits
    (:func:`~dpverify.stats.update_power.every_update_catches`, which measure_power asks at ρ's capped lower
    limit first: caught there, it is caught at ρ too, and one simulation answers both questions)."""
    decision = tested.decision
    run = decision.run
    if deficit_modelled(config):
        return {"smallest_deficit": lambda fraction: one_run_deficit(run, fraction=fraction, **simulated)}
    if getattr(config, "observe", "final_model") != "every_update":
        return {"catches_largest": lambda fraction: one_run_catches(run, fraction=fraction, **simulated)}
    catches = every_update_catches(
        run, run_sizes=decision.run_sizes, guess_rule=config.guess_rule, delta=decision.delta, confidence=decision.confidence
    )
    return {"catches_largest": catches}


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
    (:mod:`dpverify.stats.power`), checked against real noise deficits (benchmarks/results/kstar-validation.md).
    Not for the every-update audit: its score is a likelihood ratio over the steps, not that sum, and no k*
    has been checked against its real deficits, so k* is "not stated" (:mod:`dpverify.stats.update_power`
    says whether it would catch a LARGEST_DEFICIT-fold deficit)."""
    architecture = getattr(config, "architecture", None)
    return (
        getattr(config, "observe", "final_model") == "final_model"
        and getattr(config, "design", None) == "inclusion"
        and getattr(getattr(config, "canaries", None), "mode", None) == "dirac"
        and getattr(architecture, "hidden_width", None) == 0
    )


def expected_signal(config: AuditSettings) -> float | None:
    """The least signal fraction a correct implementation's scores carry in ``config``'s design, where it is
    measured: Dirac canaries in softmax regression, Dirac token canaries in the zero-initialised
    transformer or a layer design's owning canaries, the inclusion design, at full batch (where the claimed
    μ is exact) get :data:`DIRAC_SIGNAL_FLOOR`, and so does the every-update audit at any q: its score is the
    claim's own likelihood ratio, which separates by 0.975–1.005 of the claimed μ in simulation of the claimed
    mechanism and by 0.97–0.98 in reference-dpsgd, opacus-ghost and tf-privacy-keras at the gate's setting
    (benchmarks/results/every-update-power.md). Elsewhere ``None``: the pair design carries about 0.76 at the
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
        and (getattr(hyperparameters, "sampling_rate", None) == 1.0 or getattr(config, "observe", None) == "every_update")
    ):
        return DIRAC_SIGNAL_FLOOR
    return None


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
            elif claimed_numbers(run.claim) != claimed_numbers(pooled[0].claim):  # the ε in the relation follows
                raise AuditFailure(
                    f"pooled run {index + 1} claimed {run.claim}, run 1 claimed {pooled[0].claim}; pooled runs of "
                    "one audit must make the same claim",
                    device=run.device,
                )
            pooled.append(run)
            look = early_looks.get(len(pooled))
            if look is not None and refuted_at_look(config, pooled, claimed=first_claim[0], confidence=look):
                getattr(scored, "close", lambda: None)()
                tested = tested_at_look(config, pooled, claimed=first_claim[0], confidence=look)
                return concluded_result(fields, config, pooled, tested, claim=first_claim, clock=clock)
        tested = tested_at_look(config, pooled, claimed=first_claim[0], confidence=schedule[-1][1])
        return concluded_result(fields, config, pooled, tested, claim=first_claim, clock=clock)
    except AuditFailure as failure:
        return error_result(fields, config, failure, device=device, clock=clock)
