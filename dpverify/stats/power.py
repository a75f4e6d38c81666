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

k* is predicted from the score distribution the claim implies for a Dirac canary (one that owns an input
coordinate of a softmax regression): its score sums its clipped gradient over the steps Poisson sampling
takes it in, B ~ Binomial(T, q) for a member, plus the noise of every step. Standardised by the
non-members' spread, a member scores :math:`x \cdot B/(qT) + Z` and a non-member Z, with x the expected
separation; under a deficit k the noise shrinks k-fold, so x = k·μ̂ grows linearly in k (at q = 1, B = T
and this is the Gaussian shift k·μ̂). μ̂ is taken at its lower confidence limit capped at the claim
(``measure_power`` states k* at min(ρ_low, 1), μ̂ = min(ρ_low, 1)·μ): a k* from the point estimate is
caught less than 0.8 of the time whenever the estimate runs high, and ρ is measured on the
implementation's own scores, so a hidden noise deficit k₀ raises it about k₀-fold: uncapped, the bug the
audit should catch would lower the k* it states (a 1.6× deficit stated k* 1.25 at q = 1). ρ above 1 is
evidence against the claim, never a reason to promise more; :attr:`AuditPower.above_claim` says so.
(The central-limit μ(σ/k) of a subsampled claim grows faster than linearly in k and stated k* caught
6–24 % of the time at q < 1.)

One-run audits (:func:`one_run_deficit`): :func:`refuted_separation` simulates the audits' scores under the
claim's q, T and pooled runs (fresh secret bits and participations, the same draws at every x), puts each
through the audit's own decision (:func:`~dpverify.stats.decision.audit_decision`: the same tests, guess
grid and level rule as the verdict's), and bisects for the least x that enough of them refute
(:func:`_needed`: a true rate of 0.8 would reach it with probability ≤ 5 %). Detection depends on k only
through x, so this runs once per configuration (about a second for the quick profile) and
k* = x*/(min(ρ_low, 1)·μ).
Two-world audits (:func:`two_world_deficit`) simulate their runs' scores the same way and run their own test.
The callers state k* only where this model has been checked against real noise deficits
(benchmarks/results/kstar-validation.md: reference-dpsgd and opacus-ghost, q = 1 and q < 1); elsewhere it
is ``None``, "not stated", and one simulated separation (:func:`one_run_catches`) says whether it is ∞.
benchmarks/results/power-check.md checks it against scores drawn from DP-SGD on Dirac canaries rather than from
the model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import special, stats

from dpverify.stats.curves import ClaimedRun
from dpverify.stats.decision import audit_decision, audit_refutes
from dpverify.stats.scoring import GuessRule, subsampled_gaussian_log_likelihood_ratio

__all__ = [
    "AuditPower",
    "Separation",
    "audit_refutes",
    "every_update_detection",
    "gdp_mu",
    "judge",
    "measure_power",
    "one_run_catches",
    "one_run_deficit",
    "refuted_separation",
    "separation",
    "two_world_deficit",
]

#: The detection probability k* promises.
POWER = 0.8
#: The largest deficit looked for: an audit that cannot catch a 10× noise deficit could not see.
LARGEST_DEFICIT = 10.0
#: The most signal a correct implementation's canaries carry: ρ = 1, a perfect attacker on the claimed
#: mechanism. k* is stated at ρ's lower limit capped here (:func:`measure_power`).
CLAIMED_SIGNAL = 1.0
#: How precisely the bisections locate k* (relative).
_DEFICIT_TOLERANCE = 0.03
#: Simulated audits per deficit in :func:`two_world_deficit` (common random numbers across deficits).
TWO_WORLD_SIMULATIONS = 40
#: Simulated one-run audits behind a k*: as many as keep their scores within _SIMULATED_SCORES, between the
#: two bounds (60 up to 10⁴ canaries; fewer ask for a larger share refuted, :func:`_needed`). Detection
#: rises steeply with the separation (from 0.02 to 0.97 between 0.85·x* and x* at 4 × 2500 canaries), so
#: the share asked for moves k* by about 1 %.
_SIMULATED_SCORES = 600_000
_MIN_SIMULATIONS, _MAX_SIMULATIONS = 40, 60
#: The expected separations a one-run k* is searched between: below 0.1 no audit refutes a claim that adds
#: noise, above 100 one that does not refute is blind.
_SMALLEST_SEPARATION, _LARGEST_SEPARATION = 0.1, 100.0


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
    if run.sampling_rate == 1:  # a full-batch event, which states no μ of its own: exactly μ-GDP
        return scale * math.sqrt(run.steps) / run.noise_multiplier
    try:
        grown = math.expm1(run.noise_multiplier**-2)
    except OverflowError:  # σ below about 0.038: e^{1/σ²} is past a float, and so is μ
        return math.inf
    return scale * run.sampling_rate * math.sqrt(run.steps * grown)


