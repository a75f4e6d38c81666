r"""What an audit could have caught: the signal its canaries carried, and the smallest noise deficit it refutes.

A pass is only worth what the audit could have seen. Two numbers say it:

* the **signal fraction** ρ: the members' separation in the audit's own scores,
  :math:`\hat\mu = (\bar s_{+} - \bar s_{-}) / \hat\sigma_{-}` (mean score of the canaries with secret bit
  +1 minus that of those with −1, over the latter's spread), divided by the μ of the claimed mechanism. A
  perfect attacker on a μ-GDP mechanism (Gaussian scores shifted by μ) has ρ = 1; Dirac canaries in the
  designated softmax regression reach 0.96–1.0 in every bundled library (benchmarks/results/dirac.md). Its
  interval is the delta-method one for a standardised mean difference,
  :math:`\operatorname{se}^2 \approx s_{+}^2/(s_{-}^2 n_{+}) + 1/n_{-} + \hat\mu^2/(2(n_{-}-1))`;
* the **smallest noise deficit** k*: an implementation that adds σ/k where it claims σ (its claim kept)
  is refuted by this audit, at this m, these runs and this level, with probability ≥ 0.8 for every k ≥ k*.
  It is predicted from the claim and ρ: under a deficit k the canaries' scores are modelled as members
  N(ρ·μ(σ/k), 1) against N(0, 1), where μ(σ) is the claimed run's GDP μ (exact at q = 1, μ = √T/σ, twice
  that for replace-one; the central-limit μ = q√(T(e^{1/σ²} − 1)) for q < 1, Dong, Roth & Su 2022, Thm 3.6).

One-run audits (:func:`one_run_deficit`) are predicted from the counts' distribution: for every guess
count, the expected number of correct guesses of the two-sided guess rule on Gaussian scores, less
z₀.₈ = 0.84 standard deviations (per run over √R when R pooled runs are combined, since Fisher's
statistic adds the runs), is put through the audit's own decision (both tests, the same levels). One count
refuting at its 20th percentile refutes with probability ≥ 0.8, so k* errs towards the larger deficit.
Two-world audits (:func:`two_world_deficit`) simulate their runs' scores and run their own test. Either
way k* is a model's prediction: benchmarks/results/power-check.md measures it against simulated audits
through the same decision, and noise-deficit-power.md against real noise deficits in opacus-ghost.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import special

from dpverify.stats.bounds import steinke_refutes
from dpverify.stats.curves import ClaimedRun, combined_refutes, curve_refutes
from dpverify.stats.scoring import GuessRule, correct_counts, subsampled_gaussian_log_likelihood_ratio

__all__ = [
    "AuditPower",
    "Separation",
    "audit_refutes",
    "every_update_detection",
    "gdp_mu",
    "judge",
    "measure_power",
    "one_run_deficit",
    "separation",
    "simulated_detection",
    "two_world_deficit",
]

#: The detection probability k* promises.
POWER = 0.8
#: The largest deficit looked for: an audit that cannot catch a 10× noise deficit could not see.
LARGEST_DEFICIT = 10.0
#: How precisely :func:`two_world_deficit`'s bisection locates k* (relative).
_DEFICIT_TOLERANCE = 0.03
_Z_POWER = float(special.ndtri(POWER))
#: Simulated audits per deficit in :func:`two_world_deficit` (common random numbers across deficits).
TWO_WORLD_SIMULATIONS = 40


@dataclass(frozen=True)
class Separation:
    """The members' standardised mean separation μ̂ in an audit's scores, with its two-sided interval at
    ``confidence`` (see the module docstring)."""

    mu: float
    low: float
    high: float


def separation(scores, membership, *, confidence: float = 0.95) -> Separation:
    """μ̂ of ``scores`` between secret bits +1 and −1 (``membership``), and its interval; NaN with fewer than
    two scores on a side or no spread among the −1 side."""
    scores, membership = np.asarray(scores, dtype=float), np.asarray(membership)
    plus, minus = scores[membership == 1], scores[membership == -1]
    if plus.size < 2 or minus.size < 2 or not np.std(minus) > 0:
        return Separation(math.nan, math.nan, math.nan)
    spread = float(np.std(minus, ddof=1))
    mu = float((plus.mean() - minus.mean()) / spread)
    variance = float(np.var(plus, ddof=1)) / (spread**2 * plus.size) + 1 / minus.size + mu**2 / (2 * (minus.size - 1))
    half = float(special.ndtri(0.5 + confidence / 2)) * math.sqrt(variance)
    return Separation(mu, mu - half, mu + half)


def gdp_mu(run: ClaimedRun) -> float:
    """The GDP μ of ``run``: exact at q = 1, the central-limit μ for q < 1 (∞ without noise)."""
    if run.mu is not None:
        return run.mu
    if run.noise_multiplier == 0:
        return math.inf
    scale = 2.0 if run.relation == "replace_one" else 1.0
    return scale * run.sampling_rate * math.sqrt(run.steps * math.expm1(run.noise_multiplier**-2))


@dataclass(frozen=True, kw_only=True)
class AuditPower:
    r"""What one audit could have caught.

    ``claimed_mu`` is the claimed mechanism's GDP μ, ``measured_mu`` the members' separation μ̂ in the
    audit's scores and ``signal_fraction`` ρ = μ̂/μ with its interval (``signal_low``, ``signal_high``);
    ``smallest_deficit`` is k* (∞: no deficit up to :data:`LARGEST_DEFICIT` would be refuted with
    probability :data:`POWER`). ``blind`` says why a pass could not see, or is ``None``.
    """

    claimed_mu: float
    measured_mu: float
    signal_fraction: float
    signal_low: float
    signal_high: float
    smallest_deficit: float
    blind: str | None = None

    def to_dict(self) -> dict[str, float | str | None]:
        """JSON-ready: a non-finite number is ``None`` (k* = ∞ reads "none up to LARGEST_DEFICIT")."""

        def number(value: float) -> float | None:
            return round(float(value), 4) if math.isfinite(value) else None

        return {
            "claimed_mu": number(self.claimed_mu),
            "measured_mu": number(self.measured_mu),
            "signal_fraction": number(self.signal_fraction),
            "signal_interval": [number(self.signal_low), number(self.signal_high)],
            "smallest_deficit": number(self.smallest_deficit),
            "power": POWER,
            "largest_deficit": LARGEST_DEFICIT,
            "blind": self.blind,
        }


def _deficit_mu(run: ClaimedRun, fraction: float) -> Callable[[float], float]:
    """k ↦ the canaries' separation under a deficit k: ρ·μ(σ/k)."""
    return lambda k: fraction * gdp_mu(run.with_noise(run.noise_multiplier / k))


