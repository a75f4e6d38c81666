"""UniAud++'s multi-task audit data (paper section 5, Algorithm 3), framework-free.

m audit records, chosen at random from a real training split, each get a *trigger* g_i appended as extra
feature dimensions and H *tags* e_i ∈ [|E|] for a separate tag head; every other training record and
every test record gets zeros in the trigger dimensions and no tag, so the main task keeps its data
(the paper's X × G → Y × E). Each audit record also gets H fresh *comparison* tags e'_i, drawn like e_i
and independently of it: the pair (e_i, e'_i) is exchangeable, which is Algorithm 2's label independence
(Property 1) moved to the tag space, so the self-comparison score on the tag head obeys Theorem 1 for
the replace-one relation. The H tags of a record are distinct (multi-bit encoding): H ≤ |E|.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice, check_int, check_real
from dpverify.canaries.synthetic import CANARY_MODES, CanaryConfig, make_canaries
from dpverify.datasets import DATASETS, DatasetSplit

TriggerMode = Literal["orthogonal", "gaussian"]


@dataclass(frozen=True, kw_only=True)
class DataAuditConfig:
    """The data-dependent part of an audit (designs ``multitask``, ``in_distribution``, ``mislabeled``).

    ``m`` audit records of ``dataset``'s training split (``test_fraction`` is held out for the test
    accuracy). UniAud++ only: triggers of ``trigger_dimension`` extra features, ``trigger_mode`` and row norm
    ``trigger_scale`` as Algorithm 1's canaries; ``num_tags`` = |E| tag classes, ``tags_per_record`` = H
    distinct tags per audit record; ``tag_weight`` = λ in L = CE(main) + λ · mean_h CE(tag_h).
    """

    dataset: str = "digits"
    m: int = 300
    test_fraction: float = 0.25
    trigger_dimension: int = 300
    trigger_mode: TriggerMode = "orthogonal"
    trigger_scale: float = 8.0
    num_tags: int = 100
    tags_per_record: int = 1
    tag_weight: float = 1.0

    def __post_init__(self) -> None:
        check_choice("dataset", self.dataset, DATASETS)
        check_int("m", self.m, low=1)
        check_real("test_fraction", self.test_fraction, low=0.0, high=1.0, low_open=True, high_open=True)
        check_int("trigger_dimension", self.trigger_dimension, low=1)
        check_choice("trigger_mode", self.trigger_mode, CANARY_MODES)
        check_real("trigger_scale", self.trigger_scale, low=0.0, low_open=True)
        check_int("num_tags", self.num_tags, low=2)
        check_int("tags_per_record", self.tags_per_record, low=1, high=self.num_tags)
        check_real("tag_weight", self.tag_weight, low=0.0, low_open=True)


@dataclass(frozen=True, eq=False)
class MultiTaskData:
    """Algorithm 3's output. ``features`` (n × (d + g), float32) and ``labels`` are the training split with
    trigger columns; ``tags`` (n × H, int64) holds −1 on every record but the audit records
    ``audit_indices``; ``comparison_tags`` (m × H) are the fresh tags e'_i, row i for ``audit_indices[i]``.
    ``test_features`` carry zeros in the trigger columns."""

    features: np.ndarray
    labels: np.ndarray
    tags: np.ndarray
    audit_indices: np.ndarray
    comparison_tags: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    num_tags: int

    @property
    def m(self) -> int:
        return int(self.audit_indices.shape[0])

    @property
    def audit_features(self) -> np.ndarray:
        return self.features[self.audit_indices]

    @property
    def audit_tags(self) -> np.ndarray:
        return self.tags[self.audit_indices]


def check_audit_size(m: int, split: DatasetSplit) -> None:
    """m audit records must fit in the training split."""
    if m > split.num_train:
        raise ValueError(
            f"m must be at most the {split.num_train} records of {split.name!r}'s training split, got {m}"
        )


def draw_distinct_tags(rows: int, per_row: int, num_tags: int, *, rng: np.random.Generator) -> np.ndarray:
    """``rows × per_row`` int64 tags, uniform over [num_tags] and distinct within a row."""
    check_int("per_row", per_row, low=1, high=num_tags)
    return np.argsort(rng.random((rows, num_tags)), axis=1)[:, :per_row].astype(np.int64)


def make_multitask_data(split: DatasetSplit, config: DataAuditConfig, *, rng: np.random.Generator) -> MultiTaskData:
    """Algorithm 3 on ``split``: pick the audit records, append their triggers, draw tags and fresh tags."""
    check_audit_size(config.m, split)
    n, m = split.num_train, config.m
    audit_indices = np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
    triggers = make_canaries(
        CanaryConfig(
            m=m,
            dimension=config.trigger_dimension,
            num_classes=2,  # the canaries' labels are not used: tags take their place
            mode=config.trigger_mode,
            feature_scale=config.trigger_scale,
        ),
        rng=rng,
    ).features
    trigger_columns = np.zeros((n, config.trigger_dimension), dtype=np.float32)
    trigger_columns[audit_indices] = triggers
    tags = np.full((n, config.tags_per_record), -1, dtype=np.int64)
    tags[audit_indices] = draw_distinct_tags(m, config.tags_per_record, config.num_tags, rng=rng)
    comparison_tags = draw_distinct_tags(m, config.tags_per_record, config.num_tags, rng=rng)
    test_zeros = np.zeros((split.test_labels.shape[0], config.trigger_dimension), dtype=np.float32)
    return MultiTaskData(
        features=np.hstack([split.train_features, trigger_columns]),
        labels=split.train_labels,
        tags=tags,
        audit_indices=audit_indices,
        comparison_tags=comparison_tags,
        test_features=np.hstack([split.test_features, test_zeros]),
        test_labels=split.test_labels,
        num_classes=split.num_classes,
        num_tags=config.num_tags,
    )
