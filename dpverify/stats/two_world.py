"""The two-world (many-run) distinguishing test: an (ε, δ) lower bound and a trade-off-curve test.

A two-world audit trains R times on a dataset D and R times on a neighbour D′ and scores each trained
model with a statistic fixed in advance, higher meaning "D′" (Jagielski, Ullman & Oprea 2020; Nasr et al.
2021, 2023). A threshold t turns the scores into a test "D′ when score > t" with false-positive rate
FPR = P[score > t | D] and false-negative rate FNR = P[score ≤ t | D′]. Each training run is independent,
so the counts are binomial and Clopper–Pearson intervals bound the rates. Everything here needs numpy
and scipy only and takes the scores, never a model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import special

from dpverify._validation import check_choice, check_int, check_probability, check_real
from dpverify.stats.bounds import _clopper_pearson_upper, _gdp_epsilon, clopper_pearson_epsilon
from dpverify.stats.curves import GaussianCurve

__all__ = [
    "THRESHOLD_RULES",
    "TwoWorldBound",
    "curve_refutable",
    "gdp_curve",
    "runs_needed",
    "two_world_bound",
    "two_world_ceiling",
]

#: How the threshold is chosen: on a held-out half of the runs (default), or from a grid declared in advance.
THRESHOLD_RULES: tuple[str, ...] = ("split", "grid")

#: Largest number of runs per world :func:`runs_needed` considers.
MAX_RUNS = 10**7

TradeOffCurve = Callable[[np.ndarray], np.ndarray]


def gdp_curve(mu: float) -> TradeOffCurve:
    """The μ-GDP trade-off curve β(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2022), vectorised: the one-run
    curve test's :class:`~dpverify.stats.curves.GaussianCurve`."""
    return GaussianCurve(mu=mu)


@dataclass(frozen=True, kw_only=True)
class TwoWorldBound:
    r"""The outcome of both two-world tests on one pair of score samples.

    **(ε, δ) test.** For a threshold t with ``false_positives`` of ``negatives`` D-scores above t and
    ``false_negatives`` of ``positives`` D′-scores at or below it, let ᾱ, β̄ be one-sided Clopper–Pearson
    upper limits on FPR and FNR. Any (ε, δ)-DP mechanism has FPR + e^ε·FNR ≥ 1 − δ and the same with the
    rates swapped, so at the test's level

    .. math:: \varepsilon_L = \max\{\ln\tfrac{1-\delta-\bar\alpha}{\bar\beta},\;
              \ln\tfrac{1-\delta-\bar\beta}{\bar\alpha},\; 0\}

    (:func:`dpverify.stats.bounds.clopper_pearson_epsilon`, which spends half its level on each limit).

    **Curve test.** A claimed trade-off curve f (a lower bound on the trade-off between D and D′ in both
    orders) is refuted when the corrected point lies below it: β̄ < f(ᾱ) or ᾱ < f(β̄); since the true
    rates lie below (ᾱ, β̄) and f decreases, the true point is then below f too. ``gdp_mu_lower_bound``
    is the largest μ whose curve Φ(Φ⁻¹(1 − α) − μ) the same point refutes, μ_L = Φ⁻¹(1 − ᾱ) − Φ⁻¹(β̄),
    and ``gdp_epsilon_lower_bound`` its ε at ``delta`` (valid for mechanisms whose curve is Gaussian).

    **Level.** The two tests split 1 − ``confidence`` equally. ``threshold_rule`` "split" chooses each
    test's threshold and ``direction`` (+1: "D′ when score > threshold", −1: "D′ when score < threshold")
    on the first ``selection_runs`` runs of each world and counts on the rest (with scores of K candidate
    statistics a run, runs × K, it also chooses there which statistic each test counts on: ``statistic``,
    ``gdp_statistic``); "grid" (direction +1)
    counts on all runs at every threshold of a grid declared in advance, each at the test's level divided
    by the grid's size (Bonferroni), and keeps the best. ``*_ceiling`` are the largest values these run
    counts could ever give (perfect separation): a claim at or above them cannot be refuted.
    """

    threshold_rule: str
    confidence: float
    delta: float
    selection_runs: int
    direction: int
    threshold: float
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    epsilon_lower_bound: float
    gdp_direction: int
    gdp_threshold: float
    gdp_false_positives: int
    gdp_false_negatives: int
    gdp_mu_lower_bound: float
    gdp_epsilon_lower_bound: float
    curve_refuted: bool | None
    epsilon_ceiling: float
    gdp_mu_ceiling: float
    gdp_epsilon_ceiling: float
    statistic: int = 0
    gdp_statistic: int = 0

    @property
    def refutes(self) -> bool:
        """Whether the curve test refuted the claimed curve (False when none was given)."""
        return bool(self.curve_refuted)


