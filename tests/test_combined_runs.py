"""Tests of the curve test over independent pooled runs (dpverify.stats.curves.combined_curve_test):
its null simulations, under independent and under shared privacy loss, and its power."""

from __future__ import annotations

import numpy as np
import pytest

from dpverify.stats import mmc
from dpverify.stats.bounds import _gdp_inverse
from dpverify.stats.curves import (
    _RUN_DECADES,
    ClaimedRun,
    combined_curve_test,
    combined_refutes,
    curve_refutes,
    curve_test,
    fisher_combination,
    run_decades,
)
from dpverify.stats.scoring import GuessRule
from tests.test_curves import (
    DELTA,
    LEVEL,
    SIMULATIONS,
    false_rejection_upper_limit,
    gaussian_scores,
    subsampled_scores,
    two_sided_correct,
)
from tests.test_order_statistics import shared_loss_scores

RUNS, PER_RUN = 4, 250  # the M = 1000 canaries of test_curves' simulations, in 4 independent runs
RULE = GuessRule()


def test_run_counts_take_the_same_fractions_of_every_run():
    assert RULE.run_counts([250, 251]).tolist() == [[2, 5, 12, 25, 50, 125, 250], [3, 5, 13, 25, 50, 126, 251]]
    assert RULE.run_counts([3]).tolist() == [[1, 1, 1, 1, 1, 2, 3]]  # at least one guess; columns may repeat
    assert GuessRule(count=100).run_counts([300, 100]).tolist() == [[75], [25]]