def _smallest(refuted: Callable[[float], bool]) -> float:
    """The least k in [1, LARGEST_DEFICIT] with ``refuted(k)`` (monotone), by bisection in log k; ∞ when
    even the largest is not refuted."""
    if not refuted(LARGEST_DEFICIT):
        return math.inf
    low, high = 1.0, LARGEST_DEFICIT
    if refuted(low):
        return low
    while high / low > 1 + _DEFICIT_TOLERANCE:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if refuted(mid) else (mid, high)
    return high


def _smallest_on_grids(refuted: Callable[[np.ndarray], np.ndarray]) -> float:
    """:func:`_smallest` for a ``refuted`` that decides many k at once (one vectorised recursion costs about
    what one k does): a log grid of 16 points on [1, LARGEST_DEFICIT], then 8 inside the bracketing step,
    which locates k* to 2 %."""
    grid = np.geomspace(1.0, LARGEST_DEFICIT, 16)
    hits = refuted(grid)
    if not hits[-1]:
        return math.inf
    first = int(np.argmax(hits))
    if first == 0:
        return 1.0
    fine = np.geomspace(grid[first - 1], grid[first], 9)[1:]
    return float(fine[int(np.argmax(np.append(refuted(fine[:-1]), True)))])


def one_run_deficit(
    run: ClaimedRun,
    *,
    fraction: float,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidences: tuple[float, float],
) -> float:
    """k* of a one-run audit (pooled runs of ``run_sizes`` canaries) whose canaries carry ``fraction`` of the
    claimed signal: the audit's (ε, δ) test against ``claimed_epsilon`` and its curve test against ``run``'s
    curve, at ``confidences`` (each before the guess grid's Bonferroni correction), on the counts at
    their 20th percentile (module docstring)."""
    if not fraction > 0 or run.noise_multiplier == 0:
        return math.inf
    mu_at = _deficit_mu(run, fraction)
    steinke, curve_level = (guess_rule.corrected_confidence(c) for c in confidences)
    total = int(sum(run_sizes))
    counts = guess_rule.counts(total)
    run_counts = guess_rule.run_counts(run_sizes)
    sizes = np.asarray(run_sizes)[:, None]
    curve = run.curve()

    def refuted(deficits: np.ndarray) -> np.ndarray:
        mu = np.array([mu_at(k) for k in deficits])[:, None]  # (J, 1) against the counts (K,)
        mean, sd = _expected_correct(total, counts, mu, guess_rule.sides)
        low = _percentile_counts(mean, sd, counts)
        hits = np.any(steinke_refutes(total, counts, low, epsilon=claimed_epsilon, delta=delta, confidence=steinke), axis=1)
        if hits.all():
            return hits
        if len(run_sizes) == 1:  # one run: the curve test reads the same counts
            return hits | np.any(curve_refutes(total, counts, low, curve=curve, confidence=curve_level), axis=1)
        mean, sd = _expected_correct(sizes, run_counts, mu[:, :, None], guess_rule.sides)  # (J, R, K)
        low = _percentile_counts(mean, sd / math.sqrt(len(run_sizes)), run_counts)
        runs, tries = run_counts.shape
        flat = low.transpose(1, 0, 2).reshape(runs, -1)  # (R, J·K): every deficit's counts side by side
        combined = combined_refutes(run_sizes, np.tile(run_counts, (1, len(deficits))), flat, curve=curve, confidence=curve_level)
        return hits | np.any(combined.reshape(len(deficits), tries), axis=1)

    return _smallest_on_grids(refuted)


