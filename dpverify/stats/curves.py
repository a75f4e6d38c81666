r"""Trade-off curves of DP-SGD claims, and the one-run test of a claim's whole curve.

A claim that carries (σ, q, T) asserts more than one (ε, δ): the composed mechanism is f-DP for its
trade-off curve f, where f(α) is the least type II error of any test of "the canary was in" at
type I error α (Dong, Roth & Su 2022). Refuting f can catch a noise deficit that the (ε, δ) bound
of Steinke et al. misses (design rule 9). Every curve here is symmetric (f = f⁻¹), so it bounds
both a "member" and a "non-member" guess, and pessimistic (never above the true curve):

* q = 1: exact μ-GDP, :math:`f_\mu(\alpha) = \Phi(\Phi^{-1}(1-\alpha) - \mu)`, with μ = √T/σ for
  add/remove (sensitivity C against noise σC) and μ = 2√T/σ for replace-one (a swap moves the sum
  by up to 2C);
* q < 1: the envelope implied by the composed Poisson-subsampled Gaussian's privacy profile δ(ε)
  from the PLD accountant, both directions,
  :math:`f(\alpha) = \sup_\varepsilon \max\{0, 1 - \delta(\varepsilon) - e^\varepsilon\alpha,
  e^{-\varepsilon}(1 - \delta(\varepsilon) - \alpha)\}` (Dong, Roth & Su 2022, Prop. 2.12), valid
  because δ(ε) is an upper bound; a finite grid of ε only lowers it;
* σ = 0: f ≡ 0, no privacy, nothing to refute.

:func:`curve_test` decides a claim with the recursion of :mod:`dpverify.stats.mmc` and reports the
outcome as an ε at the claim's δ: that of the weakest member of the claim's family (same q, T and
relation, any σ) that the counts still refute.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
from scipy import special

from dpverify._validation import check_choice, check_int, check_probability, check_real
from dpverify.stats import accounting, mmc
from dpverify.stats.bounds import (
    _counts,
    _gdp_epsilon,
    _gdp_inverse,
    _largest_rejected,
    _largest_rejected_mu,
    _level,
)

__all__ = [
    "ClaimedMechanism",
    "ClaimedRun",
    "CurveTest",
    "GaussianCurve",
    "ProfileCurve",
    "TradeOffCurve",
    "TrivialCurve",
    "combined_curve_test",
    "combined_refutes",
    "curve_refutes",
    "curve_test",
    "fisher_combination",
    "run_decades",
]

Relation = Literal["add_remove", "replace_one", "zero_out"]

# Smallest tail probability the p-value search resolves (as -log10), and its precision there.
_TAIL_DECADES = 30.0
_TAIL_TOLERANCE = 1e-3
# The search over the family's noise multiplier: at most this factor from the claim's σ, and to
# this relative precision (the stated ε to about 1 %).
_SIGMA_SPAN = 64.0
_SIGMA_TOLERANCE = 1e-2
# A member's margin below this many decades counts as this many (a p-value of 0 has none).
_MARGIN_FLOOR = 50.0
# μ searched at q = 1 (μ = 64 is ε in the thousands) unless the claim's own μ is larger.
_MU_MAX = 64.0
# A run's tail bound in the combined test: τ = 10^(−x) on this grid (rounded up to 12 %, at least 1e-12),
# and the precision of the combined test's μ.
_RUN_DECADES = np.arange(1, 241) / 20
_COMBINED_MU_TOLERANCE = 1e-4


class TradeOffCurve:
    """A symmetric trade-off function f on [0, 1]: f(α) is the least type II error at type I error α."""

    def __call__(self, alpha) -> np.ndarray:
        raise NotImplementedError

    def inverse_complement(self, x, param=None) -> np.ndarray:
        r""":math:`\bar f^{-1}(x) = f(1 - x)` for a symmetric f, as :func:`mmc.rejected` needs it."""
        return self(1.0 - np.asarray(x, dtype=float))


@dataclass(frozen=True, kw_only=True)
class GaussianCurve(TradeOffCurve):
    """μ-GDP: f(α) = Φ(Φ⁻¹(1 − α) − μ), the curve of N(0, 1) against N(μ, 1)."""

    mu: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", check_real("mu", self.mu, low=0.0))

    def __call__(self, alpha) -> np.ndarray:
        return special.ndtr(-special.ndtri(np.asarray(alpha, dtype=float)) - self.mu)

    def inverse_complement(self, x, param=None) -> np.ndarray:
        """Φ(Φ⁻¹(x) − μ), which keeps its precision for tiny x where f(1 − x) would not."""
        return _gdp_inverse(x, self.mu)


@dataclass(frozen=True)
class TrivialCurve(TradeOffCurve):
    """f ≡ 0: a mechanism without privacy; no outcome refutes it."""

    def __call__(self, alpha) -> np.ndarray:
        return np.zeros_like(np.asarray(alpha, dtype=float))


@dataclass(frozen=True, kw_only=True, eq=False)
class ProfileCurve(TradeOffCurve):
    r"""The curve implied by a privacy profile: sup over the grid of f_{ε, δ(ε)}, both directions.

    Each grid point gives the lines :math:`1 - \delta - e^\varepsilon\alpha` and
    :math:`e^{-\varepsilon}(1 - \delta - \alpha)`; their upper envelope with 0 is convex and
    piecewise linear, so it is stored by its vertices and evaluated exactly by interpolation.
    ``deltas`` must bound δ(ε) of the pair in both orders, which makes the curve symmetric.
    """

    epsilons: np.ndarray
    deltas: np.ndarray
    vertices: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        eps = np.asarray(self.epsilons, dtype=float)
        deltas = np.asarray(self.deltas, dtype=float)
        if eps.ndim != 1 or eps.shape != deltas.shape or eps.size == 0:
            raise ValueError(f"epsilons and deltas must be 1-d of one length, got {eps.shape}, {deltas.shape}")
        if np.any(~np.isfinite(eps) | (eps < 0)) or np.any(~(deltas >= 0) | (deltas > 1)):
            raise ValueError("epsilons must be finite and >= 0 and deltas in [0, 1]")
        one = 1.0 - deltas
        intercepts = np.concatenate([one, np.exp(-eps) * one, [0.0]])
        slopes = np.concatenate([np.exp(eps), np.exp(-eps), [0.0]])
        object.__setattr__(self, "vertices", _upper_envelope(intercepts, slopes))

    def __call__(self, alpha) -> np.ndarray:
        return np.interp(alpha, *self.vertices)


def _upper_envelope(intercepts: np.ndarray, slopes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices on [0, 1] of max_k (a_k − b_k x) for lines with b_k >= 0 (convex hull trick)."""
    order = np.lexsort((-intercepts, -slopes))  # steepest first; of equal slopes the highest first
    # The scan reads one line at a time: Python floats (the same doubles) cost a tenth of numpy scalars.
    a_, b_ = intercepts.tolist(), slopes.tolist()
    hull: list[int] = []
    for k in order.tolist():
        if hull and b_[hull[-1]] == b_[k]:
            continue
        while len(hull) >= 2:
            i, j = hull[-2], hull[-1]
            # j is useless when the steeper i meets k no later than it meets j.
            if (a_[i] - a_[k]) * (b_[i] - b_[j]) <= (a_[i] - a_[j]) * (b_[i] - b_[k]):
                hull.pop()
            else:
                break
        hull.append(k)
    a, b = intercepts[hull], slopes[hull]
    kinks = (a[:-1] - a[1:]) / (b[:-1] - b[1:])
    xs = np.unique(np.concatenate([[0.0, 1.0], kinks[(kinks > 0) & (kinks < 1)]]))
    # Every line at every vertex, a few hundred vertices at a time: a privacy profile's 4001 lines are
    # all on the hull, and the whole 4001 × 4001 matrix at once costs ten times as much to allocate.
    blocks = np.array_split(xs, math.ceil(xs.size / 256))
    return xs, np.concatenate([np.max(a[:, None] - b[:, None] * block, axis=0) for block in blocks])