@dataclass(frozen=True, kw_only=True)
class AuditPower:
    r"""What one audit could have caught.

    ``claimed_mu`` is the claimed mechanism's GDP μ, ``measured_mu`` the members' separation μ̂ in the
    audit's scores and ``signal_fraction`` ρ = μ̂/μ with its interval (``signal_low``, ``signal_high``);
    ``smallest_deficit`` is k* (∞: no deficit up to :data:`LARGEST_DEFICIT` would be refuted with
    probability :data:`POWER`; ``None``: not stated, the design has no validated model of its scores under
    a deficit, or not asked, ``deficit_asked`` false, where the audit refuted the claim: k* is what a pass
    promises, and a refuted claim was seen). ``blind`` says why a pass could not see, or is ``None``.
    """

    claimed_mu: float
    measured_mu: float
    signal_fraction: float
    signal_low: float
    signal_high: float
    smallest_deficit: float | None
    blind: str | None = None
    deficit_asked: bool = True

    @property
    def above_claim(self) -> bool:
        """Whether ρ's whole interval lies above :data:`CLAIMED_SIGNAL`: more signal than the claimed
        mechanism lets any attacker see, which only a weaker mechanism than claimed gives."""
        return self.signal_low > CLAIMED_SIGNAL

    def above_claim_sentence(self) -> str:
        """What ρ above the claim means, in words ("" when it is not): evidence against the claim that is
        not a test at the audit's level, so the claim is refuted only by the audit's two tests."""
        if not self.above_claim:
            return ""
        reach = (
            f"; they refute it with probability ≥ {POWER:g} once the noise is {self.smallest_deficit:.2f}× "
            "weaker than claimed (k*)"
            if self.smallest_deficit is not None and math.isfinite(self.smallest_deficit)
            else ""
        )
        return (
            f"ρ's interval lies above 1: more signal than the claim allows, as a noise deficit of about "
            f"{self.signal_fraction:.2f}× would give. The interval is no test at the audit's level: the claim is "
            f"refuted only if the (ε, δ) test or the curve test refutes it{reach}."
        )

    def to_dict(self) -> dict[str, float | str | None]:
        """JSON-ready: a non-finite number is ``None`` (k* = ∞ reads "none up to LARGEST_DEFICIT"; a k* not
        stated is ``deficit_stated`` false)."""

        def number(value: float | None) -> float | None:
            return round(float(value), 4) if value is not None and math.isfinite(value) else None

        return {
            "claimed_mu": number(self.claimed_mu),
            "measured_mu": number(self.measured_mu),
            "signal_fraction": number(self.signal_fraction),
            "signal_interval": [number(self.signal_low), number(self.signal_high)],
            "smallest_deficit": number(self.smallest_deficit),
            "deficit_stated": self.smallest_deficit is not None,
            "deficit_asked": self.deficit_asked,
            "power": POWER,
            "largest_deficit": LARGEST_DEFICIT,
            "blind": self.blind,
            "above_claim": self.above_claim,
        }


def _deficit(ratio: float) -> float:
    """A deficit k as stated: at least 1 (the claimed noise itself), ∞ beyond :data:`LARGEST_DEFICIT`."""
    return math.inf if not ratio <= LARGEST_DEFICIT else max(1.0, ratio)


