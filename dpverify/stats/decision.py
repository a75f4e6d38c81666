r"""The one-run audit's decision, written once: which of its two tests get the level at this m and these runs
(:func:`audit_decision`), and whether they refute the claim (:meth:`AuditDecision.refutes`). The verdict
(:mod:`dpverify.audits.verdict`) and the simulations that predict what an audit catches
(:mod:`dpverify.stats.power`) both decide through it, so that k* is always the k* of the audit that runs.

**The level rule.** An audit's level 1 − c is shared by the (ε, δ) test (Steinke et al. on the pooled
counts) and the curve test (per run, the runs combined), each then split over the guess grid. A test gets a
share only if it could refute the claim with it: with every guess right, at this m and these runs. Both
tests that can get half each; when only one can, it gets the whole level; when neither can at half, the
whole level goes to one that can with all of it, the curve test first (it tests the whole claimed curve);
when neither can even then, the audit is out of reach (undecided) and the split stays even. The rule reads
only m, the runs' sizes, the guess grid, the level and the claim, never a score, so each test keeps its
share's error rate and the union bound keeps the audit's level.

Why: the (ε, δ) test's ceiling ε_O falls as 2mδ grows and as the level shrinks. The every-update gate's
16 runs of 2500 canaries at δ = 10⁻⁵ claim ε 6.3, against an ε_O of 3.9 at the whole of a 95 % level and 0
at a gate's per-audit level; the quick profile's 10 000 canaries cannot refute ε 2 at a level of 0.05/100.
Half the level spent there would refute nothing (tests/test_decision.py lists the cases).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dpverify.stats.bounds import steinke_refutes
from dpverify.stats.curves import ClaimedRun, CurveTest, combined_curve_test, combined_refutes, curve_refutes, curve_test
from dpverify.stats.scoring import GuessRule, correct_counts

__all__ = ["AuditDecision", "audit_decision", "audit_refutes"]

#: Rows of counts (R runs × rows × K counts) for the rows of a batch of audits it is asked for.
RunCounts = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AuditDecision:
    """How one audit decides at ``confidence``: the claim's mechanism ``run`` and ε (``claimed_epsilon`` at
    ``delta``), the runs' sizes and the guess rule, and each test's confidence from the level rule (module
    docstring): ``steinke_confidence`` for the (ε, δ) test and ``curve_confidence`` for the curve test,
    before the guess grid's correction; ``None`` where the test gets no level. ``decidable``: some test
    could refute the claim with every guess right at its share (else the audit is out of reach)."""

    run: ClaimedRun
    run_sizes: tuple[int, ...]
    guess_rule: GuessRule
    claimed_epsilon: float
    delta: float
    confidence: float
    steinke_confidence: float | None
    curve_confidence: float | None
    decidable: bool

    @property
    def reported_confidences(self) -> tuple[float, float]:
        """The confidences each test's bound is reported at: its share, or half the level where it has
        none. A test without a share could not refute the claim at half the level with every guess right,
        so its bound there stays at or below the claim: a description of the scores that decides nothing."""
        half = 1.0 - (1.0 - self.confidence) / 2.0
        return (self.steinke_confidence or half, self.curve_confidence or half)

    @property
    def counts(self) -> np.ndarray:
        """The pooled runs' guess counts, the (ε, δ) test's (and a single run's curve test's)."""
        return self.guess_rule.counts(int(sum(self.run_sizes)))

    @property
    def run_counts(self) -> np.ndarray:
        """Each run's guess counts (R, K), the curve test's on pooled runs."""
        return self.guess_rule.run_counts(self.run_sizes)

    def steinke_refutes(self, correct: np.ndarray) -> np.ndarray:
        """Per audit and count, whether the (ε, δ) test refutes the claimed ε on the pooled ``correct``
        counts (..., K); never where it has no level."""
        if self.steinke_confidence is None:
            return np.zeros(np.shape(correct), dtype=bool)
        confidence = self.guess_rule.corrected_confidence(self.steinke_confidence)
        total = int(sum(self.run_sizes))
        return np.asarray(
            steinke_refutes(total, self.counts, correct, epsilon=self.claimed_epsilon, delta=self.delta, confidence=confidence)
        )

    def curve_refutes(self, correct: np.ndarray, run_correct: RunCounts) -> np.ndarray:
        """Per audit and count (S, K), whether the curve test refutes the claimed curve: one run's test on
        its pooled ``correct`` counts (S, K), or the runs' tests combined on ``run_correct(rows)`` (R, S, K),
        each run's own guesses on its own scores; never where it has no level."""
        if self.curve_confidence is None:
            return np.zeros(correct.shape, dtype=bool)
        confidence = self.guess_rule.corrected_confidence(self.curve_confidence)
        curve = self.run.curve()
        if len(self.run_sizes) == 1:
            return np.asarray(curve_refutes(self.run_sizes[0], self.counts, correct, curve=curve, confidence=confidence))
        per_run = run_correct(np.arange(correct.shape[0]))  # (R, S, K)
        runs, audits, counts = per_run.shape
        refuted = combined_refutes(
            self.run_sizes,
            np.tile(self.run_counts, (1, audits)),
            per_run.reshape(runs, audits * counts),
            curve=curve,
            confidence=confidence,
        )
        return refuted.reshape(audits, counts)

    def refutes(
        self, correct: np.ndarray, run_correct: RunCounts, *, curve_needed: Callable[[np.ndarray], bool] = lambda hits: True
    ) -> np.ndarray:
        """Per audit of a batch (``correct``: pooled counts, S × K), whether the audit refutes the claim:
        the (ε, δ) test at any count, else the curve test at any count (:meth:`curve_refutes`, asked only
        for the audits the first left standing). ``curve_needed(hits)`` may say, from the first test's
        hits, that the caller needs no more (the curve test is then skipped and only those hits return)."""
        hits = np.any(self.steinke_refutes(correct), axis=-1)
        left = np.flatnonzero(~hits)
        if left.size and curve_needed(hits):
            hits[left] = np.any(self.curve_refutes(correct[left], lambda rows: run_correct(left[rows])), axis=-1)
        return hits

    def curve_test(self, correct: np.ndarray, run_correct: np.ndarray) -> CurveTest:
        """The curve test one audit reports, with the search for the weakest refuted member of the claim's
        family: on the pooled ``correct`` counts (K) for one run, on each run's ``run_correct`` (R, K)
        combined for pooled runs; at :attr:`reported_confidences`."""
        confidence = self.guess_rule.corrected_confidence(self.reported_confidences[1])
        if len(self.run_sizes) == 1:
            return curve_test(self.run_sizes[0], self.counts, correct, claim=self.run, delta=self.delta, confidence=confidence)
        return combined_curve_test(
            self.run_sizes, self.run_counts, run_correct, claim=self.run, delta=self.delta, confidence=confidence
        )


