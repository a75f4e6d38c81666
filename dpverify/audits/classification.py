"""The data-independent classification audit (UniAud, Algorithms 1 and 2): synthetic canaries, one
training run of the designated model (or several independent runs pooled), self-comparison scores.

``inclusion`` keeps each canary in the training set with probability ½ (bits drawn before training) and
tests the add/remove ε (with ``observe="every_update"``, from every released update rather than the final
model, :func:`every_update_scores`); ``pair`` trains on every canary, draws the bits afterwards and presents the trained
or the fresh label (Algorithm 2), testing replace-one ε.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import numpy as np

from dpverify.audits.membership import (
    audit_streams,
    membership_after_training,
    membership_before_training,
    present_pair,
)
from dpverify.audits.planning import Progress, resolve_device
from dpverify.audits.training import (
    AuditClock,
    AuditFailure,
    ClaimNotTestable,
    ObservationMissing,
    ScoredRun,
    each_pooled_run,
    in_task_order,
    query_black_box,
    train_and_score,
    until_failure,
)
from dpverify.audits.verdict import audit_through_contract, conclude_runs
from dpverify.canaries.synthetic import Canaries, make_canaries
from dpverify.canaries.updates import DiracUpdates, UpdatesMissing
from dpverify.config import AuditConfig
from dpverify.conformance import hand_over_gap
from dpverify.contract import DPHyperparameters, Implementation, StepProgress, TrainedModel, TrainingRequest
from dpverify.execution import Executor, InProcessExecutor, Parcel, chunks
from dpverify.results import AuditResult
from dpverify.stats.scoring import (
    loss_scores,
    mean_comparison_scores,
    self_comparison_scores,
    subsampled_gaussian_log_likelihood_ratio,
)


def run_classification_audit(
    implementation: Implementation,
    config: AuditConfig,
    *,
    progress: Progress | None = None,
    step_progress: StepProgress | None = None,
    executor: Executor | None = None,
) -> AuditResult:
    """Audit a classifier ``implementation`` on ``config.canaries.m`` synthetic canaries, split over
    ``config.pooled_runs`` independent training runs and pooled into one audit; never raises for its
    failures.

    Seeds: one :class:`numpy.random.SeedSequence` from ``config.seed`` (and the run's index) spawns each
    run's canaries', membership bits' and trainer's streams, so the same seed repeats the whole audit on
    the same device, whichever ``executor`` (:mod:`dpverify.execution`; default in-process) the pooled
    runs train on. In worker processes, the trainer's steps are not reported, and the auditor's seconds
    are the runs' added up.
    """
    say = progress or (lambda message: None)
    clock = AuditClock(time.perf_counter())
    device = resolve_device(config.device)  # may import torch once: the trainer's cost, not the auditor's
    pooled = f" in {config.pooled_runs} runs" if config.pooled_runs > 1 else ""
    say(f"training {implementation.info.name} on {config.audit_size} canaries{pooled} ({device})")
    if executor is None or isinstance(executor, InProcessExecutor) or config.pooled_runs == 1:
        runs = each_pooled_run(config, _one_run, device=device, clock=clock, step_progress=step_progress, say=say)
        return audit_through_contract(implementation, config, runs, m=config.audit_size, clock=clock, say=say, device=device)
    shared = (executor.parcel(implementation, what=f"implementation {implementation.info.name!r}"), config, device)
    tasks = [(shared, indices) for indices in chunks(config.pooled_runs, parallelism=executor.parallelism)]
    timed_runs = in_task_order(executor.map(_pooled_runs, tasks, gpu=device == "cuda"))
    try:
        scored = _clocked(timed_runs, clock, say=say, runs=config.pooled_runs)
        return conclude_runs(implementation, config, scored, m=config.audit_size, clock=clock, device=device)
    finally:
        timed_runs.close()


def _pooled_runs(task: tuple[tuple[Parcel, AuditConfig, str], range]) -> tuple[list[tuple[ScoredRun, float]], AuditFailure | None]:
    """In a worker: the pooled runs ``indices`` made, trained and scored, each with its auditor's seconds."""
    (parcel, config, device), indices = task
    implementation = parcel.open()

    def run(index: int) -> tuple[ScoredRun, float]:
        clock = AuditClock(time.perf_counter())
        request, score = _one_run(config, index, device=device, step_progress=None)
        clock.auditor_seconds += clock.seconds()
        scored = train_and_score(implementation, request, score, timeout=config.timeout, clock=clock, say=lambda message: None)
        return scored, clock.auditor_seconds

    return until_failure(run(index) for index in indices)


def _clocked(timed_runs: Iterator[tuple[ScoredRun, float]], clock: AuditClock, *, say: Progress, runs: int) -> Iterator[ScoredRun]:
    """The workers' scored runs as they come back, each said, then "testing the claim"."""
    for done, (scored, auditor_seconds) in enumerate(timed_runs, start=1):
        clock.auditor_seconds += auditor_seconds
        say(f"training in workers: {done} of {runs} runs done")
        yield scored
    say("testing the claim")


def _one_run(
    config: AuditConfig, run: int, *, device: str, step_progress: StepProgress | None
) -> tuple[TrainingRequest, Callable[[TrainedModel], tuple[np.ndarray, np.ndarray, None]]]:
    """Run ``run``'s request (its own canaries and secret bits) and the scorer of its black box."""
    canary_rng, membership_rng, training_seed = audit_streams(config.seed, run=run)
    canaries = make_canaries(dataclasses.replace(config.canaries, m=config.canaries_per_run[run]), rng=canary_rng)
    m = canaries.m
    drawn_before, trained_on = membership_before_training(config.relation, membership_rng, m)
    updates = _update_reader(config, canaries) if config.observe == "every_update" else None
    request = TrainingRequest(
        features=canaries.features[trained_on],
        labels=canaries.labels[trained_on],
        num_classes=canaries.num_classes,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters if updates is None else _with_public_normaliser(config, m),
        seed=training_seed,
        device=device,
        progress=step_progress,
        observe_update=updates,
    )

    def score(trained: TrainedModel) -> tuple[np.ndarray, np.ndarray, None]:
        if updates is not None:
            return every_update_scores(updates, trained, features=canaries.features), drawn_before, None
        log_probs = query_black_box(trained, canaries.features, expected_shape=(m, canaries.num_classes))
        membership = membership_after_training(drawn_before, membership_rng, m)
        if drawn_before is None:
            shown, other = present_pair(membership, canaries.labels, canaries.comparison_labels)
        else:
            shown, other = canaries.labels, canaries.comparison_labels
        if config.score_kind == "self_comparison":
            return self_comparison_scores(log_probs, shown, other), membership, None
        if config.score_kind == "mean_comparison":
            return mean_comparison_scores(log_probs, shown), membership, None
        return loss_scores(log_probs, shown), membership, None

    return request, score


def _with_public_normaliser(config: AuditConfig, m: int) -> DPHyperparameters:
    """The designated hyperparameters with a public normaliser: q·m unless one is designated. In the
    inclusion design the members' count is secret, and the every-update adversary must know what each
    step's noisy sum was divided by to read it back."""
    hp = config.hyperparameters
    return hp if hp.expected_batch_size is not None else dataclasses.replace(hp, expected_batch_size=hp.sampling_rate * m)


def _update_reader(config: AuditConfig, canaries: Canaries) -> DiracUpdates:
    hp = _with_public_normaliser(config, canaries.m)
    return DiracUpdates(
        labels=canaries.labels,
        num_classes=canaries.num_classes,
        feature_scale=config.canaries.feature_scale,
        max_grad_norm=hp.max_grad_norm,
        learning_rate=hp.learning_rate,
        normaliser=hp.normaliser(canaries.m),
        steps=hp.steps,
    )


def every_update_scores(updates: DiracUpdates, trained: TrainedModel, *, features: np.ndarray) -> np.ndarray:
    """Each canary's log-likelihood ratio of its every step, against the σ and q the run claims
    (:func:`~dpverify.stats.scoring.subsampled_gaussian_log_likelihood_ratio`), or decorrelated by the
    claim's noise structure (:func:`_decorrelated_scores`). The updates are audited only
    if they are the returned model's: a trainer that handed nothing over, only some steps or the wrong
    parameters, or whose last parameters handed over do not reproduce its black box on the canaries
    (``features``, within float32 rounding: :func:`~dpverify.conformance.hand_over_gap`) makes the audit
    "not run" (:class:`~dpverify.audits.training.ObservationMissing`): updates frozen at the start, taken
    from another run or another model say nothing about the model returned."""
    try:
        signal, projection = updates.statistics()
    except UpdatesMissing as missing:
        raise ObservationMissing(str(missing), device=trained.device) from None
    log_probs = query_black_box(trained, features, expected_shape=(features.shape[0], updates.num_classes))
    gap, tolerance = hand_over_gap(updates.last_logits(), log_probs, dimension=features.shape[1])
    if gap > tolerance:
        raise ObservationMissing(
            "the updates handed over are not the returned model's: the last parameters handed over give the "
            f"canaries log-probabilities that differ from the black box's by up to {gap:.3g} (float32 rounding "
            f"allows {tolerance:.3g}); hand over the parameters of the model being trained, after each step "
            "(not a frozen copy, nor another run's or another model's)",
            device=trained.device,
        )
    if trained.claim.noise_structure is not None:
        return _decorrelated_scores(updates, trained)
    from dpverify.stats.events import dpsgd_numbers

    try:
        sigma, rate, _ = dpsgd_numbers(trained.claim)  # its numbers, or its DP-SGD event's
    except ValueError as other:
        raise ClaimNotTestable(f"the every-update score is DP-SGD's likelihood ratio, but {other}", device=trained.device) from None
    return subsampled_gaussian_log_likelihood_ratio(signal, projection, noise_multiplier=sigma, sampling_rate=rate)


def _decorrelated_scores(updates: DiracUpdates, trained: TrainedModel) -> np.ndarray:
    """Each canary's exact log-likelihood ratio from its whole column at every step, whitened by the claim's
    strategy C with the τ its event states (:func:`~dpverify.stats.events.correlated_release`): μz − μ²/2 for
    a full batch, the Poisson-subsampled Gaussian's per participation when its event is sampled, mixed over
    the phases of cyclic participation (:func:`~dpverify.stats.correlated.cyclic_log_likelihood_ratio`).
    Unless the noise no record touches refutes the stated structure (:meth:`DiracUpdates.untouched`): then the
    structure that noise shows whitens instead (:func:`~dpverify.stats.correlated.scoring_structure`), so noise
    correlated otherwise than stated is scored as it is. Either way the score reads the release and not the
    secret bits, so a true claim is refuted at most at the test's level whatever the noise. A claim
    whose event states neither participation is not tested here (:class:`~dpverify.audits.training.ClaimNotTestable`)."""
    from dpverify.stats import correlated
    from dpverify.stats.events import correlated_release

    try:
        release = correlated_release(trained.claim)
    except ValueError as other:
        raise ClaimNotTestable(f"the every-update score of correlated noise: {other}", device=trained.device) from None
    structure = release.structure
    if structure.steps != updates.steps:
        raise AuditFailure(
            f"the claim's noise structure spans {structure.steps} steps, but the run took {updates.steps}",
            device=trained.device,
        )
    gradients, released = updates.columns()
    structure, noise_stddev = correlated.scoring_structure(
        updates.untouched(), stated=structure, noise_stddev=release.noise_stddev
    )
    return correlated.cyclic_log_likelihood_ratio(
        released, gradients, structure=structure, noise_stddev=noise_stddev, cycle=release.cycle,
        sampling_rate=release.sampling_rate,
    )