def _smallest(refuted: Callable[[float], bool], low: float, high: float, start: float | None = None) -> float:
    """The least x in [``low``, ``high``] with ``refuted(x)`` (monotone), by bisection in log x to
    :data:`_DEFICIT_TOLERANCE`, bracketed first by halving or doubling from ``start`` when given (fewer
    calls when k* lies near it); ∞ when even ``high`` is not refuted."""
    known: dict[float, bool] = {}

    def test(x: float) -> bool:
        if x not in known:
            known[x] = bool(refuted(x))
        return known[x]

    if not test(high):
        return math.inf
    if start is not None:
        x = min(max(start, low), high)
        if test(x):
            while x > low and test(max(x / 2, low)):
                x = max(x / 2, low)
            low, high = max(x / 2, low), x
        else:
            while x < high and not test(min(2 * x, high)):
                x = min(2 * x, high)
            low, high = x, min(2 * x, high)
    if test(low):
        return low
    while high / low > 1 + _DEFICIT_TOLERANCE:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if test(mid) else (mid, high)
    return high


def _needed(simulations: int) -> int:
    """The least number of refuted audits out of ``simulations`` that a true detection rate of :data:`POWER`
    reaches with probability at most 5 % (one-sided binomial): a k* read from it errs towards the larger
    deficit."""
    return int(stats.binom.ppf(0.95, simulations, POWER)) + 1


def _participations(rng: np.random.Generator, run: ClaimedRun, shape) -> np.ndarray:
    """How many of the claim's T steps each member took part in, over the expected number qT: Binomial(T, q)/qT
    (1 at full batch)."""
    if run.sampling_rate == 1:
        return np.ones(shape)
    return rng.binomial(run.steps, run.sampling_rate, size=shape) / (run.sampling_rate * run.steps)


def one_run_deficit(
    run: ClaimedRun,
    *,
    fraction: float,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidence: float,
) -> float:
    """k* of a one-run audit (pooled runs of ``run_sizes`` canaries) whose canaries carry ``fraction`` of the
    claimed signal: the least deficit k at which the expected separation
    k·ρ·μ reaches :func:`refuted_separation`'s. Detection depends on k only through that product, so the
    simulation is run once per configuration."""
    if not fraction > 0 or run.noise_multiplier == 0:
        return math.inf
    setting = _setting(
        run_sizes=run_sizes, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidence=confidence
    )
    needed = refuted_separation(run, **setting)
    return _deficit(needed / (fraction * gdp_mu(run)))


def one_run_catches(run: ClaimedRun, *, fraction: float, **setting) -> bool:
    """Whether the one-run audit of :func:`one_run_deficit` (the same keyword arguments) refutes a
    :data:`LARGEST_DEFICIT`-fold noise deficit where its canaries carry ``fraction`` of the claimed signal:
    its simulated audits at the one separation LARGEST_DEFICIT·ρ·μ (detection rises with it), where
    :func:`one_run_deficit` searches for the least. This is all a design whose k* is not stated needs (is a
    pass blind? is its k* ∞?), at an eighth of the search's cost."""
    separation = LARGEST_DEFICIT * fraction * gdp_mu(run) if fraction > 0 and run.noise_multiplier > 0 else 0.0
    if not separation >= _SMALLEST_SEPARATION:  # where one_run_deficit's search starts: none is caught below
        return False
    detection = _simulation(run, **_setting(**setting))
    return detection.refuted(min(separation, _LARGEST_SEPARATION)) >= detection.needed


def _setting(*, run_sizes, guess_rule, claimed_epsilon, delta, confidence) -> dict:
    """What a simulated one-run audit depends on beside the claimed run, as plain, hashable values (the
    caches' key), by keyword."""
    return dict(
        run_sizes=tuple(int(m) for m in run_sizes),
        guess_rule=guess_rule,
        claimed_epsilon=float(claimed_epsilon),
        delta=float(delta),
        confidence=float(confidence),
    )