def audit_decision(
    run: ClaimedRun, *, run_sizes: tuple[int, ...], guess_rule: GuessRule, claimed_epsilon: float, delta: float, confidence: float
) -> AuditDecision:
    """The :class:`AuditDecision` of an audit of ``run_sizes`` canaries at ``confidence`` (its look's), its
    level shared by the rule of the module docstring."""
    run_sizes = tuple(int(m) for m in run_sizes)
    shares = _level_shares(run, run_sizes, guess_rule, float(claimed_epsilon), float(delta), float(confidence))
    return AuditDecision(run, run_sizes, guess_rule, float(claimed_epsilon), float(delta), float(confidence), *shares)


@functools.lru_cache(maxsize=256)
def _level_shares(
    run: ClaimedRun, run_sizes: tuple[int, ...], guess_rule: GuessRule, claimed_epsilon: float, delta: float, confidence: float
) -> tuple[float | None, float | None, bool]:
    """``(the (ε, δ) test's confidence, the curve test's, decidable)`` by the level rule; cached per audit
    setting (every look and every simulated audit of one asks the same)."""
    right = guess_rule.counts(int(sum(run_sizes)))[None, :]  # every guess right

    def steinke_can(share: float) -> bool:
        asked = AuditDecision(run, run_sizes, guess_rule, claimed_epsilon, delta, confidence, share, None, True)
        return bool(np.any(asked.steinke_refutes(right)))

    def curve_can(share: float) -> bool:
        asked = AuditDecision(run, run_sizes, guess_rule, claimed_epsilon, delta, confidence, None, share, True)
        return bool(np.any(asked.curve_refutes(right, lambda rows: asked.run_counts[:, None, :])))

    half = 1.0 - (1.0 - confidence) / 2.0
    steinke, curve = steinke_can(half), curve_can(half)
    if steinke and curve:
        return half, half, True
    if steinke or curve:
        return (confidence, None, True) if steinke else (None, confidence, True)
    if curve_can(confidence):
        return None, confidence, True
    if steinke_can(confidence):
        return confidence, None, True
    return half, half, False


def audit_refutes(
    scores: list[np.ndarray],
    bits: list[np.ndarray],
    run: ClaimedRun,
    *,
    guess_rule: GuessRule,
    claimed_epsilon: float,
    delta: float,
    confidence: float,
) -> bool:
    """Whether one audit of the pooled runs' ``scores`` and secret ``bits`` (±1), run after run, refutes the
    claim (``run``, ``claimed_epsilon`` at ``delta``) at ``confidence``: :func:`audit_decision`'s
    decision alone, without the search for the weakest refuted member that a concluded audit reports."""
    decision = audit_decision(
        run, run_sizes=tuple(len(s) for s in scores), guess_rule=guess_rule, claimed_epsilon=claimed_epsilon,
        delta=delta, confidence=confidence,
    )  # fmt: skip
    correct = correct_counts(np.concatenate(scores), np.concatenate(bits), decision.counts, sides=guess_rule.sides)

    def run_correct(rows: np.ndarray) -> np.ndarray:
        per_run = [correct_counts(s, b, row, sides=guess_rule.sides) for s, b, row in zip(scores, bits, decision.run_counts)]
        return np.array(per_run)[:, None, :]

    return bool(decision.refutes(np.asarray(correct)[None, :], run_correct)[0])