def simulated_detection(
    run: ClaimedRun,
    *,
    deficit: float,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidences: tuple[float, float],
    audits: int,
    rng: np.random.Generator,
) -> float:
    """The share of ``audits`` simulated one-run audits that the audit's own decision refutes when the full
    batch ``run`` (exactly μ-GDP) adds σ/``deficit``: each pooled run draws fresh secret bits and scores,
    members N(deficit·μ, 1) against N(0, 1), and guesses with ``guess_rule``; either test, at
    ``confidences`` as :func:`one_run_deficit` takes them. What :func:`one_run_deficit` predicts is checked
    against this (tests/test_power.py, benchmarks/power_check.py)."""
    caught = 0
    for _ in range(audits):
        bits = [rng.choice(np.array([-1, 1], dtype=np.int8), size=m) for m in run_sizes]
        scores = [rng.standard_normal(m) + deficit * run.mu * (b == 1) for m, b in zip(run_sizes, bits)]
        caught += audit_refutes(
            scores, bits, run, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidences=confidences
        )
    return caught / audits


def every_update_detection(
    claim: ClaimedRun,
    *,
    truth: ClaimedRun,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    delta: float,
    confidences: tuple[float, float],
    audits: int,
    rng: np.random.Generator,
) -> float:
    """The share of ``audits`` simulated every-update audits of Dirac canaries that the audit's own decision
    refutes when the run ``claim`` states was in fact ``truth`` (its σ, q and steps): every canary of each
    pooled run gets a fresh secret bit, and at each of truth's steps a member is sampled with truth's q
    and shows s_t = 1{sampled} + σ·Z (c_t = 1: a clipped Dirac canary's whole gradient on its column, up to
    a/√(a² + 1)), scored by its log-likelihood ratio under ``claim``
    (:func:`~dpverify.stats.scoring.subsampled_gaussian_log_likelihood_ratio`) and tested against ``claim``'s
    ε at ``delta`` and its curve. With ``truth == claim`` the scores come from exactly the claimed
    mechanism: the null simulation of design rule 9."""
    caught, claimed_epsilon = 0, claim.epsilon(delta)
    for _ in range(audits):
        bits = [rng.choice(np.array([-1, 1], dtype=np.int8), size=m) for m in run_sizes]
        scores = []
        for m, b in zip(run_sizes, bits):
            sampled = (rng.random((m, truth.steps)) < truth.sampling_rate) & (b == 1)[:, None]
            shown = sampled + truth.noise_multiplier * rng.standard_normal((m, truth.steps))
            scores.append(
                subsampled_gaussian_log_likelihood_ratio(
                    np.ones_like(shown), shown, noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate
                )
            )
        caught += audit_refutes(
            scores, bits, claim, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidences=confidences
        )
    return caught / audits


