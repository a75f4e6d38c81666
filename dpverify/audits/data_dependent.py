"""Data-dependent audits (the paper's Case II: the audited model must stay useful): UniAud++ and the two
O(1) baselines it is compared with, on real data through the same contract, each reporting the main
task's test accuracy next to ε_L.

- ``multitask`` (UniAud++, Algorithm 3 + Algorithm 2): every training record is used; m audit records
  carry a trigger and H tags for a separate tag head. After training the auditor draws S_i and shows
  the trained tags e_i (S_i = +1) or the fresh tags e'_i (S_i = −1); the score is
  Σ_h [log p_tag(shown_h) − log p_tag(other_h)]. Replace-one relation.
- ``in_distribution`` (Steinke, Nasr & Jagielski 2023): m training records are the canaries, each kept
  in the training set with probability ½ (S_i drawn before training); score log p(y_i). Add/remove.
- ``mislabeled``: the same with every canary relabelled uniformly among the C − 1 wrong classes; score
  log p(wrong label). Add/remove.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from dpverify.audits.membership import draw_membership, membership_before_training, present_pair
from dpverify.audits.planning import Progress, resolve_device
from dpverify.audits.training import AuditClock, query_black_box
from dpverify.audits.verdict import audit_through_contract
from dpverify.config import AuditConfig
from dpverify.contract import Implementation, StepProgress, TrainedModel, TrainingRequest
from dpverify.datasets import DatasetSplit, load_dataset
from dpverify.canaries.tagged import check_audit_size, make_multitask_data
from dpverify.results import AuditResult
from dpverify.stats.scoring import loss_scores, self_comparison_scores

def main_task_accuracy(trained: TrainedModel, features: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Accuracy of the main head's most likely class on the held-out split."""
    log_probs = query_black_box(trained, features, expected_shape=(labels.shape[0], num_classes))
    return float(np.mean(np.argmax(log_probs, axis=1) == labels))


def run_data_audit(
    implementation: Implementation,
    config: AuditConfig,
    *,
    progress: Progress | None = None,
    step_progress: StepProgress | None = None,
) -> AuditResult:
    """Audit ``implementation`` once with the data-dependent ``config.design``; never raises for a failing
    implementation (verdict ``error``), but raises ``ValueError`` for an audit that cannot be set up (m
    larger than the training split) and ``ImportError`` when the dataset's extra is missing.

    Seeds: ``SeedSequence(config.seed)`` spawns the split's, the audit records', the membership bits' and
    the trainer's streams."""
    if not config.is_data_dependent:
        raise ValueError(f"design must be one of 'multitask', 'in_distribution', 'mislabeled', got {config.design!r}")
    say = progress or (lambda message: None)
    clock = AuditClock(time.perf_counter())
    device = resolve_device(config.device)
    auditor_started = time.perf_counter()
    split_seq, records_seq, membership_seq, training_seq = np.random.SeedSequence(config.seed).spawn(4)
    split = load_dataset(
        config.data.dataset, test_fraction=config.data.test_fraction, seed=int(split_seq.generate_state(1)[0])
    )
    check_audit_size(config.data.m, split)
    records_rng, membership_rng = np.random.default_rng(records_seq), np.random.default_rng(membership_seq)
    training_seed = int(training_seq.generate_state(1)[0] % 2**31)
    prepare = _prepare_multitask if config.design == "multitask" else _prepare_baseline
    request, test_features, score_audit_records = prepare(
        split, config, records_rng, membership_rng, training_seed=training_seed, device=device
    )
    request = dataclasses.replace(request, progress=step_progress)  # the trainer reports its steps to it
    clock.auditor_seconds = time.perf_counter() - auditor_started

    def score(trained: TrainedModel) -> tuple[np.ndarray, np.ndarray, float]:
        accuracy = main_task_accuracy(trained, test_features, split.test_labels, split.num_classes)
        return (*score_audit_records(trained), accuracy)

    say(f"training {implementation.info.name} on {request.num_records} records of {split.name} ({device})")
    return audit_through_contract(
        implementation, config, [(request, score)], m=config.data.m, clock=clock, say=say, device=request.device
    )


RecordScorer = Callable[[TrainedModel], tuple[np.ndarray, np.ndarray]]


def _prepare_multitask(
    split: DatasetSplit, config: AuditConfig, records_rng, membership_rng, *, training_seed: int, device: str
) -> tuple[TrainingRequest, np.ndarray, RecordScorer]:
    """UniAud++'s request (Algorithm 3), the test inputs (zero triggers) and the tag self-comparison."""
    data = make_multitask_data(split, config.data, rng=records_rng)
    request = TrainingRequest(
        features=data.features,
        labels=data.labels,
        num_classes=data.num_classes,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
        tags=data.tags,
        num_tags=data.num_tags,
        tag_weight=config.data.tag_weight,
    )

    def score(trained: TrainedModel) -> tuple[np.ndarray, np.ndarray]:
        tag_log_probs = query_black_box(
            trained, data.audit_features, expected_shape=(data.m, data.num_tags), head="predict_tag_log_proba"
        )
        membership = draw_membership(membership_rng, data.m)  # after training (Algorithm 2)
        shown, other = present_pair(membership, data.audit_tags, data.comparison_tags)
        return self_comparison_scores(tag_log_probs, shown, other), membership

    return request, data.test_features, score


def _prepare_baseline(
    split: DatasetSplit, config: AuditConfig, records_rng, membership_rng, *, training_seed: int, device: str
) -> tuple[TrainingRequest, np.ndarray, RecordScorer]:
    """A baseline's request (canaries kept with probability ½), the test inputs and the loss score."""
    m, n = config.data.m, split.num_train
    canaries = np.sort(records_rng.choice(n, size=m, replace=False))
    labels = split.train_labels.copy()
    if config.design == "mislabeled":
        labels[canaries] = (labels[canaries] + records_rng.integers(1, split.num_classes, size=m)) % split.num_classes
    membership, trained_on = membership_before_training(config.relation, membership_rng, m)
    kept = np.ones(n, dtype=bool)
    kept[canaries[~trained_on]] = False
    request = TrainingRequest(
        features=split.train_features[kept],
        labels=labels[kept],
        num_classes=split.num_classes,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
    )

    def score(trained: TrainedModel) -> tuple[np.ndarray, np.ndarray]:
        log_probs = query_black_box(trained, split.train_features[canaries], expected_shape=(m, split.num_classes))
        return loss_scores(log_probs, labels[canaries]), membership

    return request, split.test_features, score
