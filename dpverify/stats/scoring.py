"""Scores and guesses: the black-box membership inference of the audit (UniAud, Algorithm 2).

The *self-comparison* score of canary i is ``log p(y_i | x_i) − log p(y'_i | x_i)``: the loss of the
comparison label minus the loss of the trained label. Because (y_i, y'_i) is exchangeable before training,
the score is symmetric around 0 for a canary the model never saw, whatever the canary's hardness; the
plain *loss* score ``log p(y_i | x_i)`` of Steinke et al. is kept for baselines.

Guesses are +1/−1/0 (member, non-member, abstain). The number of guesses is never chosen by looking at
how many were correct: it is fixed, or every count of a grid declared in advance is tried and the
confidence of each is corrected for the grid's size (Bonferroni), see :class:`GuessRule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice, check_int, check_real

ScoreKind = Literal["self_comparison", "mean_comparison", "loss"]
Sides = Literal["two", "one"]
SCORE_KINDS: tuple[str, ...] = ("self_comparison", "mean_comparison", "loss")


def _checked_log_probs(log_probs: np.ndarray, n: int) -> np.ndarray:
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if log_probs.ndim != 2 or log_probs.shape[0] != n:
        raise ValueError(f"log_probs must have shape ({n}, C), got {log_probs.shape}")
    if not np.all(np.isfinite(log_probs)):
        bad = int(np.count_nonzero(~np.isfinite(log_probs).all(axis=1)))
        raise ValueError(f"log_probs must be finite, got NaN or infinite values in {bad} of {n} rows")
    return log_probs


def self_comparison_scores(log_probs: np.ndarray, labels: np.ndarray, comparison_labels: np.ndarray) -> np.ndarray:
    """``log p(label) − log p(comparison label)`` per row; > 0 where the model prefers the trained label.

    With (m, H) labels (UniAud++'s multi-bit tags) the score sums the H comparisons of a row."""
    log_probs = _checked_log_probs(log_probs, labels.shape[0])
    if labels.ndim == 1:
        rows = np.arange(labels.shape[0])
        return log_probs[rows, labels] - log_probs[rows, comparison_labels]
    picked = np.take_along_axis(log_probs, labels, axis=1) - np.take_along_axis(log_probs, comparison_labels, axis=1)
    return picked.sum(axis=1)


def mean_comparison_scores(log_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``log p(label) − mean of log p(c) over the other C − 1 classes``: self-comparison against every
    fresh label at once. Averaging C − 1 comparison labels removes most of the comparison label's own noise
    (variance 1 + 1/(C−1) instead of 2 in units of one logit's noise), which is what the inclusion design
    needs; the pair design must compare with its one fresh label, the one exchangeable with the trained one."""
    log_probs = _checked_log_probs(log_probs, labels.shape[0])
    rows = np.arange(labels.shape[0])
    trained = log_probs[rows, labels]
    return trained - (log_probs.sum(axis=1) - trained) / (log_probs.shape[1] - 1)


def loss_scores(log_probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Negative cross-entropy ``log p(label)`` per row (Steinke, Nasr & Jagielski 2023)."""
    log_probs = _checked_log_probs(log_probs, labels.shape[0])
    return log_probs[np.arange(labels.shape[0]), labels]


def guesses_from_scores(scores: np.ndarray, count: int, *, sides: Sides = "two") -> np.ndarray:
    """Guess on ``count`` canaries at the ends of the score ranking and abstain on the rest.

    ``sides="two"`` (Algorithm 2, line 8): +1 for the ⌈count/2⌉ highest scores and −1 for the ⌊count/2⌋
    lowest. With the self-comparison score members sit high (they prefer their trained label) and canaries
    shown with the fresh label or never trained on sit low or near 0, so both ends carry information.
    ``sides="one"``: +1 for the ``count`` highest. Ties are broken by position, never by the truth.
    """
    scores = np.asarray(scores, dtype=np.float64)
    check_int("count", count, low=0, high=scores.shape[0])
    check_choice("sides", sides, ("two", "one"))
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite, got NaN or infinite values")
    guesses = np.zeros(scores.shape[0], dtype=np.int8)
    order = np.argsort(-scores, kind="stable")
    positives = count if sides == "one" else (count + 1) // 2
    guesses[order[:positives]] = 1
    negatives = count - positives
    if negatives:
        guesses[order[-negatives:]] = -1
    return guesses


def count_correct(guesses: np.ndarray, membership: np.ndarray) -> int:
    """Σ max(0, guess·S): a guess is correct when it names the canary's secret bit S ∈ {−1, +1}."""
    return int(np.count_nonzero(guesses * membership > 0))


def correct_counts(scores: np.ndarray, membership: np.ndarray, counts, *, sides: Sides = "two") -> np.ndarray:
    """Correct guesses at each of ``counts``, guessing from ``scores`` against the secret bits ``membership``."""
    return np.array([count_correct(guesses_from_scores(scores, int(k), sides=sides), membership) for k in counts])


@dataclass(frozen=True, kw_only=True)
class GuessRule:
    """How many guesses an audit makes, declared before any score is seen.

    Either a fixed ``count``, or ``fractions`` of m: every count ``round(f·m)`` is evaluated and the
    audit reports the best ε_L, each computed at confidence ``1 − (1 − confidence)/len(fractions)``
    (Bonferroni), so the reported maximum keeps the stated confidence.
    """

    fractions: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    count: int | None = None
    sides: Sides = "two"

    def __post_init__(self) -> None:
        check_choice("sides", self.sides, ("two", "one"))
        if self.count is not None:
            check_int("count", self.count, low=1)
            return
        if not self.fractions:
            raise ValueError("fractions must name at least one fraction of m, got ()")
        for f in self.fractions:
            check_real("fractions", f, low=0.0, high=1.0, low_open=True)

    def counts(self, m: int) -> np.ndarray:
        """The distinct guess counts for m canaries (a fixed count is capped at m)."""
        return np.unique(self.run_counts([m])[0])

    def run_counts(self, sizes) -> np.ndarray:
        """Each run's guess counts, one row per run of ``sizes`` canaries and one column per try: the same
        fractions of every run (a fixed count as its share of all the runs' canaries), between 1 and the
        run's size. Columns may repeat; the Bonferroni correction counts them all."""
        sizes = np.asarray(sizes, dtype=int)
        fractions = np.array([self.count / sizes.sum()] if self.count is not None else self.fractions)
        return np.clip(np.round(fractions[None, :] * sizes[:, None]).astype(int), 1, sizes[:, None])

    @property
    def tries(self) -> int:
        """How many counts the Bonferroni correction divides the level by (fixed before seeing m)."""
        return 1 if self.count is not None else len(self.fractions)

    def corrected_confidence(self, confidence: float) -> float:
        return 1.0 - (1.0 - confidence) / self.tries


def subsampled_gaussian_log_likelihood_ratio(
    signal: np.ndarray, projection: np.ndarray, *, noise_multiplier: float, sampling_rate: float
) -> np.ndarray:
    r"""Per canary (rows), the log-likelihood ratio of "member" against "non-member" from every step
    (columns) of a Poisson-subsampled Gaussian mechanism:

    .. math::

        \Lambda = \sum_t \log\big(1 - q + q\, e^{(c_t s_t - c_t^2/2)/\sigma^2}\big),

    where ``projection`` s_t is the step's released noisy sum projected on the canary's clipped gradient
    direction, in clip norms, and ``signal`` c_t that gradient's norm in clip norms (known before the
    step). A member enters each step with probability q, so s_t ~ (1 − q)·N(0, σ²) + q·N(c_t, σ²); a
    non-member's s_t ~ N(0, σ²). By Neyman–Pearson, Λ is the most powerful score against the claimed
    mechanism; any score keeps the audit sound, so a wrong σ or q here costs power only. σ = 0: the
    linear statistic Σ c_t s_t (no noise, no privacy to weigh)."""
    signal, projection = np.asarray(signal, dtype=np.float64), np.asarray(projection, dtype=np.float64)
    if signal.shape != projection.shape:
        raise ValueError(f"signal and projection must have one shape, got {signal.shape} and {projection.shape}")
    check_real("noise_multiplier", noise_multiplier, low=0.0)
    check_real("sampling_rate", sampling_rate, low=0.0, high=1.0, low_open=True)
    if noise_multiplier == 0:
        return np.sum(signal * projection, axis=-1)
    exponent = (signal * projection - signal**2 / 2) / noise_multiplier**2
    if sampling_rate == 1:
        return np.sum(exponent, axis=-1)
    return np.sum(np.logaddexp(np.log1p(-sampling_rate), np.log(sampling_rate) + exponent), axis=-1)
