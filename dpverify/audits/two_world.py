"""The two-world (many-run) audit: train R times on D and R times on D′, score each black box, bound ε.

Unlike the one-run designs, which plant many canaries in one training run, this audit repeats training
(Jagielski et al. 2020; Nasr et al. 2021, 2023) on two crafted neighbouring datasets
(:mod:`dpverify.canaries.worlds`) and tests the scores with :func:`dpverify.stats.two_world.two_world_bound`.
It needs many runs, so it suits small models; in exchange it sees what one run cannot: a mechanism that
reveals the dataset's size (Opacus #571), or the whole trade-off curve near its tightest point.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpverify._validation import check_int, check_probability
from dpverify.audits.claims import claimed_epsilon, claimed_numbers, claimed_run
from dpverify.audits.planning import (
    DesignatedClaim,
    Progress,
    Undecidable,
    designated_claim,
    resolve_device,
    target_claim,
)
from dpverify.audits.training import (
    AuditFailure,
    NotRun,
    designated_model_defect,
    in_task_order,
    query_black_box,
    train_through_contract,
    until_failure,
)
from dpverify.audits.verdict import power_beside_verdict, result_fields
from dpverify.canaries.worlds import RECORD_SCORES, TwoWorlds
from dpverify.config import AuditConfig
from dpverify.contract import DPHyperparameters, Implementation, MLPArchitecture, PrivacyClaim, TrainingRequest
from dpverify.execution import Executor, InProcessExecutor, Parcel, chunks
from dpverify.results import AuditResult, audit_result
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.looks import look_schedule as stats_look_schedule
from dpverify.stats.power import AuditPower, gdp_mu, measure_power, two_world_deficit
from dpverify.stats.two_world import (
    TradeOffCurve,
    TwoWorldBound,
    MAX_RUNS,
    curve_refutable,
    gdp_curve,
    runs_needed,
    two_world_bound,
    two_world_ceiling,
)

__all__ = [
    "LOOKS",
    "TwoWorldResult",
    "claimed_curve",
    "look_schedule",
    "refuting_bound",
    "full_batch_gdp_curve",
    "full_batch_gdp_mu",
    "run_two_world_audit",
    "run_two_world_design",
    "runs_undecidable",
]

#: Maps a claim and the world's relation to the trade-off curve β(α) the claim asserts, or ``None``.
CurveForClaim = Callable[[PrivacyClaim, str], "TradeOffCurve | None"]


def full_batch_gdp_mu(claim: PrivacyClaim, relation: str) -> float | None:
    """The exact GDP μ a full-batch claim asserts: √steps/σ (add/remove; sensitivity C against noise σC),
    2√steps/σ (replace-one: sensitivity 2C); ``None`` when q < 1 or σ = 0 (no GDP curve; design rule 9)."""
    mu = claimed_run(claim, relation).mu
    return None if mu is None or math.isinf(mu) else mu


def full_batch_gdp_curve(claim: PrivacyClaim, relation: str) -> TradeOffCurve | None:
    """The μ-GDP curve of :func:`full_batch_gdp_mu`, or ``None``: the default curve a claim asserts of its
    final model. A claim stated as a DP-SGD event at full batch asserts its event's curve (dp_accounting's
    PLD, the same μ-GDP curve up to its discretisation)."""
    if claim.dp_event is not None:
        run = claimed_run(claim, relation)
        try:
            full_batch = run.sampling_rate == 1
        except ValueError:  # not DP-SGD: no default curve, as for q < 1
            return None
        return run.curve() if full_batch else None
    mu = full_batch_gdp_mu(claim, relation)
    return None if mu is None else gdp_curve(mu)


def claimed_curve(claim: PrivacyClaim, relation: str) -> TradeOffCurve:
    """The whole trade-off curve the claim's (σ, q, T) asserts, at any q (exact GDP at q = 1, the PLD
    envelope below it; :meth:`~dpverify.stats.curves.ClaimedRun.curve`): what an every-update world tests,
    since the accountant's ε composes exactly the T releases that adversary sees."""
    return claimed_run(claim, relation).curve()


