"""The audit's decision exists once: the level goes to the tests that can refute at the audit's m and runs,
and the verdict and the power simulation decide through the same function."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpverify.audits import verdict
from dpverify.audits.training import ScoredRun
from dpverify.config import profile_config
from dpverify.contract import PrivacyClaim
from dpverify.stats import power
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.decision import audit_decision, audit_refutes
from dpverify.stats.scoring import GuessRule

#: The quick profile's final-model claim (ε 2 at δ 1e-5 over 10 full-batch steps) and guess grid.
FINAL = ClaimedRun(noise_multiplier=6.306, steps=10)
FINAL_RULE = GuessRule()
#: The every-update gate's claim (σ 1, q 0.1, 8 epochs: ε 6.3) and guess grid.
EVERY_UPDATE = ClaimedRun(noise_multiplier=1.0, sampling_rate=0.1, steps=80)
EVERY_UPDATE_RULE = GuessRule(fractions=(0.02, 0.05, 0.1), sides="one")
#: A session of 100 counted audits at 95 %: each audit's confidence.
GATE = 1 - 0.05 / 100


def _shares(run, rule, sizes, confidence):
    decision = audit_decision(run, run_sizes=sizes, guess_rule=rule, claimed_epsilon=run.epsilon(1e-5), delta=1e-5, confidence=confidence)
    return decision.steinke_confidence, decision.curve_confidence, decision.decidable


@pytest.mark.parametrize(
    ("run", "rule", "sizes", "confidence", "tests"),
    [
        # Both tests can refute the quick profile's claim of ε 2 with every guess right at a one-audit level:
        # half each.
        (FINAL, FINAL_RULE, (2500,) * 4, 0.95, "both"),
        (FINAL, FINAL_RULE, (500,), 0.95, "both"),
        # At a gate's per-audit level the (ε, δ) test's ceiling at 10 000 canaries is below ε 2.
        (FINAL, FINAL_RULE, (2500,) * 4, GATE, "curve"),
        # The every-update gate: ε 6.3 is above the (ε, δ) test's ceiling at any of its looks' m.
        (EVERY_UPDATE, EVERY_UPDATE_RULE, (2500,) * 4, GATE, "curve"),
        (EVERY_UPDATE, EVERY_UPDATE_RULE, (2500,) * 16, 0.95, "curve"),
        (EVERY_UPDATE, EVERY_UPDATE_RULE, (2500,) * 16, GATE, "curve"),
        # One run of 2500 at the gate's level: neither could refute even with the whole level.
        (EVERY_UPDATE, EVERY_UPDATE_RULE, (2500,), GATE, "neither"),
        (FINAL, FINAL_RULE, (20,), GATE, "neither"),
    ],
)
def test_the_level_goes_to_the_tests_that_can_refute(run, rule, sizes, confidence, tests):
    """Which tests get level at which m (docs/guarantee.md): half each when both could refute with every
    guess right at half; the whole to the one that could; an even split, undecidable, when neither could."""
    half = 1 - (1 - confidence) / 2
    expected = {
        "both": (half, half, True),
        "curve": (None, confidence, True),
        "neither": (half, half, False),
    }[tests]
    assert _shares(run, rule, sizes, confidence) == pytest.approx(expected)


def _pooled(separation: float, runs: int, claim: PrivacyClaim, rng) -> list[ScoredRun]:
    pooled = []
    for _ in range(runs):
        membership = rng.choice([-1, 1], size=400)
        pooled.append(ScoredRun(separation * (membership > 0) + rng.standard_normal(400), membership, None, claim, "cpu"))
    return pooled


@pytest.mark.parametrize("runs", [1, 3])
def test_the_verdict_and_the_score_level_decision_agree(runs):
    """:func:`verdict.tested_at_look`, :func:`verdict.refuted_at_look` and :func:`audit_refutes` (what the
    simulations call) give the same decision on the same scores, from no signal to far beyond the claim."""
    config = profile_config("quick", m=1600, dimension=400, epochs=1, sampling_rate=1.0, epsilon=2.0, device="cpu", pooled_runs=4)
    claim = PrivacyClaim(epsilon=2.0, delta=1e-5, accountant="test", noise_multiplier=math.sqrt(10) / 0.8, sampling_rate=1.0, steps=10)
    run = ClaimedRun(noise_multiplier=claim.noise_multiplier, steps=10)
    claimed = run.epsilon(1e-5)
    rng, outcomes = np.random.default_rng(5), []
    for separation in (0.0, 1.0, 2.0, 4.0):
        pooled = _pooled(separation, runs, claim, rng)
        full = verdict.tested_at_look(config, pooled, claimed=claimed, confidence=0.99)
        early = verdict.refuted_at_look(config, pooled, claimed=claimed, confidence=0.99)
        scored = audit_refutes(
            [p.scores for p in pooled], [p.membership for p in pooled], run, guess_rule=config.guess_rule,
            claimed_epsilon=claimed, delta=1e-5, confidence=0.99,
        )  # fmt: skip
        assert early == scored == (full.verdict == "violation"), (separation, full.verdict)
        outcomes.append(scored)
    assert outcomes[0] is False and outcomes[-1] is True  # both outcomes were tested


@pytest.mark.parametrize("sizes", [(1000,), (500, 500)])
def test_the_power_simulation_decides_each_simulated_audit_as_the_audit_would(sizes):
    """k*'s simulated audits (:class:`power._OneRunSimulation`, vectorised over audits) refute exactly the
    ones :func:`audit_refutes` refutes on the same scores: one decision, not a copy that could drift."""
    run = ClaimedRun(noise_multiplier=math.sqrt(10) / 0.8, steps=10)
    setting = dict(guess_rule=FINAL_RULE, claimed_epsilon=run.epsilon(1e-5), delta=1e-5, confidence=0.95)
    simulation = power._OneRunSimulation(run, sizes, *setting.values())
    edges = np.cumsum((0, *sizes))
    found = []
    for separation in (1.6, 2.4):  # below and above the separation k* is read at
        scores = simulation.noise + separation * simulation.shift
        bits = np.where(simulation.member, 1, -1)
        one_by_one = [
            audit_refutes([s[a:b] for a, b in zip(edges[:-1], edges[1:])], [m[a:b] for a, b in zip(edges[:-1], edges[1:])], run, **setting)
            for s, m in zip(scores, bits)
        ]
        count, truth = simulation.refuted(separation), sum(one_by_one)
        # The simulation stops asking the curve test once enough audits are refuted; it never decides otherwise.
        assert count == truth or simulation.needed <= count <= truth, (separation, count, truth)
        assert (count >= simulation.needed) == (truth >= simulation.needed)
        found.append(count >= simulation.needed)
    assert found == [False, True]