def audit_refutes(
    scores: list[np.ndarray],
    bits: list[np.ndarray],
    run: ClaimedRun,
    *,
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidences: tuple[float, float],
) -> bool:
    """The one-run audit's decision on each pooled run's ``scores`` and secret ``bits``: the (ε, δ) test
    against ``claimed_epsilon`` on all of them, else the curve test of ``run`` (the runs' counts combined),
    at ``confidences`` as :func:`one_run_deficit` takes them; the decision alone, without the search for
    the weakest refuted member that the audit reports beside it."""
    steinke, curve_level = (guess_rule.corrected_confidence(c) for c in confidences)
    run_sizes = tuple(len(s) for s in scores)
    total, run_counts = int(sum(run_sizes)), guess_rule.run_counts(run_sizes)
    counts = guess_rule.counts(total)
    correct = correct_counts(np.concatenate(scores), np.concatenate(bits), counts, sides=guess_rule.sides)
    if np.any(steinke_refutes(total, counts, correct, epsilon=claimed_epsilon, delta=delta, confidence=steinke)):
        return True
    per_run = np.array([correct_counts(s, b, row, sides=guess_rule.sides) for s, b, row in zip(scores, bits, run_counts)])
    if len(run_sizes) == 1:
        refuted = curve_refutes(total, run_counts[0], per_run[0], curve=run.curve(), confidence=curve_level)
    else:
        refuted = combined_refutes(run_sizes, run_counts, per_run, curve=run.curve(), confidence=curve_level)
    return bool(np.any(refuted))


