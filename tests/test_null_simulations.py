"""Null tests with power, through the real audits (:mod:`tests.null_simulations`): for each audit type, the
one-run audit (both its tests), the every-update Dirac audit (its reader and looks) and every two-world
world, simulated audits of a mechanism that is exactly its claim are refuted at no more than the level, and
audits of one whose claimed curve is 1.25 times too strong (σ claimed, σ/1.25 added) are refuted often
enough to show that the test notices.

Each null check fails when the one-sided 99.9 % Clopper–Pearson lower end of the refuted share exceeds
:data:`~tests.null_simulations.LEVEL` (probability ≤ 0.001 when the level holds). Each power check asks
for at least a count whose rate lies well under the rate measured at 1.25× and well above the level, so
that a test that stopped noticing (a curve test that always passes, a level spent nowhere) fails it:
benchmarks/results/null-simulations.md measures the rates, and each check states its chance of failing
wrongly and of passing a test that notices nothing. The seeds are fixed before any run (:func:`counts`).
The power step after each verdict is skipped
(:func:`~tests.null_simulations.without_power_step`): it never makes or unmakes a violation.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy import stats

from dpverify.canaries.worlds import world_names
from tests.doubles import NumpyDPSGD
from tests.null_simulations import (
    DEFICIT,
    LEVEL,
    SIMULATIONS,
    DiracDPSGD,
    clopper_pearson,
    one_run_audit,
    without_power_step,
)
from tests.updates import dirac_request, observed

CONFIDENCE = 1 - LEVEL
#: The null checks' one-sided confidence: a correct level fails them with probability ≤ 0.001.
NULL_CHECK = 0.999


def refuted_count(name: str, *, deficit: float, audits: int, first_seed: int) -> int:
    with without_power_step():
        return sum(SIMULATIONS[name](deficit=deficit, seed=first_seed + i, confidence=CONFIDENCE) for i in range(audits))


def assert_level_holds(refuted: int, audits: int) -> None:
    low, _ = clopper_pearson(refuted, audits, confidence=2 * NULL_CHECK - 1)
    assert low <= LEVEL, f"{refuted} of {audits} audits of the exact claim refuted: the rate is above {LEVEL} (lower end {low:.3f})"


def assert_notices(refuted: int, audits: int, *, at_least: int) -> None:
    assert refuted >= at_least, f"only {refuted} of {audits} audits refuted a claimed curve {DEFICIT}× too strong (need {at_least})"


def chance_at_most(count: int, audits: int, rate: float) -> float:
    """P(Binomial(audits, rate) ≤ count): how a check's thresholds were sized (see each docstring)."""
    return float(stats.binom.cdf(count, audits, rate))


#: Audits of each simulation at the truth and at 1.25×. The five worlds share one test (the same claimed GDP
#: curve, read through each world's datasets, score and checks), so their counts are also pooled.
AUDITS: dict[str, int] = {"one_run": 5, "every_update": 5, **{f"two_world/{kind}": 6 for kind in world_names()}}
#: The least refuted count of each power check at 1.25×. Measured rates (benchmarks/results/null-simulations.md,
#: level 0.2): the one-run and every-update audits 16 of 16 (95 % interval from 0.79); each world about 0.6.
#: A check passes a test noticing at :data:`SIZED_FOR` with probability ≥ 0.95
#: (:func:`test_the_checks_are_sized_as_stated`).
AT_LEAST: dict[str, int] = {"one_run": 4, "every_update": 4, **{f"two_world/{kind}": 1 for kind in world_names()}}
SIZED_FOR: dict[str, float] = {"one_run": 0.95, "every_update": 0.95, **{f"two_world/{kind}": 0.5 for kind in world_names()}}
#: The pooled worlds' power check: at least 11 of their 30 audits at 1.25× (a test noticing at 0.5 fails it
#: with probability 0.05, one refuting at no more than the level 0.2 passes it with probability 0.026).
WORLDS_AT_LEAST = 11


