"""What an audit can decide before it trains: the confidence its tests share and its looks, the ceiling ε_O of
its (ε, δ) test, whether its curve test can refute anything, the canaries a claim needs, and the claim an
auditor designates so that an undecidable audit is refused up front (:func:`one_run_undecidable`).

The lowest floor of :mod:`dpverify.audits`, beside :mod:`~dpverify.audits.membership`: nothing here trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from dpverify.contract import DPHyperparameters
from dpverify.stats.bounds import epsilon_lower_bound
from dpverify.stats.curves import ClaimedRun, GaussianCurve, combined_refutes, curve_refutes
from dpverify.stats.looks import POOLED_LOOKS, look_schedule
from dpverify.stats.scoring import GuessRule


Progress = Callable[[str], None]


class AuditSettings(Protocol):
    """What the shared steps read of a design's config (:class:`dpverify.config.AuditConfig`,
    :class:`dpverify.audits.language.LanguageAuditConfig`)."""

    design: str
    confidence: float
    seed: int
    timeout: float | None
    guess_rule: GuessRule
    hyperparameters: DPHyperparameters

    @property
    def relation(self) -> str: ...

    @property
    def audit_size(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


#: Largest m :func:`canaries_needed` looks at; past it the δ term 2mδ of Theorem 1 dominates anyway.
MAX_CANARIES = 10_000_000


def resolve_device(device: str) -> str:
    """``auto`` means CUDA when torch sees a GPU, else CPU; ``cuda`` without a GPU is a ``ValueError``
    (never a silent run on the CPU under a CUDA label). Importing torch happens only here, lazily."""
    if device == "cpu":
        return device
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if device == "cuda" and not available:
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU here; use 'auto' (CUDA when available) or 'cpu'")
    return "cuda" if available else "cpu"


def split_confidence(confidence: float) -> tuple[float, float]:
    """``(Steinke's, the curve test's)`` confidence: the audit's level is split evenly between the (ε, δ)
    test and the curve test (Bonferroni), so a verdict from either keeps ``confidence``; each then splits
    its share across the guess grid."""
    alpha = (1.0 - confidence) / 2.0
    return 1.0 - alpha, 1.0 - alpha


def pooled_looks(config: AuditSettings) -> list[tuple[int, float]]:
    """The looks at the audit's pooled runs, ``[(runs, confidence), ...]`` (:data:`~dpverify.stats.looks.POOLED_LOOKS`)."""
    return look_schedule(getattr(config, "pooled_runs", 1), config.confidence, looks=POOLED_LOOKS)


def final_look_confidence(config: AuditSettings) -> float:
    """The confidence of the audit's last look, on all its runs: the one a pass is decided at."""
    return pooled_looks(config)[-1][1]


def audit_ceiling(config: AuditSettings, m: int | None = None, *, delta: float | None = None) -> float:
    """ε_O of this audit: the largest ε_L its (ε, δ) test could report at its last look, every guess correct,
    at ``delta`` (the claim's; the requested δ before there is a claim)."""
    m = config.audit_size if m is None else m
    delta = config.hyperparameters.delta if delta is None else delta
    counts = config.guess_rule.counts(m)
    confidence = config.guess_rule.corrected_confidence(split_confidence(final_look_confidence(config))[0])
    return float(np.max(epsilon_lower_bound(m, counts, counts, delta=delta, confidence=confidence)))


def curve_test_can_refute(
    config: AuditSettings, m: int | None = None, *, sizes: tuple[int, ...] | None = None, mu: float = 0.0
) -> bool:
    """Whether every guess right would let the curve test refute the μ-GDP curve, by default even a perfectly
    private mechanism's (μ = 0: f(α) = 1 − α). When it cannot, no claimed curve is within this audit's reach;
    when it can, some claims are, whatever their ε, so an audit above its ceiling ε_O may still decide.
    Pooled runs are asked what the audit will ask them: each run's counts, combined; ``sizes`` (each run's
    canaries) defaults to ``(m,)`` when m is given, else to the config's own split."""
    if sizes is None:
        sizes = getattr(config, "canaries_per_run", (config.audit_size,)) if m is None else (m,)
    confidence = config.guess_rule.corrected_confidence(split_confidence(final_look_confidence(config))[1])
    curve = GaussianCurve(mu=mu)
    if len(sizes) == 1:
        counts = config.guess_rule.counts(sizes[0])
        return bool(np.any(curve_refutes(sizes[0], counts, counts, curve=curve, confidence=confidence)))
    counts = config.guess_rule.run_counts(sizes)
    return bool(np.any(combined_refutes(sizes, counts, counts, curve=curve, confidence=confidence)))