@functools.lru_cache(maxsize=256)
def refuted_separation(
    run: ClaimedRun,
    *,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidence: float,
) -> float:
    """The least expected separation x (members' mean score over the non-members' spread) at which the
    audit's own decision refutes :data:`POWER` of its simulated audits, counted as :func:`_needed` says; ∞
    beyond :data:`_LARGEST_SEPARATION`. Cached per configuration: one costs 2-3 s of CPU at the quick
    profile's 4 × 2500 canaries, about 45 s at the standard profile's 100 × 2500."""
    detection = _simulation(
        run, run_sizes=run_sizes, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidence=confidence
    )

    def refuted(x: float) -> bool:
        return detection.refuted(x) >= detection.needed

    return _smallest(refuted, _SMALLEST_SEPARATION, _LARGEST_SEPARATION, start=min(gdp_mu(run), _LARGEST_SEPARATION))


@functools.lru_cache(maxsize=2)
def _simulation(run, *, run_sizes, guess_rule, claimed_epsilon, delta, confidence) -> "_OneRunSimulation":
    """The simulated audits of one configuration, kept for the configuration's next audit (the few latest:
    each holds its draws, about 10 MB at the quick profile's 4 × 2500 canaries)."""
    return _OneRunSimulation(run, run_sizes, guess_rule, claimed_epsilon, delta, confidence)


