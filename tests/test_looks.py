"""Looks at an audit's pooled runs: a refutation ends the audit early, a pass is decided on every run, and
the looks' shares keep the audit's level."""

import math

import numpy as np
import pytest

from dpverify.audits import run_audit
from dpverify.audits.claims import claimed_epsilon
from dpverify.audits.training import ScoredRun
from dpverify.audits import verdict
from dpverify.audits.planning import final_look_confidence, pooled_looks
from dpverify.config import profile_config
from dpverify.contract import PrivacyClaim
from dpverify.stats.looks import POOLED_LOOKS, look_schedule
from tests.doubles import GaussianMechanism, Memoriser


def pooled_config(**overrides):
    defaults = dict(m=1600, dimension=400, num_classes=10, epochs=1, sampling_rate=1.0, epsilon=2.0, device="cpu", pooled_runs=4)
    return profile_config("quick", **{**defaults, **overrides})


def test_the_looks_shares_add_up_to_the_level():
    assert math.isclose(sum(share for _, share in POOLED_LOOKS), 1.0)
    level = 0.05
    for runs in (1, 2, 3, 4, 10, 16, 100):
        schedule = look_schedule(runs, 1 - level, looks=POOLED_LOOKS)
        assert schedule[-1][0] == runs
        assert [at for at, _ in schedule] == sorted({at for at, _ in schedule})
        assert math.isclose(sum(1 - confidence for _, confidence in schedule), level)
    assert look_schedule(4, 0.95, looks=POOLED_LOOKS) == pytest.approx([(1, 1 - 0.0005), (2, 1 - 0.0005), (4, 1 - 0.049)])
    assert look_schedule(1, 0.95, looks=POOLED_LOOKS) == [(1, 0.95)]


@pytest.mark.parametrize("looks", [((0.5, 0.5),), ((0.5, 0.5), (1.0, 0.6)), ()])
def test_a_schedule_that_would_not_keep_the_level_is_refused(looks):
    with pytest.raises(ValueError, match="looks must end at fraction 1 and their shares add up to 1"):
        look_schedule(4, 0.95, looks=looks)


def test_a_refutation_at_the_first_look_trains_no_further_run():
    memoriser = Memoriser(claimed_epsilon=1.0)
    result = run_audit(memoriser, pooled_config())
    assert result.verdict == "violation"
    assert len(memoriser.requests) == 1 and result.curve_runs == 1
    assert result.m == 400 and result.scores.shape == (400,)


def test_a_pass_is_decided_on_every_run_at_the_last_looks_share():
    config = pooled_config()
    result = run_audit(GaussianMechanism(claimed_epsilon=2.0), config)
    assert result.verdict == "pass"
    assert result.curve_runs == 4 and result.m == 1600
    assert result.confidence == config.confidence  # the audit's level; its last look tests at 98 % of it
    assert final_look_confidence(config) == pytest.approx(1 - 0.98 * (1 - config.confidence))
    assert [at for at, _ in pooled_looks(config)] == [1, 2, 4]


@pytest.mark.parametrize("sampling_rate", [1.0, 0.1])
@pytest.mark.parametrize("runs", [1, 3])
def test_an_early_looks_decision_is_the_full_verdicts(sampling_rate, runs):
    """An early look decides with the tests alone (no search for the weakest refuted member): on scores from
    no signal to far beyond the claim, at one run and pooled, full batch and subsampled, it says violation
    exactly where the full tests' verdict does."""
    config = pooled_config(sampling_rate=sampling_rate)
    claim = PrivacyClaim(epsilon=2.0, delta=1e-5, accountant="test", noise_multiplier=1.0, sampling_rate=sampling_rate, steps=10)
    claimed = claimed_epsilon(ScoredRun(np.zeros(1), np.ones(1), None, claim, "cpu"), config.relation)[0]
    rng = np.random.default_rng(7)
    decisions = []
    for separation in (0.0, 1.5, 4.0):
        pooled = []
        for _ in range(runs):
            membership = rng.choice([-1, 1], size=400)
            scores = separation * (membership > 0) + rng.standard_normal(400)
            pooled.append(ScoredRun(scores, membership, None, claim, "cpu"))
        full = verdict.tested_at_look(config, pooled, claimed=claimed, confidence=0.99)
        early = verdict.refuted_at_look(config, pooled, claimed=claimed, confidence=0.99)
        decisions.append(early)
        assert early == (full.verdict == "violation"), (separation, full.verdict)
    assert decisions[0] is False and decisions[-1] is True  # both outcomes were tested