def canaries_needed(config: AuditSettings, claimed_epsilon: float, *, delta: float | None = None) -> int | None:
    """Smallest m whose ceiling exceeds ``claimed_epsilon`` (None when no m up to MAX_CANARIES does)."""
    if not math.isfinite(claimed_epsilon):
        return None
    low, high = config.audit_size, config.audit_size
    while audit_ceiling(config, high, delta=delta) <= claimed_epsilon:
        low, high = high, high * 2
        if high > MAX_CANARIES:
            return None
    while high - low > max(1, low // 100):
        mid = (low + high) // 2
        low, high = (low, mid) if audit_ceiling(config, mid, delta=delta) > claimed_epsilon else (mid, high)
    return high


@dataclass(frozen=True)
class Undecidable:
    """Why an audit could only end undecided, known before any training: ``setting`` is what sets its reach
    (``m``, the canaries or records; ``runs``, a two-world audit's runs per world), ``value`` its value and
    ``needed`` the smallest value that would decide (``None``: none up to the search's limit, ``limit``);
    ``alternative``, another fix where there is one."""

    setting: str
    value: int
    needed: int | None
    limit: int
    reason: str
    alternative: str | None = None

    def message(self, *, spelled: str | None = None) -> str:
        """The refusal in words, ending with the fix: the setting ``spelled`` as the face takes it (``--m ``,
        ``--set runs=``; by default ``m=``)."""
        spelled = f"{self.setting}=" if spelled is None else spelled
        if self.needed is None:
            fix = f"no {self.setting} up to {self.limit:,} can decide it"
        else:
            fix = f"use {spelled}{self.needed} or more"
        alternative = f", or {self.alternative}" if self.alternative else ""
        return f"{self.reason}, so the audit could only end undecided; {fix}{alternative}"


@dataclass(frozen=True)
class DesignatedClaim:
    """What an audit asks the implementation to claim, known before training: ``epsilon``, the least ε a
    claim at it may state (the target ε, or the ε of the run a noise multiplier designates: exact at q = 1,
    where the run is μ-GDP; 0 at q < 1, where dpverify's accountant bounds ε only from above), in words as
    ``what``; ``expected``, the ε to size the audit for (dpverify's accountant's at q < 1); and the GDP
    ``mu`` of the designated run at q = 1 (``None`` at q < 1), where a target ε designates the μ-GDP run
    whose ε it is."""

    epsilon: float
    what: str
    expected: float
    mu: float | None = None


def designated_claim(config: AuditSettings) -> DesignatedClaim | None:
    """:class:`DesignatedClaim` of ``config``'s privacy target in its design's relation; ``None`` for
    non-private training (σ = 0 or ε = ∞), which no audit refutes and which is run on purpose."""
    hp = config.hyperparameters
    if hp.target_epsilon is not None:
        if hp.sampling_rate < 1:
            return target_claim(hp.target_epsilon)
        run = ClaimedRun(noise_multiplier=1.0 / _full_batch_mu(hp.target_epsilon, hp.delta), steps=1, relation=config.relation)
        return target_claim(hp.target_epsilon, mu=run.mu)
    if not hp.noise_multiplier:
        return None
    run = ClaimedRun(noise_multiplier=hp.noise_multiplier, sampling_rate=hp.sampling_rate, steps=hp.steps, relation=config.relation)
    epsilon = run.epsilon(hp.delta)
    if run.mu is None:
        return DesignatedClaim(
            0.0, f"any ε (σ = {hp.noise_multiplier:g} at q = {hp.sampling_rate:g}: ε ≤ {epsilon:.3f} by dpverify's accountant)", epsilon
        )
    return DesignatedClaim(epsilon, f"the designated run's ε = {epsilon:.3f} (σ = {hp.noise_multiplier:g})", epsilon, run.mu)


#: Largest m the search for the canaries a curve test needs looks at: its cost grows with m (0.4 s at 10⁴).
CURVE_SEARCH_LIMIT = 2**14


def smallest_deciding(decides: Callable[[int], bool], *, start: int, limit: int) -> int | None:
    """The smallest count above ``start`` for which ``decides`` (growing with the count) holds, to within
    1 %, or ``None`` when none up to ``limit`` does."""
    low, high = start, max(start * 2, start + 1)
    while not decides(high):
        low, high = high, high * 2
        if high > limit:
            return None
    while high - low > max(1, low // 100):
        middle = (low + high) // 2
        low, high = (low, middle) if decides(middle) else (middle, high)
    return high


def target_claim(epsilon: float, *, mu: float | None = None) -> DesignatedClaim:
    """:class:`DesignatedClaim` of a target ε (of a μ-GDP run when ``mu`` is given)."""
    return DesignatedClaim(epsilon, f"the target ε = {epsilon:g}", epsilon, mu)


def _full_batch_mu(epsilon: float, delta: float) -> float:
    """The μ whose μ-GDP run is ``epsilon``-DP at ``delta`` (add/remove; ε grows with μ)."""
    from scipy.optimize import brentq

    def excess(log_mu: float) -> float:
        return ClaimedRun(noise_multiplier=math.exp(-log_mu), steps=1).epsilon(delta) - epsilon

    return math.exp(brentq(excess, math.log(1e-6), math.log(1e3), xtol=1e-8))


def one_run_undecidable(config: AuditSettings, *, run_sizes: tuple[int, ...] | None = None) -> Undecidable | None:
    """Why a one-run audit under ``config`` could only end undecided, before training, or ``None``: its
    designated claim (:func:`designated_claim`) is at or above its ceiling ε_O and its curve test cannot
    refute the designated curve (any curve unless σ is given at q = 1). ``run_sizes``: the canaries of each
    pooled run (default: the config's own split, or one run of all m)."""
    claim = designated_claim(config)
    if claim is None:
        return None
    m = config.audit_size
    sizes = run_sizes or getattr(config, "canaries_per_run", (m,))
    ceiling = audit_ceiling(config)
    if claim.epsilon < ceiling or curve_test_can_refute(config, sizes=sizes, mu=claim.mu or 0.0):
        return None

    def curve_decides(canaries: int) -> bool:
        """Whether ``canaries``, split over as many runs as now, could refute the designated curve."""
        share, extra = divmod(canaries, len(sizes))
        split = tuple(share + (run < extra) for run in range(len(sizes)))
        return min(split) >= 1 and curve_test_can_refute(config, sizes=split, mu=claim.mu or 0.0)

    by_epsilon = canaries_needed(config, claim.expected)
    curve_limit = min(by_epsilon or MAX_CANARIES, CURVE_SEARCH_LIMIT)
    by_curve = None  # searched only for a known curve, and only where it could beat the (ε, δ) test
    if claim.mu is not None and m < curve_limit and curve_decides(curve_limit):
        by_curve = smallest_deciding(curve_decides, start=m, limit=curve_limit)
    needed = min((n for n in (by_epsilon, by_curve) if n is not None), default=None)
    return Undecidable(
        setting="m",
        value=m,
        needed=needed,
        limit=MAX_CANARIES if claim.mu is None else CURVE_SEARCH_LIMIT,
        alternative="lower the target ε" if config.hyperparameters.target_epsilon is not None else "raise the noise multiplier",
        reason=f"m = {m} canaries can show at most ε_O = {ceiling:.3f} (confidence {config.confidence:.4g}), not above "
        f"{claim.what}, and too few to refute the claimed mechanism's trade-off curve",
    )
