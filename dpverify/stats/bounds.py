"""Empirical lower bounds on ε from the outcome of a membership-guessing audit.

An audit plants ``m`` canaries, makes ``guesses`` confident membership guesses (abstaining on the
rest) and observes how many of them are ``correct``. Each function here turns such counts into the
largest ε that the counts refute at the given confidence, so that a claimed (ε, δ) below the returned
value is refuted. Everything is vectorised over numpy arrays of counts (they broadcast) and needs only
numpy and scipy.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import special

from dpverify._validation import check_int, check_probability, check_real
from dpverify.stats import mmc

__all__ = [
    "clopper_pearson_epsilon",
    "epsilon_lower_bound",
    "fdp_epsilon_lower_bound",
    "optimal_epsilon",
    "required_canaries",
    "steinke_refutes",
]

#: Largest number of canaries ``required_canaries`` will consider.
MAX_CANARIES = 10**7
# Width to which ``_largest_rejected`` brackets the bound.
_TOLERANCE = 1e-7
# Gaussian-DP parameters searched by ``fdp_epsilon_lower_bound``: μ = 64 is ε in the thousands.
_MU_MAX = 64.0
# Grids of at least this many points are probed before they are tested (``_first_failures``).
_PROBED_GRID = 64


def epsilon_lower_bound(m, guesses, correct, *, delta, confidence=0.95):
    r"""Largest ε that a one-run audit refutes (Steinke, Nasr & Jagielski 2023, Theorem 1).

    If the training algorithm is (ε, δ)-DP, the number W of correct guesses among ``r = guesses``
    guesses on ``m`` canaries (each included independently with probability ½) satisfies, for every v,

    .. math::

        P[W \ge v] \le \beta + 2 m \delta \alpha, \qquad
        \beta = P[\check W \ge v], \qquad
        \alpha = \max_{1 \le i \le v} \tfrac{1}{i} P[v > \check W \ge v - i],

    with :math:`\check W \sim \mathrm{Binomial}(r, e^\varepsilon / (1 + e^\varepsilon))`. (The paper
    writes :math:`\alpha m \delta` with the 2 inside α; Steinke et al.'s appendix code and
    jax_privacy use :math:`2 m \delta \alpha` as here.) The right-hand side at ``v = correct`` is a
    p-value for the claim "(ε, δ)-DP"; it grows with ε, and the bound returned is

    .. math:: \varepsilon_L = \sup\{\varepsilon \ge 0 : p(\varepsilon) \le 1 - \text{confidence}\},

    or 0 when even ε = 0 is not rejected, to within 1e-6 (from below, so it stays sound). Because
    the binomial pmf is log-concave, the window average in α is unimodal in i and is found by a
    binary search, so one evaluation costs O(log v) and whole grids of guess counts are cheap.

    Parameters
    ----------
    m, guesses, correct : int or array of int
        Canaries, guesses made (abstentions excluded) and correct guesses;
        ``0 <= correct <= guesses <= m`` and ``m >= 1``. Arrays broadcast.
    delta : float
        The δ of the claim under test, in (0, 1).
    confidence : float
        Probability, in (0, 1), that the bound does not exceed the true ε.

    Returns
    -------
    float or numpy.ndarray
        ε_L, a float when every count is a scalar.
    """
    delta, level = _level(delta, confidence)
    m, r, v, shape = _counts(m, guesses, correct)
    return _shaped(_per_distinct(lambda *counts: _steinke_bound(*counts, delta, level), m, r, v), shape)


def steinke_refutes(m, guesses, correct, *, epsilon: float, delta, confidence=0.95) -> np.ndarray:
    """Per count, whether the counts refute "(``epsilon``, δ)-DP" at ``confidence``: the p-value of
    :func:`epsilon_lower_bound`'s Theorem 1 at ε = ``epsilon`` is at most the level. The decision without
    the search for ε_L (the p-value grows with ε, so this is ε_L ≥ ``epsilon``)."""
    delta, level = _level(delta, confidence)
    m, r, v, shape = _counts(m, guesses, correct)
    refuted = _steinke_p_value(*(a.astype(float) for a in (m, r, v)), float(epsilon), delta) <= level
    return bool(refuted[0]) if shape is None else refuted.reshape(shape)


def optimal_epsilon(m, *, delta, confidence=0.95) -> float:
    """The largest ε any attack can refute with ``m`` canaries: max over r of ε_L(m, r, r).

    With δ > 0 the term 2mδα caps what ``m`` canaries can show, so an audit of a claim at or above
    this value is vacuous: it cannot fail whatever the model does. The maximum over the number of
    (all correct) guesses r is found on a geometric grid refined around its best point, which is
    exact when ε_L(m, r, r) is unimodal in r, as it is for every m checked.
    """
    delta, level = _level(delta, confidence)
    m = check_int("m", m, low=1)
    lo, hi = 1, m
    while True:
        few = hi - lo < 64
        spread = np.geomspace(lo, hi, 64)
        candidates = np.arange(lo, hi + 1) if few else np.unique(np.round(spread).astype(int))
        values = _steinke_bound(np.full(candidates.shape, m), candidates, candidates, delta, level)
        best = int(np.argmax(values))
        if few:
            return float(values[best])
        lo, hi = int(candidates[max(best - 1, 0)]), int(candidates[min(best + 1, candidates.size - 1)])


def required_canaries(epsilon, *, delta, confidence=0.95) -> int:
    """The smallest m with ``optimal_epsilon(m) > epsilon``: how many canaries could refute the claim.

    ε_O(m) grows with m only up to a point: the 2mδ term of the bound grows too, and beyond roughly
    m ≈ 1/δ it wins and ε_O falls again. So the search doubles m until ε_O exceeds ``epsilon``
    (then bisects) and raises ``ValueError`` once ε_O turns down or m passes 10^7 first.
    """
    epsilon = check_real("epsilon", epsilon, low=0.0)
    delta = _level(delta, confidence)[0]

    def eps_o(m: int) -> float:
        return optimal_epsilon(m, delta=delta, confidence=confidence)

    previous, lo, hi = 0.0, 0, 1  # eps_o(lo) <= epsilon throughout (eps_o(0) taken as 0)
    while (value := eps_o(hi)) <= epsilon:
        if value < previous or hi >= MAX_CANARIES:
            raise ValueError(
                f"no number of canaries up to {MAX_CANARIES:.0e} can refute epsilon={epsilon:g} at "
                f"delta={delta:g}, confidence={confidence:g}: the best bound peaks near "
                f"{max(value, previous):.3f} because the 2*m*delta term grows with m"
            )
        previous, lo, hi = value, hi, min(2 * hi, MAX_CANARIES)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_o(mid) <= epsilon else (lo, mid)
    return hi


def clopper_pearson_epsilon(
    false_positives, false_negatives, negatives, positives, *, delta, confidence=0.95
):
    r"""ε lower bound of the many-run (O(T)) audit from error counts (Nasr et al. 2021; UniAud eq. 2).

    With :math:`\bar\alpha` and :math:`\bar\beta` one-sided Clopper–Pearson upper bounds on the
    false-positive rate (``false_positives`` of ``negatives`` trials) and the false-negative rate
    (``false_negatives`` of ``positives``), any (ε, δ)-DP mechanism satisfies
    :math:`1 - \delta - \bar\alpha \le e^\varepsilon \bar\beta` and the same with the rates swapped, so

    .. math::

        \varepsilon_L = \max\left\{\ln\frac{1 - \bar\alpha - \delta}{\bar\beta},\;
        \ln\frac{1 - \bar\beta - \delta}{\bar\alpha},\; 0\right\}.

    Both intervals must hold at once, so each is taken at level (1 − confidence)/2 (Bonferroni).
    It needs a fresh training run per trial; it is here to compare the one-run bounds against.
    Counts broadcast like those of :func:`epsilon_lower_bound`.
    """
    delta, level = _level(delta, confidence)
    negatives = _int_array("negatives", negatives, low=1)
    positives = _int_array("positives", positives, low=1)
    fp = _int_array("false_positives", false_positives, low=0, high=negatives, high_name="negatives")
    fn = _int_array("false_negatives", false_negatives, low=0, high=positives, high_name="positives")
    fp, fn, negatives, positives = np.broadcast_arrays(fp, fn, negatives, positives)
    fpr_hi = _clopper_pearson_upper(fp, negatives, level / 2)
    fnr_hi = _clopper_pearson_upper(fn, positives, level / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.maximum(np.log((1 - delta - fpr_hi) / fnr_hi), np.log((1 - delta - fnr_hi) / fpr_hi))
    eps = np.maximum(np.nan_to_num(eps, nan=0.0), 0.0)
    return float(eps) if eps.ndim == 0 else eps


def fdp_epsilon_lower_bound(m, guesses, correct, *, delta, confidence=0.95):
    r"""Largest ε whose Gaussian-DP trade-off curve the counts refute (Mahloujifar, Melis & Chaudhuri 2024).

    "Auditing f-differential privacy in one run" (arXiv 2410.22235) bounds the chance of ``correct``
    right answers among ``guesses`` guesses on ``m`` canaries under an f-DP mechanism through a
    recursion on the trade-off function f (:mod:`dpverify.stats.mmc`), at τ = 1 − confidence and
    with :math:`\bar f^{-1}(x) = \Phi(\Phi^{-1}(x) - \mu)` for μ-Gaussian DP. Rejection gets harder
    as μ grows; the largest rejected μ is found by a bracketing search and reported as the ε for
    which μ-GDP is (ε, ``delta``)-DP, i.e. :math:`\Phi(-\varepsilon/\mu + \mu/2) - e^\varepsilon
    \Phi(-\varepsilon/\mu - \mu/2) = \delta`.

    Assumptions, which differ from :func:`epsilon_lower_bound`:

    * the mechanism's privacy is a *Gaussian* trade-off curve: what is refuted is "μ-GDP", a stronger
      claim than (ε, δ)-DP, so the result lower-bounds ε only for mechanisms whose trade-off curve is
      (close to) Gaussian, as the noisy-gradient steps of DP-SGD are; for a mechanism with another
      curve it is an estimate, not a proof;
    * the canaries' memberships are independent fair coins and the attack, seeing the output, guesses
      on a subset of ``guesses`` canaries chosen by any rule and abstains on the rest; the number of
      guesses is fixed in advance (or chosen with a correction, as for the Steinke bound);
    * binary membership guesses (alphabet size k = 2 in the paper's reconstruction game).

    It is usually larger (tighter) than :func:`epsilon_lower_bound` for the same counts. Counts
    broadcast; one evaluation costs O(correct) steps, each vectorised over the distinct inputs.
    """
    delta, level = _level(delta, confidence)
    m, r, v, shape = _counts(m, guesses, correct)
    rejected_mu = _per_distinct(lambda *counts: _largest_rejected_mu(*counts, level, _MU_MAX), m, r, v)
    return _shaped(_gdp_epsilon(rejected_mu, delta), shape)


def _largest_rejected_mu(m, r, v, level, upper: float) -> np.ndarray:
    """Per count, the largest μ in [0, upper] whose Gaussian curve the recursion rejects (to 1e-7)."""
    m, r, v = (np.asarray(a, dtype=float) for a in (m, r, v))

    def rejected(rows: np.ndarray, mu: np.ndarray) -> np.ndarray:
        return mmc.rejected(m[rows], r[rows], v[rows], level, _gdp_inverse, mu)

    return _largest_rejected(rejected, np.full(m.shape[0], upper), points=1022)


def _gdp_inverse(x, mu):
    r""":math:`\bar f^{-1}(x) = f(1 - x) = \Phi(\Phi^{-1}(x) - \mu)` for μ-Gaussian DP."""
    return special.ndtr(special.ndtri(x) - mu)


# -- the Steinke et al. bound ----------------------------------------------------------------------


def _steinke_bound(m, r, v, delta, level):
    """ε_L for flat int arrays m, r, v (already validated)."""
    m, r, v = (np.asarray(a, dtype=float) for a in (m, r, v))
    # With δ = 0 the p-value is β alone and P[Binomial(r, q) >= v] = I_q(v, r - v + 1) inverts in
    # closed form; the δ term only raises the p-value, so this ε caps the search.
    with np.errstate(invalid="ignore"):
        q0 = np.where(v > 0, special.betaincinv(np.maximum(v, 1), r - v + 1, level), 0.5)
    eps_max = np.maximum(special.logit(q0), 0.0)

    def rejected(rows: np.ndarray, eps: np.ndarray) -> np.ndarray:
        return _steinke_p_value(m[rows], r[rows], v[rows], eps, delta) <= level

    return _largest_rejected(rejected, eps_max, points=7)


def _steinke_p_value(m, r, v, eps, delta):
    """β + 2mδα of Theorem 1 at ε; arrays broadcast."""
    m, r, v, eps = np.broadcast_arrays(m, r, v, eps)
    q, q_not = special.expit(eps), special.expit(-eps)
    beta = _at_least(v, r, q)
    return np.minimum(beta + 2 * m * delta * _max_window_mean(r, v, q, q_not, beta), 1.0)


def _at_least(k, n, p):
    """P[Binomial(n, p) >= k] = I_p(k, n - k + 1), the regularised incomplete beta function."""
    inside = (k >= 1) & (k <= n)
    tail = special.betainc(np.where(inside, k, 1), np.where(inside, n - k + 1, 1), p)
    return np.where(inside, tail, np.where(k < 1, 1.0, 0.0))


def _max_window_mean(r, v, q, q_not, beta):
    """α = max_{1<=i<=v} P[v-i <= W <= v-1] / i for W ~ Binomial(r, q), given β = P[W >= v].

    The mean of the pmf over the window [v-i, v-1] grows with i while the next value to the left
    exceeds it and, the pmf being unimodal (log-concave), falls for good once it does not. So the
    maximum is at the first i with pmf(v-1-i) <= mean(i), found by bisection over i. The pmf rises
    to the left of v-1 down to the mode (pmf(k-1) >= pmf(k) for k >= (r+1)q), so the mean grows at
    least until i = v - (r+1)q and the bisection starts there: far right of the mode the pmf and the
    window mass near v underflow to 0, which would otherwise stop the search at α = 0.
    """
    # A window right of the mean is a difference of small upper tails, P[W >= v-i] - β; one left of
    # it a difference of small lower tails, P[W <= v-1] - P[W <= v-1-i], taken as upper tails of
    # r - W ~ Binomial(r, 1 - q). Each keeps its precision where the other would lose it.
    right = v - 1 >= r * q
    k_side, p_side = np.where(right, v, r - v + 1), np.where(right, q, q_not)
    top_side = np.where(right, beta, _at_least(k_side, r, p_side))

    sign = np.where(right, 1.0, -1.0)

    def window_mass(i):  # P[v - i <= W <= v - 1]
        return sign * (_at_least(k_side - sign * i, r, p_side) - top_side)

    def pmf(k):
        k = np.clip(k, 0, r)
        log_choose = special.gammaln(r + 1) - special.gammaln(k + 1) - special.gammaln(r - k + 1)
        return np.exp(log_choose + k * np.log(q) + (r - k) * np.log(q_not))

    hi = np.maximum(v, 1)
    lo = np.clip(np.floor(v - (r + 1) * q), 1, hi)
    while np.any(lo < hi):
        mid = np.floor((lo + hi) / 2)
        grows = (mid < v) & (pmf(v - 1 - mid) > window_mass(mid) / mid)
        lo, hi = np.where(grows, mid + 1, lo), np.where(grows, hi, mid)
    return np.where(v > 0, np.maximum(window_mass(lo) / lo, 0.0), 0.0)


# -- shared machinery -------------------------------------------------------------------------------


def _largest_rejected(
    rejected: Callable[[np.ndarray], np.ndarray], upper: np.ndarray, points: int, tolerance=_TOLERANCE
) -> np.ndarray:
    """Per row, the largest x in [0, upper] with ``rejected`` true on all of [0, x], to ``tolerance``.

    ``rejected(rows, x)`` maps flat arrays of row indices and parameters to booleans, elementwise, and
    should be true below a threshold and false above it. Each round evaluates the bracket's ends and
    ``points`` grid points inside it and keeps the cell where the first non-rejected one lies, so the
    result is the *first* crossing even if the test were not monotone, and it is returned from below:
    every grid point up to it was rejected (0 when 0 itself is not). Few points suit tests that are cheap per point; many suit
    tests whose cost is in the rounds (the f-DP recursion costs as much for 10⁴ entries as for one).
    """
    upper = np.asarray(upper, dtype=float)
    lo, hi = np.zeros_like(upper), upper
    fractions = np.arange(points + 2) / (points + 1)  # lo, the points inside, hi
    rows = np.arange(lo.size)
    while True:
        grid = lo[:, None] + (hi - lo)[:, None] * fractions
        first_fail = _first_failures(rejected, grid)
        # lo itself fails only in the first round (later rounds start from a rejected point): then 0
        lo = np.where(first_fail == 0, 0.0, grid[rows, np.maximum(first_fail - 1, 0)])
        hi = np.where(first_fail == 0, 0.0, grid[rows, np.minimum(first_fail, points + 1)])
        if not np.any(hi - lo > tolerance):
            return lo


def _first_failures(rejected: Callable[[np.ndarray, np.ndarray], np.ndarray], grid: np.ndarray) -> np.ndarray:
    """Per row of the (n, k) ``grid``, the column of the first point ``rejected`` does not reject (k if none).

    Points right of a row's first failure cannot change it, so on a fine grid every ⌈√k⌉-th column is
    tested first, then only the columns left of the first failing one: the same answer as testing every
    point, at about half the cost where the crossing is near (a full recursion a point) and a tenth or
    less where the test decides fast.
    """
    n, k = grid.shape
    stride = math.isqrt(k - 1) + 1 if k >= _PROBED_GRID else 1
    columns = np.arange(k)
    probe = columns % stride == 0
    ok = np.zeros((n, k), dtype=bool)  # a column never tested lies right of a failure: its value is unused

    def test(mask: np.ndarray) -> None:
        rows, cols = np.nonzero(mask)
        if rows.size:
            ok[rows, cols] = rejected(rows, grid[rows, cols])

    test(np.broadcast_to(probe, (n, k)))
    failed = probe & ~ok
    stop = np.where(failed.any(axis=1), np.argmax(failed, axis=1), k)
    test(~probe & (columns < stop[:, None]))
    return np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))


def _gdp_epsilon(mu: np.ndarray, delta: float) -> np.ndarray:
    """The ε at which μ-GDP is (ε, δ)-DP (Dong, Roth & Su 2022, Corollary 2.13), by bisection."""
    mu = np.asarray(mu, dtype=float)
    safe = np.maximum(mu, 1e-300)

    def excess(eps):
        upper = special.ndtr(-eps / safe + safe / 2)
        return upper - np.exp(eps + special.log_ndtr(-eps / safe - safe / 2)) - delta  # e^ε Φ(·) in logs

    lo = np.zeros_like(mu)
    hi = mu**2 / 2 + mu * special.ndtri(1 - delta)  # here Φ(−ε/μ + μ/2) <= δ already
    for _ in range(100):
        mid = (lo + hi) / 2
        above = excess(mid) > 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        if np.all(hi - lo < 1e-9):
            break
    return np.where((mu > 0) & (excess(np.zeros_like(mu)) > 0), lo, 0.0)


def _clopper_pearson_upper(k, n, level):
    """One-sided Clopper–Pearson upper bound on a rate from k of n at error probability ``level``."""
    return np.where(k < n, special.betaincinv(k + 1, np.maximum(n - k, 1), 1 - level), 1.0)


def _level(delta, confidence) -> tuple[float, float]:
    return check_probability("delta", delta), 1.0 - check_probability("confidence", confidence)


def _counts(m, guesses, correct):
    """Validate (m, guesses, correct); return them flat and broadcast, and the shape of the result.

    The shape is None when all three are scalars, so that the caller returns a float.
    """
    m = _int_array("m", m, low=1)
    guesses = _int_array("guesses", guesses, low=0, high=m, high_name="m")
    correct = _int_array("correct", correct, low=0, high=guesses, high_name="guesses")
    m, guesses, correct = np.broadcast_arrays(m, guesses, correct)
    shape = m.shape or None
    return m.ravel(), guesses.ravel(), correct.ravel(), shape


def _per_distinct(bound: Callable[..., np.ndarray], m, r, v) -> np.ndarray:
    """``bound(m, r, v)`` for flat count arrays, computed once per distinct (m, r, v) and spread back:
    simulated audits repeat counts (2000 draws of Binomial(150, ½) hold some 50), and the bounds' cost
    grows with the number of entries."""
    distinct, inverse = np.unique(np.stack([m, r, v]), axis=1, return_inverse=True)
    return bound(*distinct)[inverse.ravel()]


def _shaped(flat: np.ndarray, shape):
    return float(flat[0]) if shape is None else flat.reshape(shape)


def _int_array(name, value, *, low, high=None, high_name=None) -> np.ndarray:
    """``value`` as an int array, each entry in [low, high]; the error names the first bad entry."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if np.ndim(value) == 0 and (high is None or np.ndim(high) == 0):
        return np.asarray(check_int(name, value, low=low, high=None if high is None else int(high)))
    array = np.asarray(value)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must be an integer or an array of integers, got {value!r}")
    upper = np.inf if high is None else high
    array, upper = np.broadcast_arrays(array, upper)
    bad = (array < low) | (array > upper)
    if np.any(bad):
        index = np.flatnonzero(bad)[0]
        value, limit = array.flat[index], upper.flat[index]
        bounds = f">= {low}" if high is None else f"in [{low}, {high_name}] = [{low}, {limit}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return array