def two_world_bound(
    scores_d,
    scores_dprime,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_rule: str = "split",
    thresholds: Sequence[float] | None = None,
    claimed_curve: TradeOffCurve | None = None,
) -> TwoWorldBound:
    """Both two-world tests on R scores from D and R′ from D′ (higher means D′); see :class:`TwoWorldBound`.

    ``threshold_rule="split"`` (the default, because a grid can only be declared in the score's units,
    which a new world rarely knows in advance, and because a split is free of Bonferroni's log(grid) cost)
    chooses each test's threshold on the first half of each world's runs (so the runs' order must not
    depend on their scores) and counts on the second half; it also chooses the direction there, since
    whether a bug raises or lowers the score in D′ (a larger or a smaller normaliser) is the bug's choice.
    ``"grid"`` needs ``thresholds`` declared before
    the scores were seen. ``claimed_curve`` (vectorised β(α)) adds the curve verdict; without it the curve
    test's threshold maximises μ_L.
    """
    delta, level = check_probability("delta", delta), 1.0 - check_probability("confidence", confidence)
    check_choice("threshold_rule", threshold_rule, THRESHOLD_RULES)
    d, dprime = _scores("scores_d", scores_d), _scores("scores_dprime", scores_dprime)
    if d.shape[1] != dprime.shape[1]:
        raise ValueError(f"scores_d and scores_dprime must hold the same statistics, got {d.shape[1]} and {dprime.shape[1]}")
    if threshold_rule == "grid" and d.shape[1] != 1:
        raise ValueError("threshold_rule='grid' tests one statistic; give 1-D scores or use the split")
    if threshold_rule == "grid":
        if thresholds is None or len(thresholds) == 0:
            raise ValueError("threshold_rule='grid' needs thresholds declared in advance, got none")
        grid = np.asarray(thresholds, dtype=float)
        if grid.ndim != 1 or not np.all(np.isfinite(grid)):
            raise ValueError(f"thresholds must be a 1-D sequence of finite numbers, got {thresholds!r}")
        selection, eval_d, eval_dprime, test_level = 0, d, dprime, level / 2 / grid.size
        eps_choice = curve_choice = (0, 1.0, grid)
    else:
        if thresholds is not None:
            raise ValueError("thresholds are declared for threshold_rule='grid' only; the split chooses its own")
        for name, scores in (("scores_d", d), ("scores_dprime", dprime)):
            if scores.shape[0] < 2:
                raise ValueError(f"{name} must hold >= 2 runs for threshold_rule='split', got {scores.shape[0]}")
        selection = min(d.shape[0], dprime.shape[0]) // 2
        eval_d, eval_dprime, test_level = d[selection:], dprime[selection:], level / 2
        eps_rows, curve_rows = [], []
        for column in range(d.shape[1]):
            for sign in (1.0, -1.0):
                select_d, select_dprime = sign * d[:selection, column], sign * dprime[:selection, column]
                pooled = np.unique(np.concatenate([select_d, select_dprime]))
                pooled = (pooled[:-1] + pooled[1:]) / 2 if pooled.size > 1 else pooled  # midpoints: margin both ways
                fp, fn = _errors(select_d, select_dprime, pooled)
                eps_sel = _epsilon(fp, fn, selection, selection, delta, test_level)
                curve_sel = _curve_margin(fp, fn, selection, selection, test_level, claimed_curve)
                eps_rows.append((eps_sel.max(), column, sign, pooled[[np.argmax(eps_sel)]]))
                curve_rows.append((curve_sel.max(), column, sign, pooled[[np.argmax(curve_sel)]]))
        eps_choice = max(eps_rows, key=lambda row: row[0])[1:]
        curve_choice = max(curve_rows, key=lambda row: row[0])[1:]
    n0, n1 = eval_d.shape[0], eval_dprime.shape[0]

    statistic, direction, candidates_eps = eps_choice
    fp, fn = _errors(direction * eval_d[:, statistic], direction * eval_dprime[:, statistic], candidates_eps)
    eps = _epsilon(fp, fn, n0, n1, delta, test_level)
    best = int(np.argmax(eps))
    gdp_statistic, gdp_direction, candidates_curve = curve_choice
    cfp, cfn = _errors(
        gdp_direction * eval_d[:, gdp_statistic], gdp_direction * eval_dprime[:, gdp_statistic], candidates_curve
    )
    margin = _curve_margin(cfp, cfn, n0, n1, test_level, claimed_curve)
    best_curve = int(np.argmax(margin))
    mu = _gdp_mu(cfp, cfn, n0, n1, test_level)
    mu_best = float(mu[best_curve]) if claimed_curve is not None else float(mu.max())
    refuted = None if claimed_curve is None else bool(np.any(margin > 0))
    eps_ceiling, mu_ceiling, gdp_eps_ceiling = _ceilings(n0, n1, delta, test_level)
    return TwoWorldBound(
        threshold_rule=threshold_rule,
        confidence=float(confidence),
        delta=delta,
        selection_runs=selection,
        statistic=int(statistic),
        gdp_statistic=int(gdp_statistic),
        direction=int(direction),
        threshold=float(direction * candidates_eps[best]),
        false_positives=int(fp[best]),
        negatives=n0,
        false_negatives=int(fn[best]),
        positives=n1,
        epsilon_lower_bound=float(eps[best]),
        gdp_direction=int(gdp_direction),
        gdp_threshold=float(gdp_direction * candidates_curve[best_curve]),
        gdp_false_positives=int(cfp[best_curve]),
        gdp_false_negatives=int(cfn[best_curve]),
        gdp_mu_lower_bound=mu_best,
        gdp_epsilon_lower_bound=float(_gdp_epsilon(np.asarray(mu_best), delta)),
        curve_refuted=refuted,
        epsilon_ceiling=eps_ceiling,
        gdp_mu_ceiling=mu_ceiling,
        gdp_epsilon_ceiling=gdp_eps_ceiling,
    )


