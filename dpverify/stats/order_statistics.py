r"""The order-statistics one-run test of Xiang et al. 2025, for a Gaussian (μ-GDP) product channel.

"Tight privacy audit in one run" (Xiang, Wang, Xiao, Tian & Wang, arXiv 2509.08704; code
github.com/zihangxiang/tight-privacy-audit-in-one-run, ``onerun/tail.py``) models a one-run audit as
``m`` secret bits sent through ``m`` **independent copies** of one channel, the claimed mechanism's
pair (P, Q) = (N(0, 1), N(μ, 1)). The decoder guesses each bit by its likelihood ratio and releases
the ``r`` guesses of highest confidence :math:`|y - \mu/2|`; with V the channel's tail mass above the
highest confidence *not* released, the number T of wrong released guesses has (their eq. 1, called
Theorem 2 in their code)

.. math::

    P[T \le u] = E_V\big[\mathrm{BinCDF}(u;\, r,\, \bar\gamma(V))\big], \qquad
    V \sim \mathrm{Beta}(r + 1, m - r),

since, given the cut, the r released outcomes are i.i.d. draws above it. Here
:math:`\bar\gamma(V)` is the mean error above the cut; for the Gaussian pair, with
:math:`S(\tau) = \bar\Phi(\tau + \mu/2) + \bar\Phi(\tau - \mu/2)` the mixture's mass with
confidence at least τ,

.. math::

    \bar\gamma = \frac{\bar\Phi(\tau + \mu/2)}{S(\tau)}, \qquad S(\tau) = V,

and at r = m (nothing withheld) T ~ Binomial(m, Φ(−μ/2)).

**Not a test of f-DP.** The identity needs the canaries' outcomes to be independent; a DP claim
promises only that each canary's effect, the others fixed, obeys the curve. A mechanism that is
exactly μ-GDP for every canary can share one privacy-loss level among all of them (draw
ℓ = |log-likelihood ratio| of one Gaussian outcome, then answer every bit by randomized response
at ε = ℓ): T is then a mixture of binomials with the same mean and a far wider spread, and this test
refutes that true claim far more often than its level (``tests/test_order_statistics.py``). The
Mahloujifar–Melis–Chaudhuri test (:mod:`dpverify.stats.mmc`) bounds every f-DP mechanism and does
not. So this module tests the stronger hypothesis "independent Gaussian channels, μ per canary"
and is kept for measurement, not for verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from dpverify._validation import check_real
from dpverify.stats.bounds import _counts, _gdp_epsilon, _largest_rejected, _level, _shaped

__all__ = ["ProductChannelTest", "product_channel_tail", "product_channel_test"]

# Quadrature over the cut: nodes between the Beta's 1e-30 quantiles, where the rest is negligible.
_NODES = 601
_TAIL_CUTOFF = 1e-30
# μ searched for the weakest refuted member (μ = 64 is ε in the thousands), and to this precision.
_MU_MAX = 64.0
_MU_TOLERANCE = 1e-4


@dataclass(frozen=True, kw_only=True, eq=False)
class ProductChannelTest:
    """Outcome of :func:`product_channel_test`.

    ``refuted`` holds when some count's tail :math:`P[T \\le u]` under the claimed μ is at most
    1 − ``confidence``. ``mu`` is the largest μ every count up to it still refutes (the weakest
    refuted member; at least the claim's own μ when the claim is refuted, 0 when none is) and
    ``epsilon`` its ε at ``delta``. ``tails`` holds the per-count tails at the claimed μ and
    ``p_value`` their minimum.
    """

    refuted: bool
    p_value: float
    tails: np.ndarray
    mu: float
    epsilon: float
    claimed_mu: float
    claimed_epsilon: float
    delta: float
    confidence: float


def product_channel_tail(m, guesses, correct, *, mu):
    """:math:`P[T \\le u]`, u = guesses − correct, under m independent μ-Gaussian channels (eq. 1).

    Counts broadcast like those of :func:`dpverify.stats.bounds.epsilon_lower_bound`; a float comes
    back for scalars.
    """
    mu = check_real("mu", mu, low=0.0)
    m, r, v, shape = _counts(m, guesses, correct)
    return _shaped(_tails(m[:, None], r[:, None], v[:, None], np.array([[mu]]))[:, 0], shape)


def product_channel_test(m, guesses, correct, *, mu, delta, confidence=0.95) -> ProductChannelTest:
    """Test "m independent μ-Gaussian channels" on one-run counts, at level 1 − ``confidence``.

    As :func:`dpverify.stats.curves.curve_test`: arrays of counts are a grid, refuted when any
    count refutes, so ``confidence`` must already be corrected for the grid (Bonferroni).
    """
    mu = check_real("mu", mu, low=0.0)
    delta, level = _level(delta, confidence)
    m, r, v, _ = _counts(m, guesses, correct)
    m, r, v = (a[:, None] for a in (m, r, v))
    tails = _tails(m, r, v, np.array([[mu]]))[:, 0]
    refuted = bool(np.any(tails <= level))

    def rejected(rows: np.ndarray, mus: np.ndarray) -> np.ndarray:
        return _tails(m[rows], r[rows], v[rows], mus[:, None])[:, 0] <= level

    upper = max(_MU_MAX, 2 * mu)
    weakest = float(np.max(_largest_rejected(rejected, np.full(m.shape[0], upper), 15, _MU_TOLERANCE)))
    weakest = max(weakest, mu) if refuted else weakest
    return ProductChannelTest(
        refuted=refuted,
        p_value=float(np.min(tails)),
        tails=tails,
        mu=weakest,
        epsilon=float(_gdp_epsilon(np.array(weakest), delta)),
        claimed_mu=mu,
        claimed_epsilon=float(_gdp_epsilon(np.array(mu), delta)),
        delta=delta,
        confidence=confidence,
    )


def _tails(m, r, v, mu):
    """Eq. 1 for (n, 1) count columns and an (n, k) or (1, 1) array of μ; returns (n, k).

    Integrated over the cut's confidence τ on ``_NODES`` trapezoid nodes between the τ of the
    Beta's two ``_TAIL_CUTOFF`` quantiles, divided by the same quadrature of the density alone so
    that the discarded tails and the rule's error do not scale the result.
    """
    m, r, v, mu = (np.asarray(x, dtype=float) for x in np.broadcast_arrays(m, r, v, mu))
    u, a, b = (r - v).astype(np.int64), r + 1, np.maximum(m - r, 1)
    half = mu / 2
    full = r >= m
    v_low = special.betaincinv(a, b, _TAIL_CUTOFF)
    v_high = 1 - special.betaincinv(b, a, _TAIL_CUTOFF)
    tau = _confidence_at(v_low, half)[..., None] + (
        _confidence_at(v_high, half) - _confidence_at(v_low, half)
    )[..., None] * np.linspace(1.0, 0.0, _NODES)
    h = half[..., None]
    log_above = special.log_ndtr(-(tau - h))
    log_error = special.log_ndtr(-(tau + h))
    mass = np.exp(log_above) + np.exp(log_error)  # S(τ), the tail mass V
    log_jacobian = np.logaddexp(_log_phi(tau - h), _log_phi(tau + h))
    log_density = (
        special.xlogy(a[..., None] - 1, mass)
        + special.xlog1py(b[..., None] - 1, -np.minimum(mass, 1.0))
        - special.betaln(a, b)[..., None]
        + log_jacobian
    )
    weight = np.exp(log_density - np.max(log_density, axis=-1, keepdims=True))
    gamma_bar = special.expit(log_error - log_above)  # Φ̄(τ + μ/2) / S(τ)
    binom = special.bdtr(u[..., None], r.astype(np.int64)[..., None], gamma_bar)
    partial = _trapezoid(weight * binom, tau) / _trapezoid(weight, tau)
    whole = special.bdtr(u, m.astype(np.int64), special.ndtr(-half))
    return np.clip(np.where(full, whole, partial), 0.0, 1.0)


def _confidence_at(mass, half):
    """τ >= 0 with S(τ) = ``mass`` (S falls from 1 at τ = 0), by bisection, elementwise."""
    lo = np.zeros_like(mass)
    hi = half + 40.0  # S(half + 40) < 1e-300
    for _ in range(80):
        mid = (lo + hi) / 2
        above = special.ndtr(-(mid + half)) + special.ndtr(-(mid - half)) > mass
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return (lo + hi) / 2


def _log_phi(x):
    return -0.5 * x**2 - 0.5 * math.log(2 * math.pi)


def _trapezoid(y, x):
    return np.sum((y[..., 1:] + y[..., :-1]) * np.diff(x, axis=-1), axis=-1) / 2
