"""Every-update audits: the fixed-batch world (docs/bugs.md class 9), its score, the looks of a two-world audit,
and trainers that do or do not hand their updates over (Request.observe_update). The null test with power
of the fixed-batch world through the audit is in tests/test_null_simulations.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpverify.audits.two_world import LOOKS, look_schedule, run_two_world_audit
from dpverify.canaries.worlds import fixed_batch_spike, fixed_batch_worlds
from dpverify.config import two_world_config
from dpverify.contract import DPHyperparameters, ImplementationInfo, MLPArchitecture
from dpverify.gate import applicable_worlds
from dpverify.results import AuditResult
from tests.doubles import NumpyDPSGD
from tests.null_simulations import fixed_batch_updates

#: The default gate's fixed-batch setting at the quick profile, as the audit designates it.
GATE = two_world_config("quick", "fixed_batch")
HP = GATE.hyperparameters
RECORDS = GATE.worlds.records
BATCH = (RECORDS + 1) * HP.sampling_rate
HP = DPHyperparameters(**{**HP.__dict__, "expected_batch_size": BATCH})
SCALE = 10.0


def test_the_fixed_batch_world_is_a_pair_of_add_remove_neighbours():
    world = fixed_batch_worlds(records=RECORDS)
    assert world.relation == "add_remove" and world.observes_updates and world.observed == "every update"
    assert len(world.labels_dprime) == len(world.labels_d) + 1 and world.public_size == RECORDS + 1
    assert np.all(world.labels_d == 0) and world.labels_dprime[-1] == 1
    with pytest.raises(ValueError, match="every released update"):
        world.score_log_probs(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="two classes"):
        fixed_batch_worlds(num_classes=3)


def test_the_score_refuses_what_it_cannot_read():
    world = fixed_batch_worlds(records=RECORDS)
    released = fixed_batch_updates(world, HP, in_dprime=False, deficit=1.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="parameter sets"):
        fixed_batch_spike(released[:-1], HP, scale=SCALE)
    with pytest.raises(ValueError, match="softmax regression on two classes"):
        fixed_batch_spike([(np.zeros((3, 1)), np.zeros(3))] * (HP.steps + 1), HP, scale=SCALE)


def test_looks_spend_the_whole_level_and_no_more():
    assert math.isclose(sum(share for _, share in LOOKS), 1.0)
    for runs in (2, 30, 79, 160, 1000):
        schedule = look_schedule(runs, 0.95)
        assert schedule[-1][0] == runs
        assert [r for r, _ in schedule] == sorted({r for r, _ in schedule})
        assert math.isclose(sum(1 - c for _, c in schedule), 0.05)


def _audit(implementation, *, confidence: float = 0.99, seed: int = 0):
    return run_two_world_audit(
        implementation,
        world=GATE.worlds.worlds(),
        runs=GATE.worlds.runs,
        hyperparameters=GATE.hyperparameters,
        architecture=MLPArchitecture(hidden_width=0),
        confidence=confidence,
        seed=seed,
    )


@pytest.mark.slow
def test_a_third_party_trainer_with_shuffled_fixed_batches_is_refuted():
    result = _audit(NumpyDPSGD(fixed_batches=True))
    assert result.verdict == "violation" and result.observed == "every update"


@pytest.mark.slow
def test_its_poisson_twin_passes():
    """Fails with probability at most 1 − confidence = 0.01 (the test's level covers every look)."""
    result = _audit(NumpyDPSGD())
    assert result.verdict == "pass", result


def test_a_trainer_that_hands_over_no_updates_is_not_run_never_passed():
    result = _audit(NumpyDPSGD(hands_over_updates=False))
    assert result.verdict == "undecided"
    assert "hands over no updates" in result.not_run


@pytest.mark.parametrize(
    "fields, worlds",
    [
        (dict(), ("dataset_size", "fixed_batch", "realised_batch", "worst_case_record")),
        (dict(designated_normaliser=False), ("fixed_batch",)),
        (dict(expected="known-issue", issue="https://example.org/9", bug=9), ("fixed_batch",)),
        (dict(expected="violation", bug=9, breaks="shuffles", detectability="D3"), ("fixed_batch",)),
    ],
)
def test_the_gate_runs_the_fixed_batch_world_where_it_applies(fields, worlds):
    info = ImplementationInfo(name="x", library="x", **fields)
    assert applicable_worlds(info) == worlds


@pytest.mark.parametrize(
    "world, reads, catches",
    [
        ("fixed_batch", "it reads the batch sampler, not the noise", "It catches fixed-size batches of a shuffled dataset"),
        ("dataset_size", "the noise's scale", "it states no noise deficit"),
        ("realised_batch", "the noise's scale", "it states no noise deficit"),
    ],
)
def test_a_worlds_pass_says_what_its_score_reads_and_catches_and_promises_no_noise_deficit(world, reads, catches):
    """A world whose score does not read the differing record states no power of its own: its pass says what
    it reads instead (the fixed-batch world: the batch sampler, never the noise)."""
    result = AuditResult(
        implementation="x", design="two_world", relation="add_remove", claimed_epsilon=5.0, delta=1e-5,
        epsilon_lower_bound=0.0, confidence=0.95, m=160, guesses=160, correct=80, optimal_epsilon=6.0,
        verdict="pass", seed=0, device="cpu", seconds=1.0, config={"worlds": {"world": world}},
    )  # fmt: skip
    assert reads in result.summary() and catches in result.summary()
    assert "it catches noise" not in result.summary()
