"""Every-update audits: the fixed-batch world (docs/bugs.md class 9), its score, the looks of a two-world audit,
and trainers that do or do not hand their updates over (Request.observe_update)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpverify.audits.two_world import LOOKS, claimed_curve, look_schedule, refuting_bound, run_two_world_audit
from dpverify.canaries.worlds import fixed_batch_spike, fixed_batch_worlds
from dpverify.config import two_world_config
from dpverify.contract import DPHyperparameters, ImplementationInfo, MLPArchitecture, PrivacyClaim
from dpverify.gate import applicable_worlds
from dpverify.results import AuditResult
from tests.doubles import NumpyDPSGD

#: The default gate's fixed-batch setting at the quick profile, as the audit designates it.
GATE = two_world_config("quick", "fixed_batch")
HP = GATE.hyperparameters
RECORDS = GATE.worlds.records
BATCH = (RECORDS + 1) * HP.sampling_rate
HP = DPHyperparameters(**{**HP.__dict__, "expected_batch_size": BATCH})
CLAIM = PrivacyClaim(
    epsilon=5.0, delta=HP.delta, accountant="test", noise_multiplier=HP.noise_multiplier,
    sampling_rate=HP.sampling_rate, steps=HP.steps,
)  # fmt: skip
SCALE = 10.0


def _released(signs: np.ndarray, rng: np.random.Generator) -> list[tuple[np.ndarray, ...]]:
    """The parameters a run of softmax regression hands over when step t's clipped rows add up to
    ``signs[t]`` clip norms along the canary's direction (markers −1, the canary +1): the ideal mechanism."""
    direction = np.array([SCALE, -SCALE, 1.0, -1.0]) / math.sqrt(2 * (SCALE**2 + 1))
    noise = rng.normal(0.0, HP.noise_multiplier * HP.max_grad_norm, (len(signs), 4))
    sums = signs[:, None] * HP.max_grad_norm * direction + noise
    theta = np.vstack([np.zeros(4), -np.cumsum(HP.learning_rate * sums / BATCH, axis=0)]).astype(np.float32)
    return [(row[:2].reshape(2, 1), row[2:]) for row in theta]


def _signs(rng: np.random.Generator, *, canary: bool, fixed: bool) -> np.ndarray:
    """Each step's sum of clipped rows (in clip norms) with ``RECORDS`` markers and the canary if
    ``canary``: Poisson batches at q, or fixed batches of ⌈N·q⌉ from a fresh shuffle each epoch."""
    n = RECORDS + canary
    k = HP.steps_per_epoch
    if not fixed:
        markers = rng.binomial(RECORDS, HP.sampling_rate, HP.steps)
        return -markers + (rng.random(HP.steps) < HP.sampling_rate) * canary
    signs = []
    size = math.ceil(n / k)
    for _ in range(HP.epochs):
        order = rng.permutation(n)  # index RECORDS is the canary
        for batch in np.array_split(order, range(size, n, size)):
            signs.append(float(np.sum(np.where(batch == RECORDS, 1.0, -1.0))))
    return np.array(signs)


def _audit_scores(seed: int, *, fixed: bool, runs: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    score = lambda canary: fixed_batch_spike(_released(_signs(rng, canary=canary, fixed=fixed), rng), HP, scale=SCALE)  # noqa: E731
    return np.array([score(False) for _ in range(runs)]), np.array([score(True) for _ in range(runs)])


def _refuted_at_some_look(d: np.ndarray, dprime: np.ndarray, confidence: float) -> bool:
    curve = claimed_curve(CLAIM, "add_remove")
    return any(
        refuting_bound(d[:r], dprime[:r], claimed_epsilon=CLAIM.epsilon, curve=curve, delta=HP.delta, confidence=c)
        is not None
        for r, c in look_schedule(len(d), confidence)
    )


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
    rng = np.random.default_rng(0)
    released = _released(_signs(rng, canary=False, fixed=False), rng)
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


def test_null_simulation_the_poisson_mechanism_is_refuted_at_most_at_the_level():
    """60 audits of the ideal Poisson mechanism (the claim itself) through the score and the looks at
    level 0.25: refuted in at most a quarter of them. A count of 27 or more has probability below 1e-3
    when the level holds, so this fails by chance about once in a thousand runs."""
    refuted = sum(_refuted_at_some_look(*_audit_scores(seed, fixed=False, runs=GATE.worlds.runs), 0.75) for seed in range(60))
    assert refuted < 27


def test_the_fixed_batch_mechanism_is_refuted_at_the_gate_level():
    """The ideal fixed-batch mechanism at the gate's setting and a main-job-sized per-audit confidence
    (0.9995): refuted on at least 9 of 10 seeds (benchmarks/results/every-update-fixed-batch.md measures
    the rate)."""
    refuted = sum(_refuted_at_some_look(*_audit_scores(seed, fixed=True, runs=GATE.worlds.runs), 0.9995) for seed in range(10))
    assert refuted >= 9


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
