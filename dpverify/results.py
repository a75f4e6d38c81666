"""The outcome of one audit, and the exception a violated claim raises."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, TypeVar

import numpy as np

from dpverify._text import decided_by, deficit_text
from dpverify.canaries.worlds import WORLDS
from dpverify.stats.power import LARGEST_DEFICIT, POWER, AuditPower

Verdict = Literal["pass", "violation", "undecided", "error"]
VERDICTS: tuple[str, ...] = ("pass", "violation", "undecided", "error")
T = TypeVar("T")
#: What :attr:`AuditResult.auxiliary_failures` calls a failure to measure the power (ρ, k*).
POWER_STEP = "power"


def beside_verdict(what: str, compute: Callable[[], T], failures: list[tuple[str, str]]) -> T | None:
    """``compute()``, or ``None`` with ``(what, "Type: message")`` added to ``failures``: an auxiliary
    computation (power, the claim check, plots, the report entry) runs after the verdict is decided, and a
    failure there is reported beside the verdict, never in its place (design rule 15)."""
    try:
        return compute()
    except Exception as exc:
        failures.append((what, f"{type(exc).__name__}: {exc}"))
        return None


@dataclass(frozen=True, kw_only=True, eq=False)
class AuditResult:
    """One audit: what was claimed, what the audit could show, and the verdict.

    Two tests share the audit's ``confidence`` (half the level each, then Bonferroni over the guess grid),
    both at the δ the claim holds at (``delta``):

    - the (ε, δ) test of H0 "the run is (ε, δ)-DP in ``relation``" with ε = ``claimed_epsilon``. By Theorem 1
      (Steinke, Nasr & Jagielski 2023), under H0 the number of correct guesses W out of r satisfies
      P[W ≥ v] ≤ β + 2mδ·α (β a Binomial(r, e^ε/(1+e^ε)) tail), so the run's true ε is at least
      ``epsilon_lower_bound`` (ε_L);
    - the curve test of H0 "the run is f-DP" for the trade-off curve f of the mechanism the claim states
      (σ, q, steps, in ``relation``: exact GDP with μ = √steps/σ at q = 1, the PLD-derived envelope
      otherwise), by the one-run recursion of Mahloujifar, Melis & Chaudhuri 2024. ``curve_refuted`` says
      whether it refuted f; ``curve_epsilon_lower_bound`` is the ε at δ of the weakest member of the claim's
      family (less noise) it still refutes, to compare with ``curve_claimed_epsilon``, the claimed curve's
      own ε at δ; ``curve_p_value`` its smallest tail bound; ``curve_mu`` the refuted GDP μ at q = 1.
      ``curve_runs`` > 1: the canaries came from that many independent runs, each tested on its own and
      their p-values combined (Fisher), which sees what the runs' independence adds.

    The verdict is

    - ``violation`` when ε_L > claimed ε or the curve test refutes the claimed curve: the claim is refuted
      at the stated confidence; or when the claim contradicts its own numbers (``claim_consistent`` false:
      its ε is below a certified lower bound on the ε of its own σ, q and steps; ``claim_derivation`` says
      by how much);
    - ``undecided`` when neither test could refute the claim at this m (claimed ε ≥ ``optimal_epsilon``,
      ε_O, the most the (ε, δ) test could show, and the claimed curve out of reach even with every guess
      correct): the audit could never have failed; ``canaries_needed`` says how many canaries would make
      the (ε, δ) test decisive;
    - ``error`` when training, the black box or the claim failed (``error`` says why): never a pass; no
      bound was computed, so ``epsilon_lower_bound`` and ``claimed_epsilon`` are NaN (``null`` in the report);
    - ``undecided`` too when a pass could not see (``power.blind`` says why): its canaries carried much less
      of the claimed signal than the design does in a correct implementation, or no noise deficit up to
      10× would have been caught;
    - ``pass`` otherwise. A pass is not a proof of privacy: ε_L is a lower bound. ``power``
      (:class:`~dpverify.stats.power.AuditPower`) says what it could have caught: the signal fraction ρ its
      canaries carried and k*, the smallest noise deficit (σ/k added where σ is claimed) it refutes with
      probability ≥ 0.8.

    ``test_accuracy`` (data-dependent designs only) is the main head's accuracy on the held-out split: the
    utility the audit left the model with (the paper's Case II trade-off).

    ``confidence`` is this audit's own level after the session has divided its level among its audits.

    ``threshold`` (two-world design only) is where the (ε, δ) test split the runs' scores.

    ``observed`` is what the audit's adversary saw (design rule 16): ``"final model"`` (the black box
    after training) or ``"every update"`` (the parameters after every step,
    :attr:`~dpverify.contract.Request.observe_update`), the adversary a DP-SGD accountant's ε bounds.
    ``not_run`` says why an audit whose adversary needs what the trainer did not hand over did not run: its
    verdict is then ``undecided``, never a pass.

    ``auxiliary_failures``: what failed after the verdict was decided, as ``(what, error)`` pairs (power,
    the claim check, plots, the report entry); the verdict stands beside them, except that a pass whose
    power could not be measured is ``undecided`` (a pass states its power, design rule 13).

    Every audit builds its result with :func:`audit_result`; a field it did not measure keeps its default
    here (NaN: no value; no guesses).
    """

    implementation: str
    expected: str = "private"
    detectability: str | None = None
    design: str
    relation: str
    claimed_epsilon: float = math.nan
    library_epsilon: float | None = None
    claim_derivation: str = ""
    delta: float
    epsilon_lower_bound: float = math.nan
    curve_epsilon_lower_bound: float | None = None
    curve_claimed_epsilon: float | None = None
    curve_refuted: bool = False
    curve_p_value: float | None = None
    curve_mu: float | None = None
    curve_runs: int = 1
    threshold: float | None = None
    claim_consistent: bool = True
    estimator: str = "steinke"
    confidence: float
    m: int
    guesses: int = 0
    correct: int = 0
    optimal_epsilon: float = math.nan
    canaries_needed: int | None = None
    verdict: Verdict
    seed: int
    device: str
    seconds: float
    auditor_seconds: float = 0.0
    error: str | None = None
    test_accuracy: float | None = None
    power: AuditPower | None = None
    config: dict[str, Any] = field(default_factory=dict)
    observed: str = "final model"
    not_run: str | None = None
    scores: np.ndarray | None = field(default=None, repr=False)
    membership: np.ndarray | None = field(default=None, repr=False)
    bound_by_guesses: tuple[tuple[int, int, float], ...] = field(default=(), repr=False)
    auxiliary_failures: tuple[tuple[str, str], ...] = ()

    def to_dict(self, *, include_scores: bool = False) -> dict[str, Any]:
        """JSON-ready fields; raw scores only on request.

        Every number field is a JSON number or ``null``. ``null`` means +∞ when the field's name is in the
        list ``infinite`` (a non-private run's claimed ε), and no value otherwise (an errored audit's ε_L
        and claim, a design without test accuracy). JSON has no ∞, and a string in a number field breaks
        every reader that sums or compares it."""
        out: dict[str, Any] = {
            "implementation": self.implementation,
            "expected": self.expected,
            "detectability": self.detectability,
            "design": self.design,
            "relation": self.relation,
            "observed": self.observed,
            "not_run": self.not_run,
            "claimed_epsilon": _json_float(self.claimed_epsilon),
            "library_epsilon": _json_float(self.library_epsilon),
            "claim_derivation": self.claim_derivation,
            "delta": self.delta,
            "epsilon_lower_bound": _json_float(self.epsilon_lower_bound),
            "estimator": self.estimator,
            "curve_epsilon_lower_bound": _json_float(self.curve_epsilon_lower_bound),
            "curve_claimed_epsilon": _json_float(self.curve_claimed_epsilon),
            "curve_refuted": self.curve_refuted,
            "curve_p_value": _json_float(self.curve_p_value),
            "curve_mu": _json_float(self.curve_mu),
            "curve_runs": self.curve_runs,
            "threshold": _json_float(self.threshold),
            "claim_consistent": self.claim_consistent,
            "confidence": self.confidence,
            "optimal_epsilon": _json_float(self.optimal_epsilon),
            "canaries_needed": self.canaries_needed,
            "m": self.m,
            "guesses": self.guesses,
            "correct": self.correct,
            "verdict": self.verdict,
            "seed": self.seed,
            "device": self.device,
            "seconds": round(self.seconds, 3),
            "auditor_seconds": round(self.auditor_seconds, 3),
            "error": self.error,
            "test_accuracy": _json_float(self.test_accuracy),
            "power": None if self.power is None else self.power.to_dict(),
            "config": self.config,
            "bound_by_guesses": [list(row) for row in self.bound_by_guesses],
            "auxiliary_failures": [{"what": what, "error": error} for what, error in self.auxiliary_failures],
        }
        out["infinite"] = [name for name in _NUMBER_FIELDS if _is_infinite(getattr(self, name))]
        for name in out["infinite"]:
            out[name] = None
        if include_scores and self.scores is not None:
            out["scores"] = self.scores.tolist()
            out["membership"] = None if self.membership is None else self.membership.tolist()
        return out

    @property
    def _counted(self) -> str:
        if self.design == "two_world":
            return f"held-out runs placed in the right world, {self.m} runs per world"
        return f"guesses correct on m = {self.m} canaries"

    def summary(self) -> str:
        """One paragraph a person can act on; should its wording fail, the verdict in a bare sentence that
        says so (the text is computed after the verdict and never loses it)."""
        try:
            return self._summary() + self._failures_sentence()
        except Exception as exc:
            return self._bare(exc)

    def headline(self) -> str:
        """The audit in one line: the verdict (what a pass could catch), both tests and which decided,
        the claim and the signal its canaries carried (the bare verdict should the wording fail)."""
        try:
            return self._headline()
        except Exception as exc:
            return self._bare(exc)

    def _bare(self, exc: Exception) -> str:
        return (
            f"{self.implementation}: verdict {str(self.verdict).upper()} ({self.design} design); claimed ε = "
            f"{self.claimed_epsilon!r} at δ = {self.delta!r}, ε_L = {self.epsilon_lower_bound!r}; error: {self.error!r} "
            f"(the full text of this verdict could not be written: {type(exc).__name__}: {exc})"
        )

    def _failures_sentence(self) -> str:
        if not self.auxiliary_failures:
            return ""
        failed = "; ".join(f"{what}: {error}" for what, error in self.auxiliary_failures)
        return f" Failed beside the verdict, which stands: {failed}."

    @property
    def power_failed(self) -> bool:
        """Whether measuring the power failed (a pass is then ``undecided``)."""
        return any(what == POWER_STEP for what, _ in self.auxiliary_failures)

    def _summary(self) -> str:
        if self.not_run:
            return (
                f"{self.implementation}: verdict UNDECIDED ({self.design} design, {self.relation} relation, adversary "
                f"saw: {self.observed}). Not run: {self.not_run}"
            )
        if self.verdict == "undecided" and math.isnan(self.epsilon_lower_bound):  # refused before training
            return f"{self.implementation}: verdict UNDECIDED ({self.design} design, {self.relation} relation). {self.claim_derivation}"
        if self.verdict == "error":  # no claim, no bound: only what went wrong
            return (
                f"{self.implementation}: verdict ERROR ({self.design} design, {self.relation} relation, m = {self.m}). "
                f"The audit could not run: {self.error}"
            )
        head = (
            f"{self.implementation}: verdict {self.verdict.upper()} ({self.design} design, {self.relation} relation, "
            f"adversary saw: {self.observed}). "
            f"Claimed ε = {self.claimed_epsilon:.4g} at δ = {self.delta:g}; "
            f"audit lower bound ε_L = {self.epsilon_lower_bound:.4g} at {self.confidence:.4%} confidence "
            f"({self.correct} of {self.guesses} {self._counted}, {self.estimator} bound); "
            f"the most this audit could show is ε_O = {self.optimal_epsilon:.4g}."
        )
        if self.curve_claimed_epsilon is not None:
            head += (
                f" Curve test of the claimed mechanism (ε = {self.curve_claimed_epsilon:.4g} at δ = {self.delta:g}): "
                f"{'REFUTED' if self.curve_refuted else 'not refuted'}, weakest refuted member at "
                f"ε = {self.curve_epsilon_lower_bound:.4g}"
                + (f" (GDP μ = {self.curve_mu:.4g})" if self.curve_mu else "")
                + f", smallest tail bound {self.curve_p_value:.3g}"
                + (f" (Fisher's combination over {self.curve_runs} independent runs)." if self.curve_runs > 1 else ".")
            )
        if not self.claim_consistent:
            head += f" {self.claim_derivation}."
        if self.test_accuracy is not None:
            head += f" Test accuracy of the audited model: {self.test_accuracy:.2%}."
        power = self.power_sentence()
        if power:
            head += f" {power}"
        if self.verdict == "violation":
            return head + (
                f" Refuted by {self.decided_by}."
                " The run leaks more than its claim allows: check that every step clips each example's "
                "gradient, adds N(0, σ²C²) noise to the clipped sum once per step, samples batches the way "
                "the accountant assumes, and that the accountant is given the σ, q and step count actually used."
            )
        if self.verdict == "undecided" and self.blind:
            return head + f" The audit could not see: {self.blind}."
        if self.verdict == "undecided" and self.canaries_needed is None and self.power_failed:
            return head + " Its power could not be measured, and a pass states what it could catch, so it is undecided."
        if self.verdict == "undecided":
            need = f"about {self.canaries_needed}" if self.canaries_needed else "more"
            return head + f" The claim is at or above ε_O, so this audit cannot refute it: use {need} canaries."
        return head


    @property
    def blind(self) -> str | None:
        """Why this audit could not see (its verdict is then ``undecided``), or ``None``."""
        return self.power.blind if self.power is not None and self.verdict == "undecided" else None

    def power_sentence(self) -> str:
        """What the audit could have caught, in words."""
        power = self.power
        if power is None:
            world = (self.config or {}).get("worlds", {}).get("world") if self.design == "two_world" else None
            reads = WORLDS[world].reads if world in WORLDS and self.verdict != "error" else None
            return f"Power: {reads}." if reads else ""
        deficit = (
            "not asked (the claim is refuted)"
            if not power.deficit_asked
            else "not stated (no validated model of this design's scores under a deficit)"
            if power.smallest_deficit is None
            else f"none up to {LARGEST_DEFICIT:g}×"
            if math.isinf(power.smallest_deficit)
            else f"k ≥ {deficit_text(power.smallest_deficit)}"
        )
        return (
            f"Power: its scores carried ρ = {power.signal_fraction:.2f} of the claimed mechanism's signal "
            f"(GDP μ = {power.claimed_mu:.3g}; interval {power.signal_low:.2f} to {power.signal_high:.2f}); the "
            f"smallest noise deficit it would refute with probability ≥ {POWER:g}: {deficit}."
            + (f" {power.above_claim_sentence()}" if power.above_claim else "")
        )

    def _headline(self) -> str:
        if self.verdict == "error":
            return f"error: {(self.error or '').splitlines()[0]}"
        if self.not_run:
            return f"undecided: not run: {self.not_run}"
        tests = f"ε_L = {self.epsilon_lower_bound:.3f} (ε, δ test)"
        if self.curve_epsilon_lower_bound is not None:
            p = "" if self.curve_p_value is None else f", p = {self.curve_p_value:.2g}"
            tests += f", curve ε_L = {self.curve_epsilon_lower_bound:.3f} (curve test{p})"
        decided = "" if self.verdict != "violation" else f" by {self.decided_by}"
        signal = "" if self.power is None else f"; ρ = {self.power.signal_fraction:.2f}"
        accuracy = "" if self.test_accuracy is None else f"; test accuracy {self.test_accuracy:.3f}"
        return f"{self.outcome}{decided}: {tests}; claimed {self.claimed_epsilon:.3f} (ε_O {self.optimal_epsilon:.3f}){signal}{accuracy}"

    @property
    def decided_by(self) -> str:
        """What refuted the claim, in words ("-" when nothing did)."""
        words = {"ε,δ": "the (ε, δ) test", "curve": "the curve test", "claim": "the claim's own numbers"}
        tests = decided_by(self.to_dict()).split("+")
        return " and ".join(words.get(test, test) for test in tests)

    @property
    def outcome(self) -> str:
        """The verdict with what a pass could catch: "pass (would catch a k ≥ 1.6 noise deficit)"."""
        if self.verdict == "pass" and self.power is not None and math.isfinite(self.power.smallest_deficit or math.inf):
            return f"pass (would catch a k ≥ {deficit_text(self.power.smallest_deficit)} noise deficit)"
        return self.verdict


def audit_result(fields: dict[str, Any], *, verdict: Verdict, device: str, seconds: float, **measured: Any) -> AuditResult:
    """The one construction of an :class:`AuditResult`, for every kind of audit and every way it ends: the
    ``fields`` every outcome of the audit shares (:func:`~dpverify.audits.verdict.result_fields`), its
    verdict, where it ran and for how long, and what it ``measured`` (the claim, both tests, the ceiling,
    the power; a measured field replaces a shared one, as the δ the claim holds at does). A field not
    measured keeps its default: an audit that ended before any claim or bound (an error, an audit refused
    before training) has no claimed ε, ε_L or ceiling (NaN, ``null`` in the report) and no guesses."""
    return AuditResult(**{**fields, **measured}, verdict=verdict, device=device, seconds=seconds)


class DPViolation(AssertionError):
    """An audit refuted an implementation's privacy claim. ``result`` holds the :class:`AuditResult`."""

    def __init__(self, result: AuditResult, *, reproduce: str = "") -> None:
        self.result = result
        message = result.summary()
        if reproduce:
            message += f"\nReproduce with: {reproduce}"
        super().__init__(message)


class AuditError(RuntimeError):
    """An audit ended with verdict ``error``: training, the black box or the claim failed."""

    def __init__(self, result: AuditResult) -> None:
        self.result = result
        super().__init__(result.summary())


#: The float fields of :meth:`AuditResult.to_dict` that may be ∞ or have no value.
_NUMBER_FIELDS = (
    "claimed_epsilon",
    "library_epsilon",
    "epsilon_lower_bound",
    "curve_epsilon_lower_bound",
    "curve_claimed_epsilon",
    "curve_mu",
    "optimal_epsilon",
    "test_accuracy",
)


def _is_infinite(value: float | None) -> bool:
    return value is not None and math.isinf(value) and value > 0


def _json_float(value: float | None) -> float | None:
    """A finite float rounded for the report; ``None`` for no value and for ∞ (see ``to_dict``)."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), 6)