class ClaimedMechanism:
    """A claimed mechanism as the curve test reads it: a family indexed by ``noise_multiplier`` (less noise,
    a weaker claim), each member with its trade-off curve, its ε at any δ and, where exact, its GDP ``mu``
    (``None`` otherwise). :class:`ClaimedRun` is a DP-SGD claim's (σ, q, T); a claim stated as a
    dp_accounting event is :class:`dpverify.stats.events.EventRun`. A mechanism of another kind (correlated
    noise with its strategy) joins the audit by subclassing this and being returned for its claim by
    :func:`dpverify.audits.claims.claimed_run`."""

    noise_multiplier: float
    relation: str

    @property
    def mu(self) -> float | None:
        raise NotImplementedError

    def curve(self) -> TradeOffCurve:
        raise NotImplementedError

    def epsilon(self, delta) -> float:
        raise NotImplementedError

    def with_noise(self, noise_multiplier: float) -> ClaimedMechanism:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ClaimedRun(ClaimedMechanism):
    """What a DP-SGD claim asserts: noise σ (in clip norms), Poisson rate q, T steps, the relation.

    A family indexed by σ at fixed (q, T, relation): less noise is a weaker claim, with a lower
    curve and a larger ε at every δ.
    """

    noise_multiplier: float
    sampling_rate: float = 1.0
    steps: int
    relation: Relation = "add_remove"

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("noise_multiplier", check_real("noise_multiplier", self.noise_multiplier, low=0.0))
        set_("sampling_rate", check_real("sampling_rate", self.sampling_rate, low=0.0, high=1.0, low_open=True))
        set_("steps", check_int("steps", self.steps, low=1))
        set_("relation", check_choice("relation", self.relation, accounting.RELATIONS))

    @property
    def mu(self) -> float | None:
        """The exact GDP μ at full batch (∞ without noise); None when q < 1."""
        if self.sampling_rate < 1:
            return None
        scale = 2.0 if self.relation == "replace_one" else 1.0
        return math.inf if self.noise_multiplier == 0 else scale * math.sqrt(self.steps) / self.noise_multiplier

    def curve(self) -> TradeOffCurve:
        """The claim's trade-off curve, computed once per claim (see the module docstring)."""
        return _curve(self)

    def epsilon(self, delta) -> float:
        """ε at ``delta``: exact for GDP (q = 1), the PLD accountant's otherwise; ∞ without noise."""
        delta = check_probability("delta", delta)
        if self.noise_multiplier == 0:
            return math.inf
        if self.mu is not None:
            return float(_gdp_epsilon(np.array(self.mu), delta))
        account = (
            accounting.replace_one_epsilon if self.relation == "replace_one" else accounting.add_remove_epsilon
        )
        return account(
            noise_multiplier=self.noise_multiplier, sampling_rate=self.sampling_rate, steps=self.steps, delta=delta
        )

    def with_noise(self, noise_multiplier: float) -> ClaimedRun:
        """The member of the same family with another noise multiplier."""
        return dataclasses.replace(self, noise_multiplier=noise_multiplier)