def test_the_checks_are_sized_as_stated():
    for name, audits in AUDITS.items():
        assert chance_at_most(AT_LEAST[name] - 1, audits, SIZED_FOR[name]) <= 0.05, name
    # a test that refutes at no more than the level passes the one-run and every-update power checks with
    # probability ≤ 0.007; each world's alone with 0.74 (their pooled check is the sharp one)
    for name in ("one_run", "every_update"):
        assert 1 - chance_at_most(AT_LEAST[name] - 1, AUDITS[name], LEVEL) <= 0.007
    worlds = sum(AUDITS[f"two_world/{kind}"] for kind in world_names())
    assert chance_at_most(WORLDS_AT_LEAST - 1, worlds, 0.5) <= 0.05
    assert 1 - chance_at_most(WORLDS_AT_LEAST - 1, worlds, LEVEL) <= 0.026
    # every audit of the exact claim refuted fails each null check, and half of the worlds' pooled audits do
    for audits in AUDITS.values():
        assert clopper_pearson(audits, audits, confidence=2 * NULL_CHECK - 1)[0] > LEVEL
    assert clopper_pearson(worlds // 2, worlds, confidence=2 * NULL_CHECK - 1)[0] > LEVEL


@functools.cache
def counts(name: str, deficit: float) -> int:
    """Refuted audits of simulation ``name`` at ``deficit``, once per session: seeds 10 000·i + 0, 1, … at
    the truth and 10 000·i + 1000, … at 1.25× for the i-th simulation (the worlds' draws independent, so
    that their counts pool)."""
    first = 10_000 * list(SIMULATIONS).index(name) + (0 if deficit == 1.0 else 1000)
    return refuted_count(name, deficit=deficit, audits=AUDITS[name], first_seed=first)


def _null_and_power(name: str) -> None:
    assert_level_holds(counts(name, 1.0), AUDITS[name])
    assert_notices(counts(name, DEFICIT), AUDITS[name], at_least=AT_LEAST[name])


@pytest.mark.parametrize("kind", list(world_names()))
def test_two_world_audit_holds_its_level_and_notices_a_curve_too_strong(kind):
    """Every world through :func:`~dpverify.audits.two_world.run_two_world_audit` (its looks, its score
    read from the final model or from every handed-over update, both tests)."""
    _null_and_power(f"two_world/{kind}")


def test_the_worlds_pooled_hold_the_level_and_notice_a_curve_too_strong():
    names = [f"two_world/{kind}" for kind in world_names()]
    audits = sum(AUDITS[name] for name in names)
    assert_level_holds(sum(counts(name, 1.0) for name in names), audits)
    assert_notices(sum(counts(name, DEFICIT) for name in names), audits, at_least=WORLDS_AT_LEAST)


@pytest.mark.slow
def test_one_run_audit_holds_its_level_and_notices_a_curve_too_strong():
    """The Dirac one-run audit through :func:`~dpverify.audits.run_audit` at 160 000 canaries (16 times the
    gate's: 40 000 refuted 0 of 8 at 1.25×); the curve test does the noticing."""
    _null_and_power("one_run")


@pytest.mark.slow
def test_the_one_run_curve_test_is_what_notices():
    """At 1.25× the curve test refutes and the (ε, δ) test does not: a curve test that always passed would
    leave the audit blind to it (the first audit of the power check, seed 1000, read again)."""
    with without_power_step():
        outcome = one_run_audit(deficit=DEFICIT, seed=1000, confidence=CONFIDENCE)
    assert outcome.curve_refuted and not outcome.epsilon_refuted


@pytest.mark.slow
def test_every_update_audit_holds_its_level_and_notices_a_curve_too_strong():
    """The every-update Dirac audit through :func:`~dpverify.audits.run_audit` (the updates read back by
    :class:`~dpverify.canaries.updates.DiracUpdates`, its looks) on DP-SGD handing over its updates, at
    q = 1 (at q = 0.5 and 160 000 canaries it does not notice 1.25×: benchmarks/results/null-simulations.md)."""
    _null_and_power("every_update")


def test_the_fast_dirac_trainer_is_dp_sgd():
    """Without noise and at q = 1, :class:`~tests.null_simulations.DiracDPSGD` hands over the parameters
    NumpyDPSGD's per-record DP-SGD does, step by step, and its black box is the last of them."""
    request = dirac_request(records=6, classes=3, sampling_rate=1.0, epochs=3)
    fast, fast_handed = observed(request)
    slow, slow_handed = observed(request)
    trained = DiracDPSGD().train(fast)
    NumpyDPSGD().train(slow)
    assert [step for step, _ in fast_handed] == [step for step, _ in slow_handed] == list(range(4))
    for (_, ours), (_, theirs) in zip(fast_handed, slow_handed):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    weight, bias = fast_handed[-1][1]
    logits = request.features @ weight.T + bias
    np.testing.assert_allclose(trained.predict_log_proba(request.features), logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