def _percentile_counts(mean: np.ndarray, sd: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The counts' 20th percentile (normal approximation), as integers in [0, count]."""
    return np.clip(np.floor(mean - _Z_POWER * sd), 0, counts).astype(np.int64)


def _expected_correct(m, counts, mu: float, sides: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the correct guesses among ``counts`` guesses on ``m`` canaries, half
    of them members scored N(μ, 1) and the rest N(0, 1): ⌈count/2⌉ "member" guesses on the top scores
    (``sides="one"``: all of them) and the rest "non-member" guesses on the bottom ones, each end's
    precision read at the score threshold that yields its share of guesses."""
    m = np.asarray(m, dtype=float)
    counts = np.asarray(counts, dtype=float)
    top = counts if sides == "one" else np.ceil(counts / 2)
    bottom = counts - top
    # Top end: threshold t with m(Φ̄(t−μ) + Φ̄(t))/2 = top; members above it m·Φ̄(t−μ)/2.
    t = _threshold(lambda x: (special.ndtr(mu - x) + special.ndtr(-x)) / 2, top / m)
    precision_top = np.where(top > 0, m * special.ndtr(mu - t) / 2 / np.maximum(top, 1), 0.0)
    # Bottom end: threshold u with m(Φ(u−μ) + Φ(u))/2 = bottom; non-members below it m·Φ(u)/2.
    u = -_threshold(lambda x: (special.ndtr(-x - mu) + special.ndtr(-x)) / 2, bottom / m)
    precision_bottom = np.where(bottom > 0, m * special.ndtr(u) / 2 / np.maximum(bottom, 1), 0.0)
    precision_top, precision_bottom = np.clip(precision_top, 0, 1), np.clip(precision_bottom, 0, 1)
    mean = top * precision_top + bottom * precision_bottom
    variance = top * precision_top * (1 - precision_top) + bottom * precision_bottom * (1 - precision_bottom)
    return mean, np.sqrt(variance)


def _threshold(tail: Callable[[np.ndarray], np.ndarray], share: np.ndarray) -> np.ndarray:
    """x with ``tail(x)`` = ``share`` for a decreasing ``tail``, by vectorised bisection."""
    share = np.asarray(share, dtype=float)
    low, high = np.full(share.shape, -40.0), np.full(share.shape, 40.0)
    for _ in range(80):
        mid = (low + high) / 2
        above = tail(mid) > share
        low, high = np.where(above, mid, low), np.where(above, high, mid)
    return (low + high) / 2


def two_world_deficit(
    run: ClaimedRun,
    *,
    fraction: float,
    runs: int,
    refutes: Callable[[np.ndarray, np.ndarray], bool],
    seed: int,
) -> float:
    """k* of a two-world audit of ``runs`` runs per world of the claimed ``run`` whose scores carry
    ``fraction`` of its signal: the least deficit at which :data:`POWER` of :data:`TWO_WORLD_SIMULATIONS`
    simulated audits (D scores N(0, 1), D′ scores N(ρ·μ(σ/k), 1), the same draws at every k) are refuted
    by ``refutes(scores_d, scores_dprime)``, the audit's own test."""
    if not fraction > 0 or run.noise_multiplier == 0:
        return math.inf
    mu_at = _deficit_mu(run, fraction)
    rng = np.random.default_rng(seed)
    null = rng.standard_normal((TWO_WORLD_SIMULATIONS, 2, runs))
    needed = math.ceil(POWER * TWO_WORLD_SIMULATIONS)

    def refuted(k: float) -> bool:
        shift = mu_at(k)
        hits = 0
        for index, (d, dprime) in enumerate(null):
            hits += refutes(d, dprime + shift)
            if hits >= needed or hits + TWO_WORLD_SIMULATIONS - index - 1 < needed:
                break
        return hits >= needed

    return _smallest(refuted)


def measure_power(
    run: ClaimedRun,
    scores,
    membership,
    *,
    smallest_deficit: Callable[[float], float],
    expected_signal: float | None = None,
    either_direction: bool = False,
    not_designated: str | None = None,
) -> AuditPower:
    """The :class:`AuditPower` of an audit of ``run`` from its ``scores`` and secret bits: ρ from
    :func:`separation`, k* = ``smallest_deficit(ρ)``, and why a pass could not see (``blind``): the scores
    do not separate at all; ρ's whole interval lies below ``expected_signal`` (what the design carries in a
    correct implementation; ``None``: not known for this design); or it would catch no deficit up to
    :data:`LARGEST_DEFICIT`. ``either_direction``: the test reads the
    scores either way up (a two-world threshold picks its direction), so ρ is the separation's size.
    ``not_designated``: the black box showed it is not the designated model (why), which blinds the audit
    whatever ρ."""
    mu = gdp_mu(run)
    measured = separation(scores, membership)
    if either_direction and measured.mu < 0:
        measured = Separation(-measured.mu, -measured.high, -measured.low)
    fraction, low, high = (value / mu if mu > 0 else math.nan for value in (measured.mu, measured.low, measured.high))
    deficit = smallest_deficit(fraction) if math.isfinite(fraction) else math.inf
    carried = f"its canaries carried {fraction:.0%} of the claimed signal (95% interval {low:.0%} to {high:.0%})"
    if not_designated:
        blind = f"{not_designated} ({carried})"
    elif not math.isfinite(fraction):
        blind = "its scores do not separate the canaries at all: did training ignore them?"
    elif expected_signal is not None and high < expected_signal:
        blind = (
            f"{carried}, where this design carries at least {expected_signal:.0%} in a correct implementation: "
            "the model is likely not the designated one (a zero-initialised softmax regression when "
            "hidden_width = 0), or training ignored the canaries"
        )
    elif math.isinf(deficit):
        blind = f"it could not have caught even a {LARGEST_DEFICIT:g}× noise deficit: {carried}"
    else:
        blind = None
    return AuditPower(
        claimed_mu=mu,
        measured_mu=measured.mu,
        signal_fraction=fraction,
        signal_low=low,
        signal_high=high,
        smallest_deficit=deficit,
        blind=blind,
    )


def judge(verdict: str, power: AuditPower | None) -> tuple[str, AuditPower | None]:
    """``(verdict, power)`` once power is weighed: a pass that could not see is ``undecided``; elsewhere the
    verdict stands and ``blind`` is dropped (a refuted claim was seen; an audit out of reach says so itself)."""
    if power is None or power.blind is None:
        return verdict, power
    if verdict == "pass":
        return "undecided", power
    return verdict, dataclasses.replace(power, blind=None)