@functools.lru_cache(maxsize=128)
def _curve(claim: ClaimedRun) -> TradeOffCurve:
    if claim.noise_multiplier == 0:
        return TrivialCurve()
    if claim.mu is not None:
        return GaussianCurve(mu=claim.mu)
    epsilons, deltas = accounting.privacy_profile(
        noise_multiplier=claim.noise_multiplier,
        sampling_rate=claim.sampling_rate,
        steps=claim.steps,
        relation=claim.relation,
    )
    return ProfileCurve(epsilons=epsilons, deltas=deltas)


@dataclass(frozen=True, kw_only=True, eq=False)
class CurveTest:
    """Outcome of :func:`curve_test`.

    ``refuted`` holds exactly when ``epsilon >= claimed_epsilon``: ``epsilon`` is the ε at ``delta``
    of the weakest refuted member of the claim's family (0 when no member within reach is
    refuted), ``noise_multiplier`` its σ (∞ then) and ``mu`` its GDP μ at q = 1. ``tail_bounds``
    holds, per guess count, an upper bound on P[at least that many correct] under the claimed
    curve (from :func:`combined_curve_test`, the runs' combined p-value per count); ``p_value`` is the
    smallest of them, to compare with the per-count level. ``refutable``:
    whether these guess counts could refute the claim at all (every guess correct would).
    """

    refuted: bool
    refutable: bool
    p_value: float
    tail_bounds: np.ndarray
    epsilon: float
    noise_multiplier: float
    mu: float | None
    claimed_epsilon: float
    delta: float
    confidence: float


