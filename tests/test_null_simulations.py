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
wrongly and of passing a test that notices nothing. The seeds are 0, 1, … (null) and 1000, 1001, …
(power), fixed before any run. The power step after each verdict is skipped
(:func:`~tests.null_simulations.without_power_step`): it never makes or unmakes a violation.
"""

from __future__ import annotations

import pytest
from scipy import stats

from dpverify.canaries.worlds import WORLD_MAKERS
from tests.null_simulations import (
    DEFICIT,
    LEVEL,
    SIMULATIONS,
    clopper_pearson,
    one_run_audit,
    without_power_step,
)

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


#: (audits, least refuted) of each power check: the least count is passed by a test noticing at the measured
#: rate with probability ≥ 0.97 (:func:`test_the_power_checks_are_sized_as_stated`), and by one refuting at
#: no more than the level with probability ≤ 0.03.
POWER_CHECKS: dict[str, tuple[int, int]] = {
    "one_run": (4, 3),
    "every_update": (4, 3),
    **{f"two_world/{kind}": (10, 5) for kind in WORLD_MAKERS},
}
#: The rate each power check was sized for: at most the lower end of the 95 % interval measured at 1.25×
#: (benchmarks/results/null-simulations.md).
MEASURED_POWER: dict[str, float] = {
    "one_run": 0.95,
    "every_update": 0.95,
    **{f"two_world/{kind}": 0.8 if kind == "fixed_batch" else 0.55 for kind in WORLD_MAKERS},
}
#: Audits of each null check: enough that every audit refuted fails it (the lower end of n of n is above the level).
NULL_AUDITS: dict[str, int] = {"one_run": 5, "every_update": 5, **{f"two_world/{kind}": 10 for kind in WORLD_MAKERS}}


@pytest.mark.parametrize("name", list(SIMULATIONS))
def test_the_power_checks_are_sized_as_stated(name):
    audits, at_least = POWER_CHECKS[name]
    assert chance_at_most(at_least - 1, audits, MEASURED_POWER[name]) <= 0.05
    assert 1 - chance_at_most(at_least - 1, audits, LEVEL) <= 0.03
    null = NULL_AUDITS[name]
    assert clopper_pearson(null, null, confidence=2 * NULL_CHECK - 1)[0] > LEVEL  # all refuted fails the null check


def _null_and_power(name: str) -> None:
    null = NULL_AUDITS[name]
    assert_level_holds(refuted_count(name, deficit=1.0, audits=null, first_seed=0), null)
    audits, at_least = POWER_CHECKS[name]
    assert_notices(refuted_count(name, deficit=DEFICIT, audits=audits, first_seed=1000), audits, at_least=at_least)


@pytest.mark.parametrize("kind", list(WORLD_MAKERS))
def test_two_world_audit_holds_its_level_and_notices_a_curve_too_strong(kind):
    """Every world through :func:`~dpverify.audits.two_world.run_two_world_audit` (its looks, its score
    read from the final model or from every handed-over update, both tests)."""
    _null_and_power(f"two_world/{kind}")


@pytest.mark.slow
def test_one_run_audit_holds_its_level_and_notices_a_curve_too_strong():
    """The Dirac one-run audit through :func:`~dpverify.audits.run_audit` at 160 000 canaries (16 times the
    gate's: fewer do not notice 1.25×); the curve test does the noticing."""
    _null_and_power("one_run")


@pytest.mark.slow
def test_the_one_run_curve_test_is_what_notices():
    """Of the refutations at 1.25×, the curve test makes them: a curve test that always passed would leave
    the (ε, δ) test, which refutes none of them."""
    with without_power_step():
        outcome = one_run_audit(deficit=DEFICIT, seed=1000, confidence=CONFIDENCE)
    assert outcome.curve_refuted and not outcome.epsilon_refuted


@pytest.mark.slow
def test_every_update_audit_holds_its_level_and_notices_a_curve_too_strong():
    """The every-update Dirac audit through :func:`~dpverify.audits.run_audit` (the updates read back by
    :class:`~dpverify.canaries.updates.DiracUpdates`, its looks) on DP-SGD at q = 0.5."""
    _null_and_power("every_update")
