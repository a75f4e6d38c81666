r"""Privacy accounting for DP-SGD under the neighbouring relation an audit actually tests.

The libraries' accountants report ε for *add/remove* neighbours. The pair design of the audit
(train on every canary, compare the trained label with a fresh one) distinguishes datasets that
differ by *replacing* one record, so its lower bound must be compared with the *replace-one* ε of the
same run, which they do not compute for Poisson sampling. This module computes both, from the
dominating pairs of one step of the Poisson-subsampled Gaussian mechanism, in units of the clip norm:

* replace-one: :math:`P = (1-q)N(0,\sigma^2) + qN(1,\sigma^2)`,
  :math:`Q = (1-q)N(0,\sigma^2) + qN(-1,\sigma^2)`;
* remove: :math:`P = (1-q)N(0,\sigma^2) + qN(1,\sigma^2)`, :math:`Q = N(0,\sigma^2)`;
* add: :math:`P = N(0,\sigma^2)`, :math:`Q = (1-q)N(0,\sigma^2) + qN(-1,\sigma^2)`.

The add pair is the usual :math:`(N(0), (1-q)N(0)+qN(1))` mirrored, so that every privacy loss
:math:`\log p(x)/q(x)` here grows with x. For add/remove the two directions are composed separately
and the larger ε is taken, as dp_accounting does.

For replace-one, the record that is swapped is sampled (with probability q) or not together with its
replacement, so a step releases :math:`N(s, \sigma^2)`, or :math:`N(s + g, \sigma^2)` against
:math:`N(s + g', \sigma^2)`, with clipped gradients :math:`\|g\|, \|g'\| \le 1`; the worst case is
:math:`g' = -g` with unit norm, which gives the pair above. This is the pair Lebeda, Regehr, Kamath &
Steinke (2024, "Avoiding pitfalls for privacy accounting of subsampled mechanisms under
composition", arXiv 2405.20769) use for substitution with the subsampled Gaussian; that opposite
unit shifts maximise the hockey-stick divergence over all angles and norms is checked numerically in
the tests rather than proved here. Dominating pairs compose under adaptive composition (Zhu, Dong &
Wang 2022, "Optimal accounting of differential privacy via characteristic function"), so the T-fold
product of the pair bounds T steps of DP-SGD. The pairs are also attained (see
:func:`optimistic_epsilon`), so an optimistic discretisation of the same PLD bounds ε from below.

Only numpy and scipy are needed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import fft, integrate, signal, special

from dpverify._validation import check_choice, check_int, check_probability, check_real

__all__ = ["add_remove_epsilon", "optimistic_epsilon", "privacy_profile", "replace_one_epsilon"]

_METHODS = ("pld", "rdp", "group")
#: Zero-out (a record replaced by a null record whose clipped gradient is 0; dp_accounting's
#: ``REPLACE_SPECIAL``) has the add/remove pairs: the record's step releases (1-q)N(0,σ²) + qN(g,σ²)
#: against N(0,σ²) with ‖g‖ <= 1, in either order, at a dataset size that does not change.
RELATIONS = ("add_remove", "replace_one", "zero_out")
# Mass the PLD may move to +∞ or lose off its upper end, as a fraction of δ: it is added to δ, so it
# only makes ε larger (by a relative 1e-6 of δ, far below the discretisation error).
_SLACK = 1e-6
# Smallest δ'/δ the group bound searches: enough for add/remove ε' up to log(1e12) ≈ 27.6.
_GROUP_FLOOR = 1e-12
# Grid of the per-step privacy loss: ``_SPACING`` is the target spacing and ``_MAX_BINS`` caps the
# bins of the composed distribution (the FFT length) for runs whose loss spreads very wide.
_SPACING = 1e-4
_MAX_BINS = 2**18
# The optimistic grid: ``_BINS_PER_SPREAD`` spacings per standard deviation of the per-step loss; bins
# more than ``_FINE`` standard deviations from the mean loss widen by ``_WIDENING`` times their distance
# beyond; ``_CELLS`` cells of the table of thresholds per bin; a bin that would reach more than ``_FAR``
# times (its target's distance from its first cell, plus a spacing) past its target is its first cell
# alone, rounded down.
_BINS_PER_SPREAD = 10
_FINE = 6
_FAR = 4
_WIDENING = 0.05
_CELLS = 4
# Rényi orders, as in dp_accounting's RDP accountant plus a few large ones for small σ.
_ORDERS = np.concatenate(
    [1 + np.arange(1, 100) / 10, np.arange(11, 64), [80, 96, 128, 192, 256, 384, 512, 768, 1024]]
)


def replace_one_epsilon(*, noise_multiplier, sampling_rate, steps, delta, method="pld") -> float:
    r"""ε of DP-SGD (Poisson sampling rate q, noise σ·C, T steps) when neighbours replace one record.

    Parameters
    ----------
    noise_multiplier : float
        σ, the noise standard deviation in units of the clip norm; 0 means no noise (ε = ∞).
    sampling_rate : float
        q, each record's probability of being in a batch, in (0, 1].
    steps : int
        T, the number of noisy steps.
    delta : float
        δ of the guarantee, in (0, 1).
    method : {"pld", "rdp", "group"}
        ``"pld"`` (default): the privacy-loss distribution of the replace-one pair, discretised
        pessimistically by "connect the dots" (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022):
        the hockey-stick divergence :math:`\delta(\varepsilon) = \sup_S P(S) - e^\varepsilon Q(S)` is
        computed in closed form on a grid of ε and interpolated linearly in :math:`e^\varepsilon`,
        which lies above the true (convex) curve and is itself the curve of a valid discrete pair.
        That pair is composed T times by FFT; mass beyond a Chernoff bound is counted as leaked.
        The result is an upper bound on the true ε (up to floating-point rounding): safe to compare
        a lower bound against.

        ``"rdp"``: Rényi divergences :math:`D_\lambda(P\|Q)` of the same pair by numerical
        integration over a grid of orders, times T, converted with
        :math:`\varepsilon = \min_\lambda T D_\lambda + \log(1 - 1/\lambda) -
        (\log\delta + \log\lambda)/(\lambda - 1)` (Canonne, Kamath & Steinke 2020). An independent
        route to the same quantity; it is looser than ``"pld"``.

        ``"group"``: the group-privacy bound from the add/remove accountant, for when only an
        add/remove accountant is trusted. Replacing a record is removing it and adding another, so
        add/remove (ε', δ')-DP gives replace-one :math:`(2\varepsilon', (1 + e^{\varepsilon'})\delta')`.
        δ' is solved from :math:`(1 + e^{\varepsilon'(\delta')})\delta' = \delta`, with ε'(δ') from
        :func:`add_remove_epsilon` (``"pld"``); ∞ when no δ' >= 1e-12·δ satisfies it. Never tighter
        than ``"pld"`` beyond discretisation error; often much looser.
    """
    sigma, q, steps, delta = _check(noise_multiplier, sampling_rate, steps, delta)
    return _replace_one_epsilon(sigma, q, steps, delta, check_choice("method", method, _METHODS))


@functools.lru_cache(maxsize=512)
def _replace_one_epsilon(sigma: float, q: float, steps: int, delta: float, method: str) -> float:
    """:func:`replace_one_epsilon` of checked numbers, once per process for each (an audit's planning, its
    claim check and its tests ask for the same claim's ε, 0.05-0.15 s of PLD each)."""
    if sigma == 0:
        return math.inf
    if method == "pld":
        return _ComposedPLD(_Pair(sigma, q, 1.0, -1.0), steps, _SLACK * delta).epsilon(delta)
    if method == "rdp":
        return _rdp_epsilon([_Pair(sigma, q, 1.0, -1.0)], steps, delta)
    floor = delta * _GROUP_FLOOR
    plds = [_ComposedPLD(pair, steps, _SLACK * floor) for pair in _add_remove_pairs(sigma, q)]
    return _group_epsilon(lambda d: max(pld.epsilon(d) for pld in plds), delta, floor)


def add_remove_epsilon(*, noise_multiplier, sampling_rate, steps, delta, method="pld") -> float:
    """ε of the same DP-SGD run for add/remove neighbours, with the machinery of :func:`replace_one_epsilon`.

    The larger of the remove and add directions (see the module docstring); ``method`` is
    ``"pld"`` or ``"rdp"``. It should agree with dp_accounting's PLD and RDP accountants for a
    ``PoissonSampledDpEvent`` of a ``GaussianDpEvent``, and never exceed the replace-one ε.
    """
    sigma, q, steps, delta = _check(noise_multiplier, sampling_rate, steps, delta)
    return _add_remove_epsilon(sigma, q, steps, delta, check_choice("method", method, _METHODS[:2]))


@functools.lru_cache(maxsize=512)
def _add_remove_epsilon(sigma: float, q: float, steps: int, delta: float, method: str) -> float:
    """:func:`add_remove_epsilon` of checked numbers, once per process for each (see :func:`_replace_one_epsilon`)."""
    if sigma == 0:
        return math.inf
    pairs = _add_remove_pairs(sigma, q)
    if method == "rdp":
        return _rdp_epsilon(pairs, steps, delta)
    return max(_ComposedPLD(pair, steps, _SLACK * delta).epsilon(delta) for pair in pairs)


def optimistic_epsilon(*, noise_multiplier, sampling_rate, steps, delta, relation) -> float:
    r"""A lower bound on the ε of the same DP-SGD run in ``relation``: no correct accountant can state less.

    The pairs of the module docstring are not only dominating but attained: a one-dimensional run in
    which the record that differs has clipped gradient 1 (replaced by one with gradient -1 for
    replace-one) and every other gradient is 0 releases exactly them, step after step. So their
    composed ε (the larger direction for add/remove) is the least ε that can hold for every run with
    these (σ, q, T), and a lower bound on it refutes any smaller claim.

    The bound is the PLD of the pairs discretised optimistically (:meth:`_ComposedPLD._binned`): each
    pair binned by its privacy loss so that every bin's loss is a multiple of the spacing, a tenth of
    the standard deviation of the per-step loss (coarser only where the composed loss spreads so wide
    that the FFT would exceed 2¹⁸ bins), bins widening in the tails of the per-step loss. Binning is
    post-processing, so the binned pair's composed δ(ε) is at most
    the true one; mass that may wrap onto the FFT window from below it is subtracted from δ, so up to
    floating-point rounding the result never exceeds the true ε. As the spacing follows the per-step
    loss, 5·10⁴ compositions of per-step losses of order 10⁻⁵ stay as accurate as ten of order 1: over
    σ ∈ {0.8, 2, 4, 8}, q ∈ {2·10⁻⁴, 10⁻³, 10⁻², 1}, T ∈ {10, 10³, 5·10⁴} at δ = 10⁻⁵ it is within
    0.65 % of the tightest valid upper bound (0.8 % for σ down to 0.3), in 0.01-0.09 s of CPU.
    """
    sigma, q, steps, delta = _check(noise_multiplier, sampling_rate, steps, delta)
    relation = check_choice("relation", relation, RELATIONS)
    if sigma == 0:
        return math.inf
    pairs = _relation_pairs(sigma, q, relation)
    return max(_ComposedPLD(pair, steps, _SLACK * delta, optimistic=True).epsilon(delta) for pair in pairs)


def privacy_profile(*, noise_multiplier, sampling_rate, steps, relation, points=2000, floor=1e-12):
    r"""The run's privacy profile δ(ε) on a grid of ε >= 0, an upper bound in *both* directions.

    δ(ε) bounds :math:`\sup_S P(S) - e^\varepsilon Q(S)` for the neighbouring pair in either order:
    for add/remove the larger of the remove and the (mirrored) add pair, which are each other's
    reverse; the replace-one pair is its own mirror image. That two-sidedness is what a trade-off
    curve built from the profile needs (Dong, Roth & Su 2022, Proposition 2.12). The pessimistic
    PLD of :func:`replace_one_epsilon` gives it; the grid runs from 0 to the ε where δ falls to
    ``floor`` (leaked mass, far below ``floor``, counts in full in every δ). σ must be > 0.

    Returns ``(epsilons, deltas)``, two arrays of ``points`` values, δ non-increasing.
    """
    sigma, q, steps, floor = _check(noise_multiplier, sampling_rate, steps, floor, delta_name="floor")
    relation = check_choice("relation", relation, RELATIONS)
    points = check_int("points", points, low=2)
    if sigma == 0:
        raise ValueError("noise_multiplier must be > 0 for a privacy profile, got 0")
    pairs = _relation_pairs(sigma, q, relation)
    plds = [_ComposedPLD(pair, steps, _SLACK * floor) for pair in pairs]
    epsilons = np.linspace(0.0, max(pld.epsilon(floor) for pld in plds), points)
    return epsilons, np.max([pld.delta(epsilons) for pld in plds], axis=0)


def _relation_pairs(sigma: float, q: float, relation: str) -> list[_Pair]:
    """The dominating pairs of one step in ``relation`` (zero-out's are add/remove's, see :data:`RELATIONS`)."""
    return [_Pair(sigma, q, 1.0, -1.0)] if relation == "replace_one" else _add_remove_pairs(sigma, q)


def _check(noise_multiplier, sampling_rate, steps, delta, delta_name="delta"):
    return (
        check_real("noise_multiplier", noise_multiplier, low=0.0),
        check_real("sampling_rate", sampling_rate, low=0.0, high=1.0, low_open=True),
        check_int("steps", steps, low=1),
        check_probability(delta_name, delta),
    )


# -- the pairs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pair:
    """P = (1-q)N(0,σ²) + qN(a,σ²) against Q = (1-q)N(0,σ²) + qN(b,σ²), with a >= 0 >= b."""

    sigma: float
    q: float
    a: float
    b: float

    @property
    def log_weights(self) -> tuple[float, float]:
        """log(1 - q) and log q, the weights of the centred and the shifted component."""
        return (math.log1p(-self.q) if self.q < 1 else -math.inf), math.log(self.q)

    def log_tails(self, x, upper: bool):
        """log P[X > x] and log Q[X > x] (or X < x when not ``upper``)."""
        sign = -1.0 if upper else 1.0
        log_w, log_q = self.log_weights
        centred = log_w + special.log_ndtr(sign * x / self.sigma)
        return tuple(
            np.logaddexp(centred, log_q + special.log_ndtr(sign * (x - mean) / self.sigma))
            for mean in (self.a, self.b)
        )

    def log_densities(self, x):
        """log p(x) and log q(x)."""
        s = self.sigma**2
        log_w, log_q = self.log_weights
        centred = log_w - x**2 / (2 * s)
        base = -0.5 * math.log(2 * math.pi * s)
        return tuple(
            base + np.logaddexp(centred, log_q - (x - mean) ** 2 / (2 * s)) for mean in (self.a, self.b)
        )

    def loss_moments(self) -> tuple[float, float]:
        """Mean and standard deviation of the loss log p(x)/q(x) under P, by the trapezoid rule over
        ±12σ; they only size the optimistic grid."""
        x = np.linspace(self.b - 12 * self.sigma - 1, self.a + 12 * self.sigma + 1, 4001)
        log_p, log_q = self.log_densities(x)
        density, loss = np.exp(log_p), log_p - log_q
        mass = integrate.trapezoid(density, x)
        mean = integrate.trapezoid(density * loss, x) / mass
        return float(mean), float(math.sqrt(integrate.trapezoid(density * (loss - mean) ** 2, x) / mass))

    def threshold(self, eps):
        """The x where the privacy loss log p(x)/q(x) equals ε (±∞ where it never does).

        With u = x/σ², w = 1 - q and k = q·exp(-1/(2σ²)) the loss is log((w + k e^u)/(w + k e^-u))
        for replace-one, log(w + k e^u) for remove and -log(w + k e^-u) for (mirrored) add.
        """
        eps = np.asarray(eps, dtype=float)
        s = self.sigma**2
        log_w, log_q = self.log_weights
        log_k = log_q - 0.5 / s
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.b < 0 < self.a:  # replace-one: u = ε/2 + asinh(w sinh(ε/2) / k), kept in logs
                half = np.abs(eps) / 2
                log_y = log_w - log_k + half + np.log1p(-np.exp(-2 * half)) - math.log(2)
                large = log_y + np.log1p(np.sqrt(1 + np.exp(-2 * log_y)))
                u = np.sign(eps) * (half + np.where(log_y > 0, large, np.arcsinh(np.exp(log_y))))
            elif self.a > 0:  # remove: k e^u = e^ε - w
                u = np.where(eps > log_w, eps + np.log1p(-np.exp(log_w - eps)) - log_k, -np.inf)
            else:  # add: k e^-u = e^-ε - w
                u = np.where(-eps > log_w, log_k + eps - np.log1p(-np.exp(log_w + eps)), np.inf)
        return s * u

    def hockey_stick(self, eps, reverse: bool = False):
        """δ(ε) = sup_S P(S) - e^ε Q(S), or with P and Q swapped when ``reverse``."""
        eps = np.asarray(eps, dtype=float)
        x = self.threshold(-eps if reverse else eps)
        log_p, log_q = self.log_tails(x, upper=not reverse)
        first, second = (log_q, log_p) if reverse else (log_p, log_q)
        with np.errstate(invalid="ignore", over="ignore"):
            value = np.exp(first) * -np.expm1(eps + second - first)
        return np.where(np.isneginf(first), 0.0, np.maximum(value, 0.0))


def _add_remove_pairs(sigma, q):
    return [_Pair(sigma, q, 1.0, 0.0), _Pair(sigma, q, 0.0, -1.0)]


# -- privacy-loss distributions -----------------------------------------------------------------------


class _ComposedPLD:
    """The T-fold composition of a pair's privacy-loss distribution, discretised in one direction.

    Pessimistic (the default): connect-the-dots (:meth:`_connect_the_dots`), an upper bound on δ(ε).
    The mass it gives up (to +∞ or off the top of the FFT window) is at most ``leak`` in all and counts
    in full towards every δ, so it should be far below the δ it will be asked about.

    Optimistic: the pair binned so that every bin's loss lies on the grid (:meth:`_binned`), a
    post-processing of the pair, so a lower bound on δ(ε). Mass that may wrap onto the FFT window from
    below it (at most ``leak / 3``) is subtracted from every δ; mass above the window wraps down onto
    smaller losses, which only lowers δ.
    """

    def __init__(self, pair: _Pair, steps: int, leak: float, *, optimistic: bool = False):
        leak = leak / 3
        # Per-step losses: above ``top`` the tail of δ(ε) is below leak / T and goes to +∞; below
        # ``bottom`` the chord of connect-the-dots is tight to the same accuracy.
        top = _crossing(lambda e: pair.hockey_stick(e), leak / steps)
        bottom = -_crossing(lambda e: pair.hockey_stick(e, reverse=True), leak / steps)
        # A coarse pass finds how far the composed loss spreads, which sets the spacing of the fine
        # one so that the FFT stays within _MAX_BINS.
        coarse = (top - bottom) / 512
        first, masses, _ = self._connect_the_dots(pair, bottom, top, coarse)
        low, high = self._window(first, masses, coarse, steps, leak)
        widest = max((high - low) / _MAX_BINS, (top - bottom) / _MAX_BINS)
        if optimistic:
            mean, spread = pair.loss_moments()
            spacing = max(spread / _BINS_PER_SPREAD, widest)
            first, masses, origin = self._binned(pair, bottom, top, spacing, mean, _FINE * spread)
        else:
            spacing, origin = max(_SPACING, widest), 0.0
            first, masses, infinity = self._connect_the_dots(pair, bottom, top, spacing)
        low, high = self._window(first, masses, spacing, steps, leak)
        self._compose(first, masses, spacing, steps, low, high)
        self._losses += steps * origin  # the grid's losses are origin + k·spacing
        # Pessimistic: composed mass at +∞, plus the Chernoff bound on the mass above the window.
        self._offset = -leak if optimistic else -math.expm1(steps * math.log1p(-infinity)) + leak

    @staticmethod
    def _connect_the_dots(pair, bottom, top, spacing):
        """Connect-the-dots PLD on the grid ε_k = k·spacing: (first k, masses, mass at +∞).

        With d_k = δ(ε_k) and c = 1/(e^Δ - 1), the pmf whose δ(ε) interpolates the d_k linearly in
        e^ε puts :math:`(1 + c)(d_{k-1} - d_k) - c(d_k - d_{k+1})` at interior ε_k,
        :math:`1 - d_0 - c(d_0 - d_1)` at the lowest, :math:`(1 + c)(d_{n-1} - d_n)` at the highest
        and :math:`d_n` at +∞; the first is the chord from δ(-∞) = 1.
        """
        first, last = math.floor(bottom / spacing), math.ceil(top / spacing)
        d = pair.hockey_stick(np.arange(first, last + 1) * spacing)
        drops = -np.diff(d)
        c = 1 / math.expm1(spacing)
        masses = np.empty_like(d)
        masses[1:-1] = (1 + c) * drops[:-1] - c * drops[1:]
        masses[0] = 1 - d[0] - c * drops[0]
        masses[-1] = (1 + c) * drops[-1]
        return first, np.maximum(masses, 0.0), float(d[-1])

    @staticmethod
    def _binned(pair, bottom, top, spacing, mean, fine):
        r"""The pair binned by its loss so that every bin's loss is on the grid origin + k·spacing:
        (first k, masses, origin).

        Sending each output x to a bin, even at random, with probabilities that depend on x only, is
        post-processing, so the binned pair's δ(ε), and that of its T-fold composition, is at most
        the pair's (data processing). The outputs are first cut into cells by a table of thresholds
        on the loss (``_CELLS`` per bin, as wide as the bins where they are); cells are taken in
        order of their loss into bins, and the cell where a bin's loss
        :math:`\log P(\text{bin})/Q(\text{bin})` passes its target grid point is shared at
        random with the next bin, in the proportion that puts the bin's loss
        on the target exactly (up to floating-point rounding). A bin's target is the next grid point
        above the loss of its first cell, or, more than ``fine`` from the mean loss, further by
        ``_WIDENING`` times the distance beyond ``fine``, where little mass lies, so that a few
        hundred bins cover even a skewed loss. Where the target is out of reach, or reaching it would
        merge cells far above it (see ``_FAR``), the first cell is a bin of its own, its loss rounded
        down to the grid instead, which only lowers δ(ε) (it is :math:`E_P(1 - e^{\varepsilon - L})_+`,
        increasing in L): a heavy cell, such as the pile-up of loss near ±log(1 - q) of the add and
        remove pairs at small σ, would otherwise swallow the informative tail. The grid's origin is
        the loss of the heaviest cell, which so loses nothing. The outputs whose loss is below
        ``bottom`` are one cell, dropped if its loss is below ``bottom`` too (a smaller measure has a
        smaller δ(ε)); losses above ``top`` are rounded down to it.

        Rounding every loss down to the grid, as dp_accounting's optimistic PLD does, loses half a
        spacing per step on average, T·Δ/2 in all; binning loses only the information within a bin,
        so the spacing can follow the per-step loss even over 10⁵ steps.
        """
        # Thresholds every spacing / _CELLS up to ``fine`` + spacing / _WIDENING from the mean loss, where
        # the bins' widening passes one spacing, and as far apart as the bins' widening beyond, out to
        # [bottom, top].
        step, linear = spacing / _CELLS, spacing / _WIDENING
        ratio, reach = 1 + _WIDENING / _CELLS, max(top - mean, mean - bottom) - fine
        widening = linear * ratio ** np.arange(max(math.ceil(math.log(max(reach, linear) / linear) / math.log(ratio)), 0) + 1)
        distances = np.concatenate([np.arange(0.0, fine + linear, step), fine + widening])
        u = np.concatenate([mean - distances[:0:-1], mean + distances])
        u = u[(u >= bottom) & (u <= top)]
        x = pair.threshold(u)
        u, x = u[np.isfinite(x)], x[np.isfinite(x)]  # losses beyond the pair's range have no threshold
        upper, lower = pair.log_tails(x, upper=True), pair.log_tails(x, upper=False)
        # Masses under P and Q of the cells (-∞, x_0] (dropped if its loss is below ``bottom``), (x_i, x_i+1]
        # and (x_n, ∞).
        keep = lower[0][0] - lower[1][0] >= bottom
        cell_p, cell_q = (
            np.concatenate([np.exp(lo[:1]) * keep, _tail_differences(lo, up), np.exp(up[-1:])])
            for up, lo in zip(upper, lower)
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            cell_loss = np.log(cell_p) - np.log(cell_q)
        origin = float(cell_loss[np.argmax(cell_p)])
        masses, indices = [], []
        start, share = 0, 1.0  # the first cell of the next bin, and the share of it left to bins
        while start < cell_p.size:
            first_p, first_q = share * cell_p[start], share * cell_q[start]
            if first_p <= 0:
                start, share = start + 1, 1.0
                continue
            loss = min(cell_loss[start], top) - origin  # losses from here on are relative to the origin
            below = math.floor(loss / spacing)
            target = math.floor((loss + _WIDENING * max(abs(loss + origin - mean) - fine, 0.0)) / spacing) + 1
            end, sum_p, sum_q = _reach(cell_p, cell_q, start, first_p, first_q, origin + target * spacing)
            if end is None or end == start or cell_loss[end] - origin > target * spacing + _FAR * (target * spacing - loss + spacing):
                masses.append(first_p)  # the first cell alone, its loss rounded down
                indices.append(below)
                start, share = start + 1, 1.0
                continue
            # The part a of cell ``end`` that puts the bin's loss on the target t: (P + a p) / (Q + a q) = e^t,
            # with both sides of a = (e^t Q - P) / (p - e^t q) divided by e^max(t, 0) against overflow.
            available = share if end == start else 1.0
            p_end, q_end = available * cell_p[end], available * cell_q[end]
            t = origin + target * spacing
            tilt, scale = math.exp(t - max(t, 0.0)), math.exp(-max(t, 0.0))
            part = min(max((tilt * sum_q - scale * sum_p) / (scale * p_end - tilt * q_end), 0.0), 1.0)
            masses.append(sum_p + part * p_end)
            indices.append(target)
            start, share = (end, available * (1 - part)) if part < 1 else (end + 1, 1.0)
        indices = np.array(indices)
        first = indices.min()
        return first, np.bincount(indices - first, weights=masses), origin

    @staticmethod
    def _window(first, masses, spacing, steps, leak):
        """Bounds [low, high] (in units of loss) holding all but ``leak`` of each tail of the sum.

        Chernoff: P[S >= b] <= exp(T log E e^{tL} - t b) for t > 0, and the same below for t < 0,
        over a grid of t around the value that is optimal for a Gaussian of the same variance.
        """
        losses = (first + np.arange(masses.size)) * spacing
        total = masses.sum()
        mean = masses @ losses / total
        spread = math.sqrt(max(masses @ (losses - mean) ** 2 / total, spacing**2))
        t = math.sqrt(2 * math.log(1 / leak) / steps) / spread * np.geomspace(1 / 16, 16, 33)
        t = np.concatenate([-t, t])
        support = masses > 0  # the optimistic grid is mostly empty
        supported, log_masses = losses[support], np.log(masses[support])
        # A few t at a time: the same sums as all 66 rows at once (each row is its own), in arrays that
        # stay in cache over the fine grid's 10⁴–10⁵ losses; every audit's claim composes dozens of these.
        log_mgf = np.concatenate(
            [special.logsumexp(rows[:, None] * supported + log_masses, axis=1) for rows in np.array_split(t, 6)]
        )
        bounds = (steps * log_mgf + math.log(1 / leak)) / t
        low = max(bounds[t < 0].max(), first * spacing * steps)
        high = min(bounds[t > 0].min(), losses[-1] * steps)
        return low, high

    def _compose(self, first, masses, spacing, steps, low, high):
        """The pmf of the sum of T losses on [low, high], by FFT of the pmf folded modulo its length.

        Mass below the window wraps onto it (only adding to δ); mass above it is at most the leak
        that __init__ adds to the mass at +∞. Keeps, for every grid point ℓ_j, the tail sums
        S0_j = Σ_{i>=j} p_i and S1_j = Σ_{i>=j} p_i e^{-(ℓ_i - ℓ_j)} that δ(ε) is made of.
        """
        start = math.floor(low / spacing)
        size = fft.next_fast_len(math.ceil(high / spacing) - start + 1, real=True)
        folded = np.bincount((first + np.arange(masses.size)) % size, weights=masses, minlength=size)
        composed = fft.irfft(fft.rfft(folded) ** steps, size)
        # Entry j holds the sums congruent to j modulo size; read them from ``start`` on.
        probs = np.maximum(np.roll(composed, -(start % size)), 0.0)[::-1]
        self._losses = (start + np.arange(size)) * spacing
        self._s0 = np.cumsum(probs)[::-1]
        self._s1 = signal.lfilter([1.0], [1.0, -math.exp(-spacing)], probs)[::-1]
        self._probs = probs[::-1]

    def delta(self, eps: np.ndarray) -> np.ndarray:
        """δ(ε) = ∞-mass + S0_j - e^{ε - ℓ_j} S1_j for ε in (ℓ_{j-1}, ℓ_j] (see :meth:`epsilon`)."""
        eps = np.asarray(eps, dtype=float)
        j = np.searchsorted(self._losses, eps)
        top = np.minimum(j, self._losses.size - 1)
        inside = self._s0[top] - np.exp(eps - self._losses[top]) * self._s1[top]
        return np.maximum(self._offset + np.where(j < self._losses.size, np.maximum(inside, 0.0), 0.0), 0.0)

    def epsilon(self, delta: float) -> float:
        """The smallest ε >= 0 with δ(ε) <= delta, exact for the discrete distribution.

        δ(ε) = ∞-mass + Σ_{ℓ_i > ε} p_i (1 - e^{ε - ℓ_i}), which on (ℓ_{j-1}, ℓ_j] is
        ∞-mass + S0_j - e^{ε - ℓ_j} S1_j: the first grid point where δ <= ``delta`` brackets the
        answer, which is solved for there in closed form.
        """
        at_grid = self._offset + (self._s0 - self._probs) - (self._s1 - self._probs)  # mass above ℓ_j
        reached = np.flatnonzero(at_grid <= delta)
        if self._offset >= delta or reached.size == 0:
            return math.inf
        j = reached[0]
        excess = self._offset + self._s0[j] - delta
        if excess <= 0 or self._s1[j] <= 0:
            return 0.0
        return max(float(self._losses[j] + math.log(excess / self._s1[j])), 0.0)


def _reach(cell_p, cell_q, start, first_p, first_q, target):
    """The first cell ``end`` >= ``start`` at which the bin that begins with (first_p, first_q) of
    cell ``start`` reaches loss ``target``, with the bin's masses before it: (end, P, Q); ``end`` is
    None when it never does."""
    width = 4 * _CELLS
    while True:
        window_p, window_q = cell_p[start : start + width].copy(), cell_q[start : start + width].copy()
        window_p[0], window_q[0] = first_p, first_q
        sum_p, sum_q = np.cumsum(window_p), np.cumsum(window_q)
        with np.errstate(divide="ignore", invalid="ignore"):
            reached = np.flatnonzero((sum_p > 0) & (np.log(sum_p) - np.log(sum_q) >= target))
        if reached.size:
            end = reached[0]
            before_p, before_q = (sum_p[end - 1], sum_q[end - 1]) if end else (0.0, 0.0)
            return start + end, before_p, before_q
        if start + width >= cell_p.size:
            return None, sum_p[-1], sum_q[-1]
        width *= 2


def _tail_differences(lower, upper):
    """Masses of the cells between consecutive points from log lower and upper tails there: the
    difference of whichever tail is below one half, for precision."""
    from_lower = np.exp(lower[1:]) * -np.expm1(lower[:-1] - lower[1:])
    from_upper = np.exp(upper[:-1]) * -np.expm1(upper[1:] - upper[:-1])
    return np.maximum(np.where(upper[:-1] < math.log(0.5), from_upper, from_lower), 0.0)


def _crossing(decreasing, level: float) -> float:
    """The least x >= 0 (to 1e-3) with decreasing(x) <= level, by doubling then bisection."""
    lo, hi = 0.0, 1.0
    while decreasing(hi) > level:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if decreasing(mid) > level else (lo, mid)
    return hi


# -- Rényi DP ----------------------------------------------------------------------------------------


def _rdp_epsilon(pairs, steps, delta) -> float:
    """ε from T times the largest Rényi divergence of the pairs, in either direction, per order."""
    divergence = np.max([_renyi(pair, swap) for pair in pairs for swap in (False, True)], axis=0)
    lam = _ORDERS
    eps = steps * divergence + np.log1p(-1 / lam) - (math.log(delta) + np.log(lam)) / (lam - 1)
    return float(max(np.min(eps), 0.0))


def _renyi(pair: _Pair, swap: bool) -> np.ndarray:
    """D_λ(P||Q) (or D_λ(Q||P)) for every order in _ORDERS, by the trapezoid rule in log space.

    The integrand p^λ q^(1-λ) peaks within |x| <= 2λ (at 2λ - 1 for q = 1). It is located on a
    coarse grid over that range and integrated on a fine grid over where it is within e^-60 of its
    peak; for these smooth, Gaussian-tailed integrands the trapezoid rule is accurate far beyond
    what the comparison needs.
    """
    lam = _ORDERS[:, None]

    def log_integrand(x):
        log_p, log_q = pair.log_densities(x)
        if swap:
            log_p, log_q = log_q, log_p
        return lam * log_p + (1 - lam) * log_q

    reach = 2 * lam + 12 * pair.sigma + 2
    coarse = reach * np.linspace(-1, 1, 8001)
    values = log_integrand(coarse)
    inside = values >= values.max(axis=1, keepdims=True) - 60
    step = coarse[:, 1] - coarse[:, 0]
    rows = np.arange(lam.size)
    lo = coarse[rows, np.argmax(inside, axis=1)] - step
    hi = coarse[rows, coarse.shape[1] - 1 - np.argmax(inside[:, ::-1], axis=1)] + step
    fine = lo[:, None] + (hi - lo)[:, None] * np.linspace(0, 1, 4001)
    values = log_integrand(fine)
    peak = values.max(axis=1, keepdims=True)
    integral = integrate.trapezoid(np.exp(values - peak), fine, axis=1)  # np.trapz is gone in numpy 2.4
    return (peak[:, 0] + np.log(integral)) / (lam[:, 0] - 1)


# -- group privacy -----------------------------------------------------------------------------------


def _group_epsilon(add_remove, delta, floor) -> float:
    """2ε' with ε' = add_remove(δ') at the largest δ' in [floor, δ/2] with (1 + e^ε')δ' <= δ, or ∞.

    (1 + e^{ε'(δ')})δ' need not be monotone in δ' (for large ε' it can grow as δ' shrinks), so the
    largest feasible δ' is located on a logarithmic grid and refined by bisection towards the first
    infeasible grid point above it. ∞ when no δ' in range is feasible: group privacy then gives no
    bound at this δ.
    """

    def feasible(log_d):
        return log_d + math.log1p(math.exp(min(add_remove(math.exp(log_d)), 700.0))) <= math.log(delta)

    grid = np.linspace(math.log(floor), math.log(delta / 2), 121)
    ok = [log_d for log_d in grid if feasible(log_d)]
    if not ok:
        return math.inf
    lo = ok[-1]
    hi = grid[min(np.searchsorted(grid, lo) + 1, grid.size - 1)]
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if feasible(mid) else (lo, mid)
    return 2 * add_remove(math.exp(lo))