def curve_test(m, guesses, correct, *, claim: ClaimedMechanism, delta, confidence=0.95) -> CurveTest:
    """Test "the run is f-DP for the claim's curve" on one-run counts, at level 1 − ``confidence``.

    ``guesses`` and ``correct`` may be arrays (a grid of guess counts, broadcast with ``m``); the
    claim is refuted when any count refutes it, so ``confidence`` must already be corrected for the
    grid (Bonferroni). The weakest refuted member is searched for: over μ by bisection (vectorised, exact
    GDP) at q = 1, over log σ otherwise, one PLD curve per step (:func:`_weakest_refuted_sigma`).
    """
    _check_claim(claim)
    delta, level = _level(delta, confidence)
    m, r, v, _ = _counts(m, guesses, correct)
    # One recursion decides both the counts and all-guesses-correct (what the counts could refute).
    both = mmc.rejected(np.tile(m, 2), np.tile(r, 2), np.concatenate([v, r]), level, claim.curve().inverse_complement)
    refuted = bool(np.any(both[: m.size]))
    return _family_outcome(
        claim,
        refuted=refuted,
        refutable=bool(np.any(both)),
        tails=_tail_bounds(claim.curve(), m, r, v),
        largest_refuted_mu=lambda upper: float(np.max(_largest_rejected_mu(m, r, v, level, upper))),
        margin=lambda member: 1.0 - 2.0 * _refutes(member, m, r, v, level),
        claim_margin=1.0 - 2.0 * refuted,
        delta=delta,
        confidence=confidence,
    )


def combined_curve_test(sizes, guesses, correct, *, claim: ClaimedMechanism, delta, confidence=0.95) -> CurveTest:
    r"""Test the claim's curve on R independent runs, each with its own canaries, at level 1 − ``confidence``.

    ``sizes`` (R,) holds each run's canaries; ``guesses`` and ``correct`` (R, K) each run's counts at
    K guess counts fixed in advance (the same fractions of every run). For run r and a count, the
    recursion bounds the tail, :math:`T_r(c) \ge P[C_r \ge c]`, for *any* mechanism that is f-DP
    for each of the run's canaries, however they depend on each other; so :math:`p_r = T_r(C_r)` is
    a p-value (with :math:`c^* = \min\{c: T_r(c) \le t\}`, :math:`P[p_r \le t] \le P[C_r \ge c^*]
    \le t`), here rounded up to a grid of 10^(−x/20). The runs share no randomness, so
    their p-values are independent and Fisher's combination

    .. math::

        p = P\big[\chi^2_{2R} \ge -2 \textstyle\sum_r \ln p_r\big]

    is a p-value too (each −2 ln p_r is stochastically below χ²₂; a run without evidence, p_r = 1,
    adds 0). Why: canaries of one run may share their privacy loss, which caps what one run's counts
    can show, but independent runs add their evidence up: 8 runs of 2500 canaries caught a 1.5× noise
    deficit at claimed ε = 2 and 4 on 5 of 5 seeds, where one recursion over all their canaries caught 1
    and 2 of 5 (benchmarks/results/noise-deficit-quick-8-runs.md). Counts are Bonferroni-corrected as
    in :func:`curve_test`; the weakest refuted member is searched the same way.
    """
    _check_claim(claim)
    delta, level = _level(delta, confidence)
    sizes, r, v = _run_counts(sizes, guesses, correct)
    # One recursion for the counts and for all guesses right (what the counts could refute).
    both = _combined_tails(sizes, np.hstack([r, r]), np.hstack([v, r]), claim.curve().inverse_complement)
    tails, everything = both[: r.shape[1]], both[r.shape[1] :]

    def largest_refuted_mu(upper: float) -> float:
        def rejected(counts: np.ndarray, mu: np.ndarray) -> np.ndarray:  # the combined test of counts at each μ
            return _combined_tails(sizes, r[:, counts], v[:, counts], _gdp_inverse, mu[None]) <= level

        return float(np.max(_largest_rejected(rejected, np.full(r.shape[1], upper), points=7, tolerance=_COMBINED_MU_TOLERANCE)))

    return _family_outcome(
        claim,
        refuted=bool(np.any(tails <= level)),
        refutable=bool(np.any(everything <= level)),
        tails=tails,
        largest_refuted_mu=largest_refuted_mu,
        margin=lambda member: _margin(np.min(_combined_tails(sizes, r, v, member.curve().inverse_complement)), level),
        claim_margin=_margin(np.min(tails), level),
        delta=delta,
        confidence=confidence,
    )