def two_world_ceiling(
    runs: int, *, delta: float, confidence: float = 0.95, threshold_rule: str = "split", grid_size: int = 1
) -> tuple[float, float]:
    """``(ε ceiling, GDP μ ceiling)`` of an audit with ``runs`` runs per world, known before any training:
    the (ε, δ) bound and the GDP μ_L when the two worlds' scores separate perfectly."""
    n, test_level = _plan(runs, confidence, threshold_rule, grid_size)
    return _ceilings(n, n, check_probability("delta", delta), test_level)[:2]


def curve_refutable(
    curve: TradeOffCurve, runs: int, *, confidence: float = 0.95, threshold_rule: str = "split", grid_size: int = 1
) -> bool:
    """Whether ``runs`` runs per world could refute ``curve`` at all: does the corrected point of perfect
    separation, (ᾱ, β̄) with no error either way, lie below it? If not, the curve test is vacuous."""
    n, test_level = _plan(runs, confidence, threshold_rule, grid_size)
    best = _upper_rates(0, 0, n, n, test_level)[0]
    return bool(np.asarray(curve(best), dtype=float) > best)


def _plan(runs: int, confidence: float, threshold_rule: str, grid_size: int) -> tuple[int, float]:
    """(runs a side that are counted, each test's level) of an audit with ``runs`` runs per world."""
    runs = check_int("runs", runs, low=2)
    check_choice("threshold_rule", threshold_rule, THRESHOLD_RULES)
    grid_size = check_int("grid_size", grid_size, low=1)
    level = 1.0 - check_probability("confidence", confidence)
    n = runs - runs // 2 if threshold_rule == "split" else runs
    return n, level / 2 / (grid_size if threshold_rule == "grid" else 1)