#: The looks of a two-world audit: after each fraction of its runs per world, the tests at that share of
#: the audit's level 1 − confidence. The shares add up to 1, so by the union bound a correct implementation
#: is refuted at some look with probability at most the level, however the looks stop it (optional
#: stopping costs nothing); an obvious violation stops after a quarter of the runs, a pass runs them all
#: at three quarters of the level.
LOOKS: tuple[tuple[float, float], ...] = ((0.25, 0.125), (0.5, 0.125), (1.0, 0.75))
#: Fewest runs per world a look counts on (the split test holds out half of them).
MIN_LOOK_RUNS = 20


def look_schedule(runs: int, confidence: float) -> list[tuple[int, float]]:
    """``[(runs per world, confidence), ...]`` of :data:`LOOKS` for an audit of ``runs`` per world: a look
    under :data:`MIN_LOOK_RUNS` runs (or at the runs of the one after) gives its share to the next."""
    return stats_look_schedule(runs, confidence, looks=LOOKS, min_runs=MIN_LOOK_RUNS)


def _pointwise_lowest(curves: list[TradeOffCurve | None]) -> TradeOffCurve | None:
    """The pointwise lowest of the claims' curves (each claim asserts the pair), ``None`` if one has none."""
    if not curves or any(c is None for c in curves):
        return None
    return curves[0] if len(curves) == 1 else (lambda alpha: np.min([c(alpha) for c in curves], axis=0))


def refuting_bound(
    scores_d, scores_dprime, *, claimed_epsilon: float, curve: TradeOffCurve | None, delta: float, confidence: float
) -> TwoWorldBound | None:
    """Both tests of one look at ``confidence``: their bound when either refutes the claim, else ``None``."""
    bound = two_world_bound(scores_d, scores_dprime, delta=delta, confidence=confidence, claimed_curve=curve)
    return bound if bound.epsilon_lower_bound > claimed_epsilon or bound.refutes else None


def _early_refutation(
    scores: dict[str, list[float]], claims: dict[str, set], curves: list, *, delta: float, confidence: float
) -> TwoWorldBound | None:
    """:func:`refuting_bound` at a look before the last, on the runs so far and their claims."""
    claimed = max(max(claims["d"]), max(claims["dprime"]))
    return refuting_bound(
        scores["d"], scores["dprime"], claimed_epsilon=claimed, curve=_pointwise_lowest(curves), delta=delta,
        confidence=confidence,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True, eq=False)
class TwoWorldResult:
    """The outcome of one two-world audit.

    ``claimed_epsilon`` is the larger of the claims made in D and in D′ (``claimed_epsilon_d``,
    ``claimed_epsilon_dprime``; an implementation whose accountant reads the dataset may claim different ε
    in the two worlds, and each claim asserts the pair), in the world's ``relation``. ``claimed_mu`` is the
    GDP μ full-batch claims assert (the larger of the two; ``None`` for q < 1), for the report. Verdict:
    ``violation`` when the (ε, δ) test's ε_L exceeds ``claimed_epsilon`` or the curve test refutes the
    claimed curve (the pointwise lower of the two worlds'; the two tests share ``confidence``, spent over
    the looks of :func:`look_schedule`, the first that refutes ending the audit: ``scores_d`` then hold
    the runs it took); ``undecided`` when the runs' ceilings could not refute the claim however the
    scores fell (``runs_needed`` per world would), or when the world's adversary sees every update and
    the trainer handed over none (``not_run`` says so); ``error`` when a run failed; else ``pass``.
    ``observed`` is what the world's adversary saw: ``"final model"`` or ``"every update"``.
    ``auxiliary_failures``: what failed beside the verdict (the power), as in
    :class:`~dpverify.results.AuditResult`.
    """

    implementation: str
    world: str
    relation: str
    runs: int
    seed: int
    device: str
    confidence: float
    delta: float
    claimed_epsilon: float
    claimed_epsilon_d: float
    claimed_epsilon_dprime: float
    claim_derivation: str
    claimed_mu: float | None
    epsilon_ceiling: float
    mu_ceiling: float
    runs_needed: int | None
    bound: TwoWorldBound | None
    verdict: str
    seconds: float
    scores_d: tuple[float, ...] = ()
    scores_dprime: tuple[float, ...] = ()
    error: str | None = None
    power: AuditPower | None = None
    observed: str = "final model"
    not_run: str | None = None
    auxiliary_failures: tuple[tuple[str, str], ...] = ()

    @property
    def epsilon_lower_bound(self) -> float:
        return self.bound.epsilon_lower_bound if self.bound is not None else 0.0

    @property
    def seconds_per_run(self) -> float:
        done = len(self.scores_d) + len(self.scores_dprime)
        return self.seconds / done if done else math.nan