def simulate_runs(draw_scores, seed: int, *, runs=RUNS, per_run=PER_RUN, audits=SIMULATIONS) -> tuple[np.ndarray, np.ndarray]:
    """Correct counts (audits × runs × grid) of two-sided guesses on each run's own ``per_run`` canaries."""
    rng = np.random.default_rng(seed)
    counts = RULE.run_counts([per_run])[0]
    rows, chunk = audits * runs, max(1, 10**6 // per_run)
    chunks = []
    for start in range(0, rows, chunk):
        members = rng.random((min(chunk, rows - start), per_run)) < 0.5
        chunks.append(two_sided_correct(draw_scores(rng, members), members, counts))
    return counts, np.concatenate(chunks).reshape(audits, runs, counts.size)


def combined_rejections(claim: ClaimedRun, counts: np.ndarray, correct: np.ndarray) -> int:
    """Audits whose combined p-value is at most the level split over the grid, for any count. Each run's
    bound depends on (count, correct) alone, so it is computed once per distinct pair and looked up."""
    per_run = int(counts.max())
    possible = np.minimum(np.arange(per_run + 1)[None, :], counts[:, None])  # correct <= count: pairs repeat
    pairs = np.stack(np.broadcast_arrays(counts[:, None], possible)).reshape(2, -1)
    pairs, where = np.unique(pairs, axis=1, return_inverse=True)
    table = run_decades(per_run, *pairs, claim.curve().inverse_complement)[where.ravel()].reshape(possible.shape)
    decades = table[np.arange(counts.size), correct].sum(axis=1)  # (audits, grid)
    p_values = fisher_combination(decades, runs=correct.shape[1])
    return int(np.sum(np.any(p_values <= LEVEL / RULE.tries, axis=1)))


@pytest.mark.parametrize(
    "claim, draw_scores, seed",
    [
        pytest.param(ClaimedRun(noise_multiplier=2.0, steps=1), gaussian_scores(0.5), 31, id="independent-mu0.5"),
        pytest.param(ClaimedRun(noise_multiplier=1.0, steps=1), gaussian_scores(1.0), 32, id="independent-mu1"),
        pytest.param(ClaimedRun(noise_multiplier=2.0, steps=1), shared_loss_scores(0.5), 33, id="shared-loss-mu0.5"),
        pytest.param(ClaimedRun(noise_multiplier=1.0, steps=1), shared_loss_scores(1.0), 34, id="shared-loss-mu1"),
        pytest.param(
            ClaimedRun(noise_multiplier=2.0, sampling_rate=0.5, steps=2), subsampled_scores(2.0, 0.5, 2), 37, id="subsampled"
        ),
    ],
)
def test_null_simulation_refutes_at_most_the_level(claim, draw_scores, seed):
    """10 000 audits of 4 runs that are each exactly the claim: canaries independent, or (shared loss) each
    run's canaries sharing one privacy-loss level, which a DP claim allows and which breaks any test that
    assumes independence within a run. The Clopper–Pearson 99.9 % upper limit on the rate stays at most 5 %."""
    counts, correct = simulate_runs(draw_scores, seed)
    assert false_rejection_upper_limit(combined_rejections(claim, counts, correct)) <= LEVEL


def test_run_decades_are_the_largest_rejected_grid_point():
    """The bisection on the grid gives what testing every grid point gives: the largest x whose τ = 10^(−x) the
    recursion rejects (0 when none), over counts from nothing right to every guess right, and curves from
    hopeless to unrefutable (μ 0.05 to 8)."""
    rng = np.random.default_rng(5)
    m = 2500.0
    guesses = rng.integers(1, 2501, size=3000).astype(float)
    correct = np.floor(guesses * rng.uniform(0.4, 1.0, size=guesses.size))
    mu = rng.choice([0.05, 0.5, 1.0, 2.0, 8.0], size=guesses.size)
    every_point = mmc.rejected(m, guesses[:, None], correct[:, None], 10.0**-_RUN_DECADES, _gdp_inverse, mu[:, None])
    every_point = every_point.reshape(guesses.size, _RUN_DECADES.size)
    expected = np.max(np.where(every_point, _RUN_DECADES, 0.0), axis=1)
    assert 0.0 < np.mean(expected == 0.0) < 0.9 and np.any(expected == _RUN_DECADES[-1])  # the extremes occur
    np.testing.assert_array_equal(run_decades(m, guesses, correct, _gdp_inverse, mu), expected)


def test_combining_runs_catches_a_deficit_that_one_pooled_recursion_misses():
    """The quick profile's shape, 8 runs of 2500 canaries, at claimed μ 0.27 (ε 1) with the noise divided
    by 1.5: the runs' combination refutes far more often than one recursion over all 20 000 canaries,
    which must allow them all to share their privacy loss (200 simulated audits)."""
    claim = ClaimedRun(noise_multiplier=1 / 0.27, steps=1)
    counts, correct = simulate_runs(gaussian_scores(1.5 * 0.27), seed=35, runs=8, per_run=2500, audits=200)
    combined = combined_rejections(claim, counts, correct) / correct.shape[0]
    confidence = RULE.corrected_confidence(1 - LEVEL)
    # One recursion for all the audits at once (curve_refutes broadcasts), so both rates are over the same 200.
    refuted = curve_refutes(8 * 2500, 8 * counts, correct.sum(axis=1), curve=claim.curve(), confidence=confidence)
    pooled = np.mean(np.any(refuted, axis=1))
    assert combined > 0.5 and combined > pooled + 0.3, (combined, pooled)


def test_outcome_agrees_with_itself_and_one_run_is_never_bolder_than_curve_test():
    claim = ClaimedRun(noise_multiplier=2.0, steps=1)
    rng = np.random.default_rng(36)
    counts = RULE.run_counts([PER_RUN] * RUNS)
    for mu in (0.5, 0.75, 1.0):
        members = rng.random((RUNS, PER_RUN)) < 0.5
        correct = np.stack([two_sided_correct(gaussian_scores(mu)(rng, m[None]), m[None], counts[0])[0] for m in members])
        result = combined_curve_test([PER_RUN] * RUNS, counts, correct, claim=claim, delta=DELTA)
        assert result.refuted == (result.epsilon >= result.claimed_epsilon) == (result.p_value <= 0.05)
        assert result.refutable and result.claimed_epsilon == pytest.approx(claim.epsilon(DELTA))
        decided = combined_refutes([PER_RUN] * RUNS, counts, correct, curve=claim.curve())
        assert decided.shape == (counts.shape[1],) and result.refuted == bool(np.any(decided))
        one = combined_curve_test([PER_RUN], counts[:1], correct[:1], claim=claim, delta=DELTA)
        exact = curve_test(PER_RUN, counts[0], correct[0], claim=claim, delta=DELTA)
        assert exact.refuted or not one.refuted  # a run's bound is rounded up to its grid
        assert one.p_value >= exact.p_value * 0.99


@pytest.mark.parametrize(
    "sizes, guesses, correct, message",
    [
        ([], [[1]], [[1]], "sizes must list each run's canaries"),
        ([10, 10], [[1, 2]], [[1, 1]], r"shape \(runs, counts\) = \(2, K\)"),
        ([10], [[11]], [[1]], r"guesses must be in \[0, m\]"),
        ([10], [[5]], [[6]], r"correct must be in \[0, guesses\]"),
    ],
)
def test_combined_counts_are_checked_at_the_door(sizes, guesses, correct, message):
    with pytest.raises(ValueError, match=message):
        combined_curve_test(sizes, guesses, correct, claim=ClaimedRun(noise_multiplier=1.0, steps=1), delta=DELTA)