def runs_needed(
    epsilon: float,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_rule: str = "split",
    grid_size: int = 1,
    mu: float | None = None,
) -> int | None:
    """Smallest runs per world whose ceiling exceeds the claimed ``epsilon`` (or, given, the claimed GDP
    ``mu``, whichever needs fewer); ``None`` when no count up to :data:`MAX_RUNS` does (δ caps the ε bound)."""
    epsilon = check_real("epsilon", epsilon, low=0.0, allow_inf=True)

    def enough(runs: int) -> bool:
        eps_c, mu_c = two_world_ceiling(
            runs, delta=delta, confidence=confidence, threshold_rule=threshold_rule, grid_size=grid_size
        )
        return eps_c > epsilon or (mu is not None and mu_c > mu)

    low, high = 1, 2
    while not enough(high):
        low, high = high, high * 2
        if high > MAX_RUNS:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


# -- counts and per-threshold statistics ---------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _ceilings(n0: int, n1: int, delta: float, level: float) -> tuple[float, float, float]:
    """(ε_L, μ_L, GDP ε_L) of perfect separation on n0 and n1 evaluated runs at the test's ``level``."""
    eps = float(clopper_pearson_epsilon(0, 0, n0, n1, delta=delta, confidence=1 - level))
    mu = float(_gdp_mu(np.zeros(1), np.zeros(1), n0, n1, level)[0])
    return eps, mu, float(_gdp_epsilon(np.asarray(mu), delta))


def _scores(name: str, scores) -> np.ndarray:
    """``scores`` as an (R, K) array: R runs, K candidate statistics (one for a 1-D array)."""
    array = np.asarray(scores, dtype=float)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.size < 1:
        raise ValueError(f"{name} must be a non-empty 1-D array of scores (or runs × statistics), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} holds NaN or infinite scores ({int(np.sum(~np.isfinite(array)))} of {array.size})")
    return array


def _errors(d: np.ndarray, dprime: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per threshold t: D-scores above t (false positives) and D′-scores at or below t (false negatives)."""
    fp = d.size - np.searchsorted(np.sort(d), thresholds, side="right")
    fn = np.searchsorted(np.sort(dprime), thresholds, side="right")
    return fp, fn


def _epsilon(fp, fn, n0: int, n1: int, delta: float, level: float) -> np.ndarray:
    return np.atleast_1d(clopper_pearson_epsilon(fp, fn, n0, n1, delta=delta, confidence=1 - level))


def _upper_rates(fp, fn, n0: int, n1: int, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Clopper–Pearson upper limits on FPR and FNR, each at half the test's level."""
    fp, fn = np.asarray(fp), np.asarray(fn)
    return _clopper_pearson_upper(fp, np.full(fp.shape, n0), level / 2), _clopper_pearson_upper(
        fn, np.full(fn.shape, n1), level / 2
    )


def _gdp_mu(fp, fn, n0: int, n1: int, level: float) -> np.ndarray:
    """μ_L = Φ⁻¹(1 − ᾱ) − Φ⁻¹(β̄), at least 0: the largest μ-GDP curve the corrected point lies below."""
    alpha, beta = _upper_rates(fp, fn, n0, n1, level)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = special.ndtri(1.0 - alpha) - special.ndtri(beta)
    return np.maximum(np.nan_to_num(mu, nan=0.0, neginf=0.0), 0.0)


def _curve_margin(fp, fn, n0: int, n1: int, level: float, curve: TradeOffCurve | None) -> np.ndarray:
    """How far the corrected point lies below ``curve`` in either order (> 0: refuted); μ_L without one."""
    if curve is None:
        return _gdp_mu(fp, fn, n0, n1, level)
    alpha, beta = _upper_rates(fp, fn, n0, n1, level)
    below = np.maximum(np.asarray(curve(alpha), dtype=float) - beta, np.asarray(curve(beta), dtype=float) - alpha)
    if not np.all(np.isfinite(below)):
        raise ValueError("claimed_curve returned NaN or infinite values on [0, 1]")
    return below

