"""ε lower bounds from held-in and held-out scores, guessing "member" above a threshold, at every threshold
of the scores' ROC hull: the estimators of a score-based auditor (as ``jax_privacy.auditing``'s
``CanaryScoreAuditor`` with its default ``Bonferroni()`` threshold strategy), built on :mod:`.bounds`.

Our audit guesses a declared grid of counts from both ends of the ranking (:class:`~.scoring.GuessRule`);
this module is the other design, kept to compare the two on the same scores and to reproduce the
published values of the score-based one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice
from dpverify.stats.bounds import clopper_pearson_epsilon, epsilon_lower_bound, fdp_epsilon_lower_bound

__all__ = ["FAMILIES", "METHODS", "RocHull", "ThresholdBound", "roc_hull", "threshold_epsilon_lower_bound"]

Method = Literal["steinke", "fdp", "clopper_pearson"]
METHODS: tuple[str, ...] = ("steinke", "fdp", "clopper_pearson")
Family = Literal["hull", "every_threshold"]
FAMILIES: tuple[str, ...] = ("hull", "every_threshold")


@dataclass(frozen=True)
class RocHull:
    """Thresholds t (guess "member" when score ≥ t) at the vertices of the ROC's concave hull, with the
    true and false positives there, of ``positives`` held-in and ``negatives`` held-out scores.

    A threshold strictly inside a hull segment is beaten by randomising between the segment's ends, so
    only the vertices are tested; the first vertex is the lowest score (everything guessed "member"), the
    last +∞ (nothing guessed)."""

    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    positives: int
    negatives: int


@dataclass(frozen=True)
class ThresholdBound:
    """The largest bound over the hull's thresholds and the threshold that gave it; each threshold is
    bounded at ``per_threshold_confidence`` = ``1 − (1 − confidence)/tests`` (Bonferroni over ``tests``)."""

    epsilon: float
    threshold: float
    tests: int
    per_threshold_confidence: float


def roc_hull(in_scores, out_scores) -> RocHull:
    """The vertices of the ROC hull of ``in_scores`` (held in) against ``out_scores`` (held out).

    Candidate thresholds are the distinct scores and +∞. Walking them from +∞ down, the ROC point
    (false positives, true positives) moves up and right; a monotone chain keeps the points where the
    path turns strictly clockwise, the upper concave hull (collinear points are dropped)."""
    positives_scores = _scores("in_scores", in_scores)
    negatives_scores = _scores("out_scores", out_scores)
    thresholds = np.concatenate([np.union1d(positives_scores, negatives_scores), [np.inf]])[::-1]
    tp = positives_scores.size - np.searchsorted(np.sort(positives_scores), thresholds, side="left")
    fp = negatives_scores.size - np.searchsorted(np.sort(negatives_scores), thresholds, side="left")
    kept: list[int] = []
    for k in range(thresholds.size):
        while len(kept) >= 2 and _turn(kept[-2], kept[-1], k, fp, tp) >= 0:
            kept.pop()
        kept.append(k)
    order = np.array(kept[::-1])  # increasing threshold, as scores are read
    return RocHull(thresholds[order], tp[order], fp[order], positives_scores.size, negatives_scores.size)


def threshold_epsilon_lower_bound(
    in_scores, out_scores, *, method: Method, delta: float, confidence: float = 0.95, family: Family = "hull"
) -> ThresholdBound:
    r"""The largest ε that the guesses "member above t" refute, over the thresholds t of :func:`roc_hull`.

    At a threshold with TP true and FP false positives of P held-in and N held-out scores:

    * ``"steinke"``: :func:`~.bounds.epsilon_lower_bound` of m = P + N canaries, r = TP + FP guesses,
      v = TP correct (Steinke, Nasr & Jagielski 2023, Theorem 1);
    * ``"fdp"``: :func:`~.bounds.fdp_epsilon_lower_bound` of the same counts, the ε of the largest
      refuted μ-GDP curve (Mahloujifar, Melis & Chaudhuri 2024); a bound on ε only for mechanisms with
      a Gaussian trade-off curve;
    * ``"clopper_pearson"``: :func:`~.bounds.clopper_pearson_epsilon` of FP of N and P − TP of P, both
      directions (Nasr et al. 2021). Its rates are of independent trials, as from separate training
      runs; the canaries of one run are not that, so on one run's scores it is not a proven bound.

    Each at confidence :math:`1 - (1 - \text{confidence})/K`; the maximum is returned with its threshold
    (the lowest such threshold on ties). ``family`` says what K counts:

    * ``"hull"``: the K hull vertices, as ``jax_privacy.auditing``'s ``Bonferroni()`` does. The hull is
      drawn with the membership labels, so the family is chosen after seeing the outcome and the
      correction is not a proof: the maximum may exceed the true ε more often than 1 − confidence;
    * ``"every_threshold"``: K = m + 1, every "top r scores" rule (r = 0 … m), a family fixed before the
      scores, of which the hull is a subset. Sound: each rule's guesses depend on the scores only.
    """
    check_choice("method", method, METHODS)
    check_choice("family", family, FAMILIES)
    hull = roc_hull(in_scores, out_scores)
    tests = hull.thresholds.size if family == "hull" else hull.positives + hull.negatives + 1
    per_threshold = 1.0 - (1.0 - confidence) / tests
    m = hull.positives + hull.negatives
    if method == "clopper_pearson":
        bounds = clopper_pearson_epsilon(
            hull.false_positives,
            hull.positives - hull.true_positives,
            hull.negatives,
            hull.positives,
            delta=delta,
            confidence=per_threshold,
        )
    else:
        estimator = epsilon_lower_bound if method == "steinke" else fdp_epsilon_lower_bound
        guesses = hull.true_positives + hull.false_positives
        bounds = estimator(m, guesses, hull.true_positives, delta=delta, confidence=per_threshold)
    bounds = np.atleast_1d(bounds)
    best = int(np.argmax(bounds))
    return ThresholdBound(float(bounds[best]), float(hull.thresholds[best]), tests, per_threshold)


def _turn(i: int, j: int, k: int, x: np.ndarray, y: np.ndarray) -> int:
    """Cross product of (j − i) and (k − i): > 0 for a left turn i → j → k, 0 when collinear."""
    return int((x[j] - x[i]) * (y[k] - y[i]) - (y[j] - y[i]) * (x[k] - x[i]))


def _scores(name: str, values) -> np.ndarray:
    scores = np.asarray(values, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d array of scores, got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"{name} must be finite, got NaN or infinite values")
    return scores