#: The two worlds in the order runs alternate: run i trains D as flat run 2i and D′ as 2i + 1.
WORLDS = ("d", "dprime")


@dataclass(frozen=True)
class _SharedByRuns:
    """What every run of one audit shares, sent once with each task; ``seeds`` are the flat runs' seeds."""

    implementation: Parcel
    world: TwoWorlds
    architecture: MLPArchitecture
    hyperparameters: DPHyperparameters
    device: str
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class RunOutcome:
    """One run, as a task returns it: the world's score of its black box (or its candidate scores, an
    array), its claim and where it trained (what :func:`~dpverify.audits.claims.claimed_epsilon` reads; the
    trained model itself stays behind)."""

    score: float | np.ndarray
    claim: PrivacyClaim
    device: str
    not_designated: str | None = None


def _train_runs(task: tuple[_SharedByRuns, range]) -> tuple[list[RunOutcome], AuditFailure | None]:
    """The flat runs ``indices`` trained, queried and scored in order, up to the first failure."""
    shared, indices = task
    implementation = shared.implementation.open()
    return until_failure(_train_run(implementation, shared, index) for index in indices)


class UpdatesNotHandedOver(AuditFailure):
    """A run of an every-update world whose trainer handed over no parameters
    (:attr:`~dpverify.contract.Request.observe_update`): the audit did not run, which is not a pass."""


def _train_run(implementation: Implementation, shared: _SharedByRuns, index: int) -> RunOutcome:
    world = shared.world
    features, labels = world.dataset(WORLDS[index % 2])
    handed_over: list[tuple[np.ndarray, ...]] = []
    request = TrainingRequest(
        features=features,
        labels=labels,
        num_classes=world.num_classes,
        architecture=shared.architecture,
        hyperparameters=shared.hyperparameters,
        seed=shared.seeds[index],
        device=shared.device,
        observe_update=(lambda step, parameters: handed_over.append(parameters)) if world.observes_updates else None,
    )
    trained = train_through_contract(implementation, request)
    if not world.observes_updates:
        log_probs = query_black_box(trained, world.probes, expected_shape=(len(world.probes), world.num_classes))
        # A world that scores the record reads it through the designated model: checked as the one-run audit does.
        not_designated = designated_model_defect(trained, request) if world.score in RECORD_SCORES else None
        return RunOutcome(
            score=world.score_log_probs(log_probs), claim=trained.claim, device=trained.device, not_designated=not_designated
        )
    if not handed_over:
        raise UpdatesNotHandedOver(
            f"it hands over no updates (Request.observe_update), so the {world.name} world, whose adversary sees "
            "every released update, did not run"
        )
    try:
        score = world.score_updates(handed_over, shared.hyperparameters)
    except ValueError as exc:
        raise AuditFailure(f"its handed-over updates: {exc}", device=trained.device) from exc
    return RunOutcome(score=score, claim=trained.claim, device=trained.device)