class _OneRunSimulation:
    """Simulated one-run audits of a Dirac canary's scores under the claim's sampling (module docstring),
    drawn once and rescaled for every separation x (common random numbers), decided by the audit's own
    decision (:func:`~dpverify.stats.decision.audit_decision`) at the audit's level. Seeded, so that a
    configuration always states the same k*."""

    def __init__(self, run, run_sizes, guess_rule, claimed_epsilon, delta, confidence):
        total = int(sum(run_sizes))
        self.simulations = int(np.clip(_SIMULATED_SCORES // total, _MIN_SIMULATIONS, _MAX_SIMULATIONS))
        self.needed = _needed(self.simulations)
        rng = np.random.default_rng(0)
        shape = (self.simulations, total)
        self.member = rng.integers(0, 2, size=shape, dtype=np.int8) == 1
        self.shift = np.where(self.member, _participations(rng, run, shape), 0.0)
        self.noise = rng.standard_normal(shape)
        self.decision = audit_decision(
            run, run_sizes=run_sizes, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidence=confidence
        )
        self.run = np.broadcast_to(np.repeat(np.arange(len(run_sizes), dtype=np.int16), run_sizes), shape)
        self.edges = np.cumsum((0, *run_sizes))

    def refuted(self, separation: float) -> int:
        """How many simulated audits the decision refutes at expected separation ``separation`` (the
        curve test is skipped once the (ε, δ) test alone decides against :attr:`needed`)."""
        order = np.argsort(-(self.noise + separation * self.shift), axis=1, kind="stable")
        ranked, runs = np.take_along_axis(self.member, order, axis=1), np.take_along_axis(self.run, order, axis=1)
        decision, sides = self.decision, self.decision.guess_rule.sides
        correct = _correct_counts(ranked, decision.counts, sides)  # (S, K)

        def run_correct(rows: np.ndarray) -> np.ndarray:
            # Each run's ranking is the pooled one restricted to its canaries: a stable sort by run keeps it.
            by_run = np.take_along_axis(ranked[rows], np.argsort(runs[rows], axis=1, kind="stable"), axis=1)
            return np.stack(
                [
                    _correct_counts(by_run[:, a:b], row, sides)
                    for a, b, row in zip(self.edges[:-1], self.edges[1:], decision.run_counts)
                ]
            )  # (R, S', K)

        def curve_needed(hits: np.ndarray) -> bool:
            return hits.sum() < self.needed <= hits.size

        return int(decision.refutes(correct, run_correct, curve_needed=curve_needed).sum())


def _correct_counts(ranked: np.ndarray, counts: np.ndarray, sides: str) -> np.ndarray:
    """:func:`~dpverify.stats.scoring.correct_counts` for every row at once, from the secret bits ranked by
    score (``ranked``: member or not, highest score first): the ⌈count/2⌉ highest guessed members and the
    ⌊count/2⌋ lowest non-members (``sides="one"``: the ``count`` highest)."""
    zero = np.zeros((ranked.shape[0], 1), dtype=np.int64)
    top = np.concatenate([zero, np.cumsum(ranked, axis=1)], axis=1)
    bottom = np.concatenate([zero, np.cumsum(~ranked[:, ::-1], axis=1)], axis=1)
    counts = np.asarray(counts, dtype=np.int64)
    positives = counts if sides == "one" else (counts + 1) // 2
    return top[:, positives] + bottom[:, counts - positives]


def two_world_deficit(
    run: ClaimedRun,
    *,
    fraction: float,
    runs: int,
    refutes: Callable[[np.ndarray, np.ndarray], bool],
    seed: int,
) -> float:
    """k* of a two-world audit of ``runs`` runs per world of the claimed ``run`` whose scores carry
    ``fraction`` of its signal: the least deficit at which the audit's
    own test ``refutes(scores_d, scores_dprime)`` refutes enough of :data:`TWO_WORLD_SIMULATIONS` simulated
    audits (:func:`_needed`): D scores N(0, 1), D′ scores N(k·ρ·μ·B/(qT), 1) with B ~ Binomial(T, q) the
    record's participations, the same draws at every k."""
    if not fraction > 0 or run.noise_multiplier == 0:
        return math.inf
    separation = fraction * gdp_mu(run)
    rng = np.random.default_rng(seed)
    null = rng.standard_normal((TWO_WORLD_SIMULATIONS, 2, runs))
    shift = _participations(rng, run, (TWO_WORLD_SIMULATIONS, runs))
    needed = _needed(TWO_WORLD_SIMULATIONS)

    def refuted(k: float) -> bool:
        hits = 0
        for index, ((d, dprime), participations) in enumerate(zip(null, shift)):
            hits += refutes(d, dprime + k * separation * participations)
            if hits >= needed or hits + TWO_WORLD_SIMULATIONS - index - 1 < needed:
                break
        return hits >= needed

    return _smallest(refuted, 1.0, LARGEST_DEFICIT)


def measure_power(
    run: ClaimedRun,
    scores,
    membership,
    *,
    smallest_deficit: Callable[[float], float] | None = None,
    catches_largest: Callable[[float], bool] | None = None,
    expected_signal: float | None = None,
    either_direction: bool = False,
    not_designated: str | None = None,
    refuted: bool = False,
) -> AuditPower:
    """The :class:`AuditPower` of an audit of ``run`` from its ``scores`` and secret bits: ρ from
    :func:`separation`; k* at ρ's lower limit capped at :data:`CLAIMED_SIGNAL`,
    ``smallest_deficit(ρ)``·ρ/min(ρ_low, 1) (detection depends on k only through k·ρ, so this is k* of the
    capped limit; where k* at ρ is the floor 1, ``smallest_deficit`` is asked at the capped limit itself;
    never below the claimed mechanism's); and why a
    pass could not see (``blind``): the scores do not separate at all; ρ's whole interval lies below
    ``expected_signal`` (what the design carries in a correct implementation; ``None``: not known for this
    design); or it would catch no deficit up to
    :data:`LARGEST_DEFICIT` at the measured ρ (the lower limit may state none where the pass still saw:
    a k* is a promise, blindness a finding). ``either_direction``: the test reads the
    scores either way up (a two-world threshold picks its direction), so ρ is the separation's size.
    ``not_designated``: the black box showed it is not the designated model (why), which blinds the audit
    whatever ρ. Give ``catches_largest(ρ)`` (is a :data:`LARGEST_DEFICIT`-fold deficit caught at signal
    fraction ρ?) instead of ``smallest_deficit`` where the design's scores under a deficit are not those of
    the model: a finite k* is then not stated (``None``), and that check alone says whether k* is ∞ (at ρ's
    lower limit) and whether the pass is blind (at ρ). ``refuted``: the audit refuted the claim, so neither
    question is asked (their simulated audits are most of the cost): ρ is measured, k* is not asked and no
    blindness is judged (:func:`judge` drops it for any verdict but a pass)."""
    if (smallest_deficit is None) == (catches_largest is None):
        raise ValueError("give smallest_deficit (k* stated) or catches_largest (not stated), not both or neither")
    mu = gdp_mu(run)
    measured = separation(scores, membership)
    if either_direction and measured.mu < 0:
        measured = Separation(-measured.mu, -measured.high, -measured.low)
    fraction, low, high = (value / mu if mu > 0 else math.nan for value in (measured.mu, measured.low, measured.high))
    if refuted:
        return AuditPower(
            claimed_mu=mu, measured_mu=measured.mu, signal_fraction=fraction, signal_low=low, signal_high=high,
            smallest_deficit=None, deficit_asked=False,
        )  # fmt: skip
    # k* is promised at ρ's lower limit capped at 1: ρ above 1 is what a hidden noise deficit shows, so it
    # never lowers k* below the claimed mechanism's own (CLAIMED_SIGNAL).
    promised_at = min(low, CLAIMED_SIGNAL)
    if smallest_deficit is not None:
        deficit = smallest_deficit(fraction) if math.isfinite(fraction) else math.inf
        if not (low > 0 and math.isfinite(deficit)):
            promised = math.inf
        elif deficit > 1:  # k·ρ is what detection reads: scaled from ρ to the capped limit exactly
            promised = _deficit(deficit * fraction / promised_at)
        else:  # k* at ρ is the floor 1, which says too little to scale: asked at the capped limit itself
            promised = smallest_deficit(promised_at)
    else:  # asked at the capped limit first: a memoising catches_largest (detection rises with ρ) may then
        # settle ρ itself without another simulation
        caught_at_limit = low > 0 and catches_largest(promised_at)
        deficit = math.inf if not (math.isfinite(fraction) and catches_largest(fraction)) else None
        promised = math.inf if deficit is not None or not caught_at_limit else None
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
    elif deficit is not None and math.isinf(deficit):
        blind = f"it could not have caught even a {LARGEST_DEFICIT:g}× noise deficit: {carried}"
    else:
        blind = None
    return AuditPower(
        claimed_mu=mu,
        measured_mu=measured.mu,
        signal_fraction=fraction,
        signal_low=low,
        signal_high=high,
        smallest_deficit=promised,
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


def every_update_detection(
    claim: ClaimedRun,
    *,
    truth: ClaimedRun,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    delta: float,
    confidence: float,
    audits: int,
    rng: np.random.Generator,
    signal: float = 1.0,
) -> float:
    """The share of ``audits`` simulated every-update audits of Dirac canaries that the audit's own decision
    refutes when the run ``claim`` states was in fact ``truth`` (its σ, q and steps): every canary of each
    pooled run gets a fresh secret bit, and at each of truth's steps a member is sampled with truth's q
    and shows s_t = 1{sampled} + σ·Z (c_t = 1: a clipped Dirac canary's whole gradient on its column, up to
    a/√(a² + 1)), scored by its log-likelihood ratio under ``claim``
    (:func:`~dpverify.stats.scoring.subsampled_gaussian_log_likelihood_ratio`) and tested against ``claim``'s
    ε at ``delta`` and its curve. With ``truth == claim`` the scores come from exactly the claimed
    mechanism: the null simulation of design rule 9. ``signal`` < 1: a sampled member's step shows only that
    fraction of its clipped gradient, s_t = signal + σ·Z (canaries that carry a fraction ρ of the claimed signal)."""
    caught, claimed_epsilon = 0, claim.epsilon(delta)
    for _ in range(audits):
        bits = [rng.choice(np.array([-1, 1], dtype=np.int8), size=m) for m in run_sizes]
        scores = []
        for m, b in zip(run_sizes, bits):
            sampled = (rng.random((m, truth.steps)) < truth.sampling_rate) & (b == 1)[:, None]
            shown = signal * sampled + truth.noise_multiplier * rng.standard_normal((m, truth.steps))
            scores.append(
                subsampled_gaussian_log_likelihood_ratio(
                    np.ones_like(shown), shown, noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate
                )
            )
        caught += audit_refutes(
            scores, bits, claim, guess_rule=guess_rule, claimed_epsilon=claimed_epsilon, delta=delta, confidence=confidence
        )
    return caught / audits
