"""Looks at an audit's pooled runs: a refutation ends the audit early, a pass is decided on every run, and
the looks' shares keep the audit's level."""

import math

import pytest

from dpverify.audits import run_audit
from dpverify.audits.planning import final_look_confidence, pooled_looks
from dpverify.config import profile_config
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