def _check_claim(claim) -> None:
    if not isinstance(claim, ClaimedMechanism):
        raise ValueError(f"claim must be a ClaimedMechanism (a ClaimedRun or an EventRun), got {claim!r}")


def _family_outcome(
    claim: ClaimedMechanism,
    *,
    refuted: bool,
    refutable: bool,
    tails: np.ndarray,
    largest_refuted_mu: Callable[[float], float],
    margin: Callable[[ClaimedMechanism], float],
    claim_margin: float,
    delta: float,
    confidence: float,
) -> CurveTest:
    """The :class:`CurveTest` of a decided claim: its weakest refuted member by μ (q = 1, from
    ``largest_refuted_mu(upper)``) or by σ (searched with ``margin(member)`` from the claim's own
    ``claim_margin``, which the test has already; see :func:`_weakest_refuted_sigma`)."""
    if claim.mu is not None:
        upper = max(_MU_MAX, 2 * claim.mu) if math.isfinite(claim.mu) else _MU_MAX
        mu = largest_refuted_mu(upper)
        mu = max(mu, claim.mu) if refuted else mu  # the claim itself is a refuted member
        sigma = math.inf if mu == 0 else _full_batch_sigma(claim, mu)
        epsilon = float(_gdp_epsilon(np.array(mu), delta))
    else:
        mu = None
        sigma = _weakest_refuted_sigma(claim, margin, claim_margin)
        epsilon = 0.0 if math.isinf(sigma) else claim.with_noise(sigma).epsilon(delta)
    return CurveTest(
        refuted=refuted,
        refutable=refutable,
        p_value=float(np.min(tails)),
        tail_bounds=tails,
        epsilon=epsilon,
        noise_multiplier=sigma,
        mu=mu,
        claimed_epsilon=claim.epsilon(delta),
        delta=delta,
        confidence=confidence,
    )


