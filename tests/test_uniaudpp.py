"""UniAud++ (paper section 5, Algorithm 3): the audit data, the contract's multi-task fields, the
two-head model and its loss, and the configuration. Fast; the audits themselves are in
test_uniaudpp_audit.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from dpverify.config import AuditConfig, profile_config  # noqa: E402
from dpverify.contract import DPHyperparameters, TrainingRequest  # noqa: E402
from dpverify.datasets import load_dataset  # noqa: E402
from dpverify.canaries.tagged import DataAuditConfig, draw_distinct_tags, make_multitask_data  # noqa: E402
from dpverify.stats.scoring import self_comparison_scores  # noqa: E402

SPLIT = load_dataset("digits", test_fraction=0.25, seed=0)


def data(seed: int, **changes):
    config = DataAuditConfig(**{**dict(m=200, trigger_dimension=200, num_tags=20, tags_per_record=3), **changes})
    return make_multitask_data(SPLIT, config, rng=np.random.default_rng(seed))


def test_digits_split_is_seeded_standardised_and_disjoint():
    again, other = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    assert SPLIT.train_features.shape == (1348, 64) and SPLIT.test_features.shape == (449, 64)  # 1797 images, 25 % held out
    assert SPLIT.train_features.dtype == np.float32 and SPLIT.num_classes == 10
    np.testing.assert_array_equal(again.train_features, SPLIT.train_features)
    assert not np.array_equal(other.train_labels, SPLIT.train_labels)
    np.testing.assert_allclose(SPLIT.train_features.mean(axis=0), 0.0, atol=1e-5)


def test_triggers_and_tags_are_seeded_and_only_on_audit_records():
    first, same, other = data(3), data(3), data(4)
    for name in ("features", "tags", "audit_indices", "comparison_tags"):
        np.testing.assert_array_equal(getattr(first, name), getattr(same, name))
        assert not np.array_equal(getattr(first, name), getattr(other, name))
    n, d = SPLIT.train_features.shape
    assert first.features.shape == (n, d + 200) and first.tags.shape == (n, 3)
    others = np.setdiff1d(np.arange(n), first.audit_indices)
    assert np.all(first.features[others, d:] == 0) and np.all(first.tags[others] == -1)
    assert np.all(first.test_features[:, d:] == 0)
    np.testing.assert_array_equal(first.features[:, :d], SPLIT.train_features)  # the main task's data is kept
    triggers = first.features[first.audit_indices, d:]
    np.testing.assert_allclose(np.linalg.norm(triggers, axis=1), 8.0, rtol=1e-5)  # orthogonal mode: exact norm
    assert np.all((first.audit_tags >= 0) & (first.audit_tags < 20))
    for tags in (first.audit_tags, first.comparison_tags):  # multi-bit: H distinct tags per record
        assert all(len(set(row)) == 3 for row in tags)


def test_fresh_tags_are_independent_of_the_trained_ones():
    from scipy.stats import chi2_contingency

    # Independence of (e_h, e'_h) over 20 000 draws with |E| = 5: a chi-square test at level 0.001, so an
    # independent draw fails 1 run in 1000, while a comparison tag that depended on the trained tag
    # (e.g. e' = e + 1 mod |E|, or drawn from the same stream position) would give p ≈ 0.
    rng = np.random.default_rng(11)
    trained = draw_distinct_tags(20_000, 1, 5, rng=rng)[:, 0]
    fresh = draw_distinct_tags(20_000, 1, 5, rng=rng)[:, 0]
    table = np.zeros((5, 5))
    np.add.at(table, (trained, fresh), 1)
    assert chi2_contingency(table).pvalue > 1e-3


def test_multi_bit_self_comparison_sums_the_tags():
    log_probs = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]))
    shown, other = np.array([[0, 1], [2, 0]]), np.array([[2, 2], [1, 1]])
    expected = [np.log(0.5 / 0.2) + np.log(0.3 / 0.2), np.log(0.8 / 0.1) + np.log(0.1 / 0.1)]
    np.testing.assert_allclose(self_comparison_scores(log_probs, shown, other), expected)


def request(**changes):
    rng = np.random.default_rng(0)
    base = dict(
        features=rng.standard_normal((6, 4)).astype(np.float32),
        labels=np.arange(6, dtype=np.int64) % 3,
        num_classes=3,
        hyperparameters=DPHyperparameters(noise_multiplier=1.0),
        tags=np.array([[0, 1], [2, -1], [-1, -1], [3, 4], [-1, -1], [1, 0]], dtype=np.int64),
        num_tags=5,
        tag_weight=0.5,
    )
    return TrainingRequest(**{**base, **changes})


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(tags=None), "num_tags must be 0 when no tags are given"),
        (dict(num_tags=0), "num_tags must be >= 2 when tags are given"),
        (dict(tags=np.zeros((5, 2), dtype=np.int64)), r"tags must be an int64 array of shape \(6, H\)"),
        (dict(tags=np.full((6, 1), 5, dtype=np.int64)), r"tags must lie in \[0, 4\] or be -1"),
        (dict(tag_weight=0.0), r"tag_weight must be in \(0, inf\]"),
    ],
)
def test_request_rejects_bad_tags(changes, message):
    with pytest.raises(ValueError, match=message):
        request(**changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(num_tags=4, tags_per_record=5), r"tags_per_record must be in \[1, 4\], got 5"),
        (dict(trigger_mode="ring"), "trigger_mode must be one of"),
        (dict(dataset="mnist"), "dataset must be one of 'digits'"),
        (dict(m=0), "m must be >= 1"),
    ],
)
def test_data_config_rejects_bad_settings(changes, message):
    with pytest.raises(ValueError, match=message):
        DataAuditConfig(**changes)


def test_m_larger_than_the_training_split_is_an_error():
    with pytest.raises(ValueError, match="m must be at most the 1348 records of 'digits'"):
        data(0, m=1349, trigger_dimension=10)


def test_overrides_route_to_the_data_part_and_fix_the_score():
    config = profile_config("quick", design="multitask", m=123, num_tags=7, tags_per_record=2, tag_weight=3.0)
    assert (config.data.m, config.data.num_tags, config.data.tags_per_record, config.data.tag_weight) == (123, 7, 2, 3.0)
    assert config.canaries.m == profile_config("mlp").canaries.m  # m went to the audit records
    assert config.audit_size == 123 and config.relation == "replace_one" and config.score_kind == "self_comparison"
    baseline = profile_config("quick", design="mislabeled")
    assert baseline.relation == "add_remove" and baseline.score_kind == "loss"
    with pytest.raises(ValueError, match="score must be 'auto' for the 'multitask' design"):
        AuditConfig(design="multitask", score="loss")
    with pytest.raises(ValueError, match="unknown audit setting"):
        profile_config("quick", design="multitask", tags=3)


torch = pytest.importorskip("torch")


def test_tag_head_is_separate_and_the_main_head_ignores_it():
    from dpverify.torch import MultiTaskMLP, black_boxes, build_mlp

    req = request()
    model = build_mlp(req)
    assert isinstance(model, MultiTaskMLP)
    assert model.tag_head is not model.main_head
    assert {id(p) for p in model.tag_head.parameters()}.isdisjoint(id(p) for p in model.main_head.parameters())
    assert (model.main_head.out_features, model.tag_head.out_features) == (3, 5)
    boxes = black_boxes(model, req)
    main_before, tags_before = boxes["predict_log_proba"](req.features), boxes["predict_tag_log_proba"](req.features)
    assert main_before.shape == (6, 3) and tags_before.shape == (6, 5)
    np.testing.assert_allclose(np.exp(tags_before).sum(axis=1), 1.0)
    with torch.no_grad():
        model.tag_head.weight.normal_()
        model.tag_head.bias.normal_()
    np.testing.assert_array_equal(boxes["predict_log_proba"](req.features), main_before)
    assert not np.allclose(boxes["predict_tag_log_proba"](req.features), tags_before)
    plain = build_mlp(request(tags=None, num_tags=0))
    assert isinstance(plain, torch.nn.Sequential)  # without tags: the designated MLP as before


def test_multitask_loss_is_main_plus_weighted_mean_tag_loss():
    from dpverify.torch import as_tensors, build_mlp, training_criterion

    req = request()
    features, targets = as_tensors(req)
    assert targets.shape == (6, 3)
    outputs = build_mlp(req)(features)
    per_record = training_criterion(req, reduction="none")(outputs, targets)
    logp_main = torch.log_softmax(outputs[:, :3], 1)
    logp_tags = torch.log_softmax(outputs[:, 3:], 1)
    for i in range(6):
        expected = -logp_main[i, req.labels[i]]
        carried = [t for t in req.tags[i] if t >= 0]
        if carried:
            expected = expected - 0.5 * torch.stack([logp_tags[i, t] for t in carried]).mean()
        torch.testing.assert_close(per_record[i], expected)
    torch.testing.assert_close(training_criterion(req)(outputs, targets), per_record.mean())


def test_reference_clips_the_whole_two_head_gradient_per_record():
    from dpverify.torch import as_tensors, build_mlp, training_criterion
    from dpverify_reference.dpsgd import clipped_gradient_sum

    req = request()
    model = build_mlp(req)
    features, targets = as_tensors(req)
    criterion = training_criterion(req, reduction="none")
    clipped, norms = clipped_gradient_sum(model, features, targets, 0.3, criterion=criterion)
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(6):  # brute force: one backward per record
        grads = torch.autograd.grad(criterion(model(features[i : i + 1]), targets[i : i + 1]).sum(), list(model.parameters()))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        torch.testing.assert_close(norms[i], norm)
        for total, g in zip(expected, grads):
            total += g * min(1.0, 0.3 / float(norm))
    for got, want in zip(clipped, expected):
        torch.testing.assert_close(got, want)
