import numpy as np
import pytest

from dpverify.stats.scoring import (
    GuessRule,
    count_correct,
    guesses_from_scores,
    loss_scores,
    self_comparison_scores,
)


def test_self_comparison_is_the_log_probability_gap():
    log_probs = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
    scores = self_comparison_scores(log_probs, np.array([0, 2]), np.array([1, 0]))
    np.testing.assert_allclose(scores, [np.log(0.7 / 0.2), np.log(0.8 / 0.1)])
    np.testing.assert_allclose(loss_scores(log_probs, np.array([0, 2])), np.log([0.7, 0.8]))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_log_probs_are_rejected(bad):
    log_probs = np.zeros((2, 3))
    log_probs[1, 2] = bad
    with pytest.raises(ValueError, match="log_probs must be finite.*1 of 2 rows"):
        self_comparison_scores(log_probs, np.array([0, 1]), np.array([1, 2]))


def test_wrong_shape_is_rejected():
    with pytest.raises(ValueError, match=r"log_probs must have shape \(3, C\), got \(2, 3\)"):
        loss_scores(np.zeros((2, 3)), np.array([0, 1, 2]))


def test_two_sided_guesses_take_both_ends_of_the_ranking():
    scores = np.array([0.1, -5.0, 3.0, -0.2, 0.0])
    np.testing.assert_array_equal(guesses_from_scores(scores, 2), [0, -1, 1, 0, 0])
    np.testing.assert_array_equal(guesses_from_scores(scores, 3), [1, -1, 1, 0, 0])
    np.testing.assert_array_equal(guesses_from_scores(scores, 5), [1, -1, 1, -1, 1])
    np.testing.assert_array_equal(guesses_from_scores(scores, 2, sides="one"), [1, 0, 1, 0, 0])
    np.testing.assert_array_equal(guesses_from_scores(scores, 0), [0, 0, 0, 0, 0])


def test_count_correct_counts_only_right_nonzero_guesses():
    guesses = np.array([1, -1, 1, 0, -1])
    membership = np.array([1, -1, -1, 1, 1])
    assert count_correct(guesses, membership) == 2


def test_guesses_reject_bad_counts_and_scores():
    with pytest.raises(ValueError, match=r"count must be in \[0, 3\], got 4"):
        guesses_from_scores(np.zeros(3), 4)
    with pytest.raises(ValueError, match="scores must be finite"):
        guesses_from_scores(np.array([0.0, np.nan]), 1)


def test_guess_rule_counts_and_bonferroni():
    rule = GuessRule(fractions=(0.01, 0.1, 1.0))
    np.testing.assert_array_equal(rule.counts(1000), [10, 100, 1000])
    assert rule.corrected_confidence(0.95) == pytest.approx(1 - 0.05 / 3)
    fixed = GuessRule(count=50)
    np.testing.assert_array_equal(fixed.counts(20), [20])
    assert fixed.corrected_confidence(0.95) == 0.95
    with pytest.raises(ValueError, match=r"fractions must be in \(0, 1\], got 1.5"):
        GuessRule(fractions=(1.5,))
    with pytest.raises(ValueError, match="fractions must name at least one"):
        GuessRule(fractions=())


def test_null_scores_give_correct_guesses_like_a_fair_coin():
    """Scores independent of the bits: correct guesses are Binomial(k, 1/2).

    Two-sided binomial test at level 1e-4 on 20 000 guesses: fails by chance with probability 1e-4.
    """
    from scipy import stats

    rng = np.random.default_rng(12)
    scores = rng.standard_normal(40_000)
    membership = rng.choice([-1, 1], size=40_000)
    correct = count_correct(guesses_from_scores(scores, 20_000), membership)
    assert stats.binomtest(correct, 20_000, 0.5).pvalue > 1e-4