def _run_counts(sizes, guesses, correct) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated ``(sizes (R, 1), guesses (R, K), correct (R, K))`` of :func:`combined_curve_test`."""
    sizes = np.asarray(sizes)
    if sizes.ndim != 1 or sizes.size < 1:
        raise ValueError(f"sizes must list each run's canaries (1-d, at least one run), got shape {sizes.shape}")
    guesses, correct = np.asarray(guesses), np.asarray(correct)
    if guesses.ndim != 2 or guesses.shape[0] != sizes.size or correct.shape != guesses.shape:
        raise ValueError(
            f"guesses and correct must have shape (runs, counts) = ({sizes.size}, K), got {guesses.shape} and {correct.shape}"
        )
    m, r, v, _ = _counts(np.broadcast_to(sizes[:, None], guesses.shape), guesses, correct)
    return m.reshape(guesses.shape)[:, :1], r.reshape(guesses.shape), v.reshape(guesses.shape)


def _combined_tails(m, r, v, inverse, param=0.0) -> np.ndarray:
    """Fisher's p-value over axis 0 (the runs) of each run's tail bound; see :func:`combined_curve_test`."""
    m, r, v, param = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (m, r, v, param)))
    return fisher_combination(np.sum(run_decades(m, r, v, inverse, param), axis=0), runs=m.shape[0])


def run_decades(m, r, v, inverse, param=0.0) -> np.ndarray:
    """Per entry, the largest x on the grid :data:`_RUN_DECADES` whose τ = 10^(−x) the recursion rejects
    (0 when none): 10^(−x) bounds P[at least ``v`` correct of ``r`` guesses on ``m`` canaries] from above.

    Rejection grows with τ (:mod:`~dpverify.stats.mmc`), so each entry's x is bisected on the grid: 8
    recursions of one point an entry instead of one of all 240 (a fifth of the time on an audit's counts,
    the same answers). Every answer is a grid point the recursion rejected, or 0, so it stays a valid bound
    wherever rounding might break the monotonicity."""
    arrays = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (m, r, v, param)))
    shape = arrays[0].shape
    m, r, v, param = (a.ravel() for a in arrays)
    # lo: the largest index known rejected (−1: none yet); hi: the least known not rejected (the grid's size: none)
    lo, hi = np.full(m.size, -1), np.full(m.size, _RUN_DECADES.size)
    while np.any(open_ := hi - lo > 1):
        rows = np.flatnonzero(open_)
        mid = (lo[rows] + hi[rows]) // 2
        ok = mmc.rejected(m[rows], r[rows], v[rows], 10.0 ** -_RUN_DECADES[mid], inverse, param[rows])
        lo[rows], hi[rows] = np.where(ok, mid, lo[rows]), np.where(ok, hi[rows], mid)
    return np.where(lo >= 0, _RUN_DECADES[np.maximum(lo, 0)], 0.0).reshape(shape)


def fisher_combination(decades, *, runs: int) -> np.ndarray:
    """P[χ²(2R) ≥ −2 Σ ln p_r] for p_r = 10^(−x_r) and ``decades`` = Σ x_r: the regularised upper gamma
    function Q(R, ln 10 · Σ x_r)."""
    return special.gammaincc(runs, math.log(10.0) * np.asarray(decades, dtype=float))


def _full_batch_sigma(claim: ClaimedRun, mu: float) -> float:
    """σ of the full-batch member with GDP parameter μ (μ = √T/σ, twice that for replace-one)."""
    scale = 2.0 if claim.relation == "replace_one" else 1.0
    return scale * math.sqrt(claim.steps) / mu


def curve_refutes(m, guesses, correct, *, curve: TradeOffCurve, confidence=0.95):
    """Per count, whether the counts refute "f-DP for ``curve``" at level 1 − ``confidence``.

    The decision of :func:`curve_test` without the search over the family: arrays broadcast, and a
    bool (or bool array) comes back. Costs one recursion, O(correct) vectorised steps.
    """
    if not isinstance(curve, TradeOffCurve):
        raise ValueError(f"curve must be a TradeOffCurve, got {curve!r}")
    level = 1.0 - check_probability("confidence", confidence)
    m, r, v, shape = _counts(m, guesses, correct)
    refuted = mmc.rejected(m, r, v, level, curve.inverse_complement)
    return bool(refuted[0]) if shape is None else refuted.reshape(shape)


def combined_refutes(sizes, guesses, correct, *, curve: TradeOffCurve, confidence=0.95) -> np.ndarray:
    """Per count (column), whether the runs' combined counts refute "f-DP for ``curve``" at level
    1 − ``confidence``: the decision of :func:`combined_curve_test` without the search over the family."""
    if not isinstance(curve, TradeOffCurve):
        raise ValueError(f"curve must be a TradeOffCurve, got {curve!r}")
    level = 1.0 - check_probability("confidence", confidence)
    sizes, r, v = _run_counts(sizes, guesses, correct)
    return _combined_tails(sizes, r, v, curve.inverse_complement) <= level


def _margin(p_value: float, level: float) -> float:
    """Decades of ``p_value`` above ``level`` (≤ 0 exactly when ``p_value <= level``, as the test decides)."""
    decades = math.log10(p_value / level) if p_value > 0 else -math.inf
    return min(decades, 0.0) if p_value <= level else max(decades, math.ulp(1.0))


def _refutes(claim: ClaimedMechanism, m, r, v, level) -> bool:
    return bool(np.any(mmc.rejected(m, r, v, level, claim.curve().inverse_complement)))


def _weakest_refuted_sigma(claim: ClaimedMechanism, margin: Callable[[ClaimedMechanism], float], claim_margin: float) -> float:
    """The least σ whose member the counts refute, searched in log σ from the claim's σ.

    ``margin(member)`` is ≤ 0 exactly where the member is refuted and falls as σ grows (more noise, a stronger
    claim): the decades of the member's p-value below the level, or ±1 where only the decision is known;
    ``claim_margin`` is the claim's own, which the caller's test has already (unused for a claim without noise).
    Starts at the claim (σ = 1 for a claim without noise), halves or doubles σ, within a factor
    _SIGMA_SPAN of the start, to bracket the crossing, then narrows the bracket to _SIGMA_TOLERANCE and
    returns its refuted end; ∞ when even the strongest member within reach is not refuted. When the weakest
    member within reach is still refuted it is returned: a smaller ε than the true crossing, never a larger one.

    The narrowing is regula falsi on the margins in log σ with the Illinois rule (an end kept twice has its
    margin halved), steps at least half the tolerance from either end, and a bisection after any step that
    did not halve the bracket (a margin near 0 on a flat stretch would otherwise creep), so it takes at most
    twice bisection's member curves (a PLD each for an event or q < 1) and, on the audits' margins, fewer.
    Whatever the steps, the answer keeps bisection's guarantee: a refuted member within the tolerance of an
    unrefuted one.
    """
    start = claim.noise_multiplier or 1.0

    def margin_at(sigma: float) -> float:
        return max(margin(claim.with_noise(sigma)), -_MARGIN_FLOOR)

    f_start = max(claim_margin, -_MARGIN_FLOOR) if claim.noise_multiplier > 0 else margin_at(start)
    if f_start <= 0:
        hi, f_hi, lo = start, f_start, start / 2  # hi refuted; halve until lo is not
        while (f_lo := margin_at(lo)) <= 0:
            if lo < start / _SIGMA_SPAN:
                return lo
            hi, f_hi, lo = lo, f_lo, lo / 2
    else:
        lo, f_lo, hi = start, f_start, 2 * start  # lo not refuted; double until hi is
        while (f_hi := margin_at(hi)) > 0:
            if hi > start * _SIGMA_SPAN:
                return math.inf
            lo, f_lo, hi = hi, f_hi, 2 * hi
    least_step = math.log1p(_SIGMA_TOLERANCE) / 2
    kept = 0  # +1: lo kept last time, −1: hi kept
    halved = True  # whether the last step halved the bracket; if not, this one bisects it
    while hi / lo > 1 + _SIGMA_TOLERANCE:
        width = math.log(hi / lo)
        step = width * f_lo / (f_lo - f_hi) if halved else width / 2
        mid = lo * math.exp(min(max(step, least_step), width - least_step))
        f_mid = margin_at(mid)
        if f_mid <= 0:
            hi, f_hi = mid, f_mid
            f_lo, kept = (f_lo / 2 if kept == 1 else f_lo), 1
        else:
            lo, f_lo = mid, f_mid
            f_hi, kept = (f_hi / 2 if kept == -1 else f_hi), -1
        halved = math.log(hi / lo) <= width / 2
    return hi


def _tail_bounds(curve: TradeOffCurve, m, r, v) -> np.ndarray:
    """Per count, the least τ (from above, to 0.2 %) at which the recursion rejects; 1 when none.

    Rejection is monotone in τ, so τ = 10^-x is searched as the largest x in [0, 30] rejected.
    """

    def rejected(rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        return mmc.rejected(m[rows], r[rows], v[rows], 10.0**-x, curve.inverse_complement)

    x = _largest_rejected(rejected, np.full(m.shape[0], _TAIL_DECADES), points=255, tolerance=_TAIL_TOLERANCE)
    return 10.0**-x