def run_two_world_audit(
    implementation: Implementation,
    *,
    world: TwoWorlds,
    runs: int,
    hyperparameters: DPHyperparameters,
    architecture: MLPArchitecture = MLPArchitecture(hidden_width=16),
    confidence: float = 0.95,
    seed: int = 0,
    device: str = "cpu",
    curve_for_claim: CurveForClaim | None = full_batch_gdp_curve,
    progress: Progress | None = None,
    executor: Executor | None = None,
) -> TwoWorldResult:
    """Train ``implementation`` ``runs`` times on each of ``world``'s datasets through the contract, score
    each black box with the world's score and decide the verdict; never raises for a failing implementation.

    Runs alternate D, D′ so that drift in the machine affects both worlds alike; the trainer's seeds come
    from one :class:`numpy.random.SeedSequence` of ``seed``, fresh for every run. ``executor``
    (:mod:`dpverify.execution`; default in-process) trains them in chunks, here or in worker processes,
    with the same scores by seed; an implementation that cannot reach its workers raises
    :class:`~dpverify.execution.UnportableObject` before training. The ceilings are computed
    before training; a target ε at or above the (ε, δ) ceiling ends the audit as ``undecided`` without
    training when no curve test can apply. ``curve_for_claim`` gives the trade-off curve a claim asserts
    (the default only for full batches, where GDP is exact; ``None``: no curve test); plug in another to
    test a curve for q < 1.

    Both tests hold at the δ the runs' claims state (the largest, should they differ), as the one-run
    audits do; the requested δ only sizes the audit before training. A world whose score reads the record
    (:data:`~dpverify.canaries.worlds.RECORD_SCORES`) checks each black box is the designated model
    (:func:`~dpverify.audits.training.designated_model_defect`); one that is not cannot pass (its power is
    blind, so the verdict is ``undecided``).

    The audit designates the public normaliser: unless ``hyperparameters`` carries an
    ``expected_batch_size``, every run in both worlds is asked to divide by q·|D|, so that a correct
    implementation's noise does not depend on which world it trains on; one that reads N anyway (Opacus
    called as its tutorials do) shows it.
    """
    runs = check_int("runs", runs, low=2)
    if hyperparameters.expected_batch_size is None:
        public = hyperparameters.sampling_rate * (world.public_size or world.labels_d.size)
        hyperparameters = dataclasses.replace(hyperparameters, expected_batch_size=public)
    check_probability("confidence", confidence)
    if world.observes_updates and curve_for_claim is full_batch_gdp_curve:
        curve_for_claim = claimed_curve
    delta = hyperparameters.delta
    say = progress or (lambda message: None)
    started = time.perf_counter()
    device = resolve_device(device)
    looks = look_schedule(runs, confidence)
    final_confidence = looks[-1][1]
    eps_ceiling, mu_ceiling = two_world_ceiling(runs, delta=delta, confidence=final_confidence)
    common = dict(
        implementation=implementation.info.name,
        world=world.name,
        relation=world.relation,
        runs=runs,
        seed=seed,
        device=device,
        confidence=confidence,
        delta=delta,
        epsilon_ceiling=eps_ceiling,
        mu_ceiling=mu_ceiling,
        observed=world.observed,
    )
    say(f"{runs} runs per world can refute at most ε = {eps_ceiling:.3f} (or GDP μ = {mu_ceiling:.3f})")
    target = hyperparameters.target_epsilon
    subsampled = hyperparameters.sampling_rate < 1
    no_curve = curve_for_claim is None or (curve_for_claim is full_batch_gdp_curve and subsampled)
    refusal = None
    if target is not None:
        refusal = runs_undecidable(
            target_claim(target), runs=runs, delta=delta, confidence=final_confidence, curve_test=not no_curve
        )
    if refusal is not None:
        return TwoWorldResult(
            **common,
            claimed_epsilon=target,
            claimed_epsilon_d=target,
            claimed_epsilon_dprime=target,
            claim_derivation="the requested target ε (not trained)",
            claimed_mu=None,
            runs_needed=refusal.needed,
            bound=None,
            verdict="undecided",
            seconds=time.perf_counter() - started,
        )

    seeds = np.random.SeedSequence(seed).generate_state(2 * runs, dtype=np.uint32) % 2**31
    executor = executor or InProcessExecutor()
    shared = _SharedByRuns(
        implementation=executor.parcel(implementation, what=f"implementation {implementation.info.name!r}"),
        world=world,
        architecture=architecture,
        hyperparameters=hyperparameters,
        device=device,
        seeds=tuple(int(s) for s in seeds),
    )
    tasks = [(shared, indices) for indices in chunks(2 * runs, parallelism=executor.parallelism)]
    outcomes = in_task_order(executor.map(_train_runs, tasks, gpu=device == "cuda"))
    scores: dict[str, list[float]] = {"d": [], "dprime": []}
    claims: dict[str, set] = {"d": set(), "dprime": set()}
    curves: list[TradeOffCurve | None] = []
    mus: list[float | None] = []
    converted: dict[tuple, tuple[float, str]] = {}
    runs_claimed: list[ClaimedRun] = []
    stopped: TwoWorldBound | None = None  # the bound of the look that refuted the claim before the last
    claimed_deltas: set[float] = set()
    not_designated: str | None = None
    try:
        for index, outcome in enumerate(outcomes):
            which = WORLDS[index % 2]
            scores[which].append(outcome.score)
            claim = outcome.claim
            claimed_deltas.add(claim.delta)
            not_designated = not_designated or outcome.not_designated
            key = claimed_numbers(claim)
            if key not in converted:  # converting a claim may run an accountant: once per distinct claim
                converted[key] = claimed_epsilon(outcome, world.relation)
                curves.append(curve_for_claim(claim, world.relation) if curve_for_claim else None)
                mus.append(full_batch_gdp_mu(claim, world.relation))
                runs_claimed.append(claimed_run(claim, world.relation))
            claims[which].add(converted[key][0])
            if (index + 1) % (2 * max(1, runs // 10)) == 0:
                say(f"{(index + 1) // 2} of {runs} runs per world")
            look = next((c for r, c in looks[:-1] if 2 * r == index + 1), None)
            if look is not None:
                stopped = _early_refutation(scores, claims, curves, delta=max(claimed_deltas), confidence=look)
                if stopped is not None:
                    say(f"refuted at the look after {(index + 1) // 2} runs per world: stopping")
                    break
        for which in ("d", "dprime"):
            if len(claims[which]) != 1:
                raise AuditFailure(
                    f"it claimed different ε in runs on the same dataset ({which}): {sorted(claims[which])}"
                )
    except AuditFailure as failure:
        cause = f"{implementation.info.name}: {failure.cause}"
        # Nothing to judge (no updates handed over, a claim the world cannot test): not run, never a pass.
        not_run = isinstance(failure, (UpdatesNotHandedOver, NotRun))
        return TwoWorldResult(
            **common,
            claimed_epsilon=math.nan,
            claimed_epsilon_d=math.nan,
            claimed_epsilon_dprime=math.nan,
            claim_derivation="",
            claimed_mu=None,
            runs_needed=None,
            bound=None,
            verdict="undecided" if not_run else "error",
            seconds=time.perf_counter() - started,
            scores_d=tuple(scores["d"]),
            scores_dprime=tuple(scores["dprime"]),
            error=None if not_run else cause,
            not_run=cause if not_run else None,
        )
    finally:
        outcomes.close()  # after a failure, the runs not started are not trained

    # Both tests hold at the δ the claims are stated at (design rule 8), not the δ requested: a claim at the
    # larger of the runs' δ is implied by each of them, so testing it refutes no true claim.
    delta = max(claimed_deltas)
    eps_ceiling, mu_ceiling = two_world_ceiling(runs, delta=delta, confidence=final_confidence)
    common.update(delta=delta, epsilon_ceiling=eps_ceiling, mu_ceiling=mu_ceiling)
    eps_d, eps_dprime = claims["d"].pop(), claims["dprime"].pop()
    claimed = max(eps_d, eps_dprime)
    claimed_mu = None if any(mu is None for mu in mus) else max(mus)
    curve = _pointwise_lowest(curves)

    def tested(d, dprime) -> tuple[TwoWorldBound, bool]:
        """Both tests of one pair of score samples at the last look's level, and whether either refutes the
        claim: the audit's verdict on its runs, and on the runs :func:`two_world_deficit` simulates."""
        bound = two_world_bound(d, dprime, delta=delta, confidence=final_confidence, claimed_curve=curve)
        return bound, bound.epsilon_lower_bound > claimed or bound.refutes

    bound, violated = (stopped, True) if stopped is not None else tested(scores["d"], scores["dprime"])
    cannot = claimed >= eps_ceiling and (curve is None or not curve_refutable(curve, runs, confidence=final_confidence))
    verdict = "violation" if violated else "undecided" if cannot else "pass"
    failures: list[tuple[str, str]] = []

    def measure() -> AuditPower | None:
        if stopped is not None or world.score not in RECORD_SCORES:
            return None
        weakest = max(runs_claimed, key=gdp_mu)  # the claim the worlds' pair asserts least of
        return measure_power(
            weakest,
            np.array(scores["d"] + scores["dprime"]),
            np.repeat([-1, 1], [len(scores["d"]), len(scores["dprime"])]),
            smallest_deficit=lambda fraction: two_world_deficit(
                weakest, fraction=fraction, runs=runs, refutes=lambda d, dprime: tested(d, dprime)[1], seed=seed
            ),
            either_direction=True,
            not_designated=not_designated,
            refuted=verdict == "violation",
        )

    verdict, power = power_beside_verdict(verdict, measure, failures)
    return TwoWorldResult(
        **common,
        claimed_epsilon=claimed,
        claimed_epsilon_d=eps_d,
        claimed_epsilon_dprime=eps_dprime,
        claim_derivation=next(iter(converted.values()))[1],
        claimed_mu=claimed_mu,
        runs_needed=runs_needed(claimed, delta=delta, confidence=final_confidence, mu=claimed_mu) if cannot else None,
        bound=bound,
        verdict=verdict,
        seconds=time.perf_counter() - started,
        scores_d=_counted_statistic(scores["d"], bound),
        scores_dprime=_counted_statistic(scores["dprime"], bound),
        power=power,
        auxiliary_failures=tuple(failures),
    )


def _counted_statistic(scores: list, bound: TwoWorldBound) -> tuple[float, ...]:
    """The runs' scores of the statistic the (ε, δ) test counted on (a world with candidate statistics
    gives each run an array of them)."""
    return tuple(float(np.atleast_1d(score)[bound.statistic]) for score in scores)


def runs_undecidable(
    claim: DesignatedClaim, *, runs: int, delta: float, confidence: float, curve_test: bool = True
) -> Undecidable | None:
    """Why ``runs`` runs per world could only leave ``claim`` undecided, before training, or ``None``: its ε
    at or above the runs' (ε, δ) ceiling, and no curve test (``curve_test`` false: none applies) or one that
    cannot refute the claim's GDP curve (any curve when its μ is unknown) even at perfect separation."""
    eps_ceiling, _ = two_world_ceiling(runs, delta=delta, confidence=confidence)
    curve = gdp_curve(claim.mu or 0.0) if curve_test else None
    if claim.epsilon < eps_ceiling or (curve is not None and curve_refutable(curve, runs, confidence=confidence)):
        return None
    return Undecidable(
        setting="runs",
        value=runs,
        needed=runs_needed(claim.expected, delta=delta, confidence=confidence, mu=claim.mu),
        limit=MAX_RUNS,
        reason=f"{runs} runs per world can refute at most ε = {eps_ceiling:.3f} (confidence {confidence:.4g}), not above "
        f"{claim.what}, and too few to refute the claimed mechanism's trade-off curve",
    )


def two_world_undecidable(config: AuditConfig) -> Undecidable | None:
    """:func:`runs_undecidable` of the two-world audit ``config`` designates (its runs, target or σ, level),
    with the default curve test of full-batch claims."""
    claim = designated_claim(config)
    if claim is None:
        return None
    hp = config.hyperparameters
    return runs_undecidable(
        claim, runs=config.worlds.runs, delta=hp.delta, confidence=config.confidence, curve_test=hp.sampling_rate == 1
    )


def run_two_world_design(
    implementation: Implementation, config: AuditConfig, *, progress: Progress | None = None, executor: Executor | None = None
) -> AuditResult:
    """The two-world audit as ``design="two_world"`` of an :class:`AuditConfig` runs it (the plugin, the
    CLI), with the config's world, runs, model, training, level, seed and device, reported as an
    :class:`AuditResult`.

    In the result ``m`` is the runs per world, ``guesses`` the held-out runs the (ε, δ) test counted and
    ``correct`` those its threshold placed in the right world; ``optimal_epsilon`` is the runs' ceiling and
    ``canaries_needed`` the runs per world that could decide. The curve test is the GDP one of full-batch
    claims: ``curve_epsilon_lower_bound`` is its μ_L's ε at δ, ``curve_mu`` μ_L. ``scores`` hold the D runs'
    then the D′ runs' scores, with ``membership`` −1 and +1.
    """
    outcome = run_two_world_audit(
        implementation,
        world=config.worlds.worlds(),
        runs=config.worlds.runs,
        hyperparameters=config.hyperparameters,
        architecture=config.architecture,
        confidence=config.confidence,
        seed=config.seed,
        device=config.device,
        progress=progress,
        executor=executor,
    )
    bound = outcome.bound
    counted = 0 if bound is None else bound.negatives + bound.positives
    wrong = 0 if bound is None else bound.false_positives + bound.false_negatives
    scores = np.array(outcome.scores_d + outcome.scores_dprime, dtype=np.float64)
    membership = np.repeat(np.array([-1, 1], dtype=np.int8), [len(outcome.scores_d), len(outcome.scores_dprime)])
    shared = result_fields(implementation, config, len(outcome.scores_d) or outcome.runs)
    return audit_result(
        shared,
        verdict=outcome.verdict,
        device=outcome.device,
        seconds=outcome.seconds,
        relation=outcome.relation,
        delta=outcome.delta,
        observed=outcome.observed,
        claimed_epsilon=outcome.claimed_epsilon,
        library_epsilon=outcome.claimed_epsilon_d,
        claim_derivation=f"{outcome.claim_derivation}; world {outcome.world}, claims in D {outcome.claimed_epsilon_d:.4g} "
        f"and D′ {outcome.claimed_epsilon_dprime:.4g}",
        epsilon_lower_bound=math.nan if bound is None else bound.epsilon_lower_bound,
        estimator="two-world Clopper–Pearson",
        curve_epsilon_lower_bound=None if bound is None else bound.gdp_epsilon_lower_bound,
        curve_refuted=bool(bound is not None and bound.refutes),
        curve_mu=None if bound is None else bound.gdp_mu_lower_bound,
        threshold=None if bound is None else bound.threshold,
        guesses=counted,
        correct=counted - wrong,
        optimal_epsilon=outcome.epsilon_ceiling,
        canaries_needed=outcome.runs_needed,
        error=outcome.error,
        scores=scores,
        membership=membership,
        power=outcome.power,
        not_run=outcome.not_run,
        auxiliary_failures=outcome.auxiliary_failures,
    )

