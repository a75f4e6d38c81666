"""A trained run's claim as the audit tests it: converted to the design's neighbouring relation
(:func:`claim_in_relation`), the mechanism it describes (:func:`claimed_run`), and the check that a claim does
not contradict its own numbers (:func:`claim_inconsistency`).
"""

from __future__ import annotations

import math


from dpverify.audits.training import AuditFailure, ScoredRun
from dpverify.contract import PrivacyClaim, TrainedModel
from dpverify.stats.accounting import optimistic_epsilon
from dpverify.stats.curves import ClaimedRun


def claim_in_relation(claim: PrivacyClaim, relation: str) -> tuple[float, str]:
    """The claimed run's ε in ``relation``, and how it was obtained.

    The same relation: the claim as stated. Otherwise the ε of the Poisson-subsampled Gaussian with the
    claim's (σ, q, steps, δ) in that relation, by our own upper-bounding PLD accountant (never below the
    library's own ε). This trusts that the claim's numbers are those the run used; the inclusion design
    tests the library's ε as stated, without that assumption.
    """
    if claim.relation == relation:
        return claim.epsilon, f"as stated by {claim.accountant}"
    from dpverify.stats import accounting

    convert = accounting.replace_one_epsilon if relation == "replace_one" else accounting.add_remove_epsilon
    derived = convert(
        noise_multiplier=claim.noise_multiplier,
        sampling_rate=claim.sampling_rate,
        steps=claim.steps,
        delta=claim.delta,
    )
    return max(float(derived), claim.epsilon), (
        f"{relation} ε of the claimed run (σ={claim.noise_multiplier:.4g}, q={claim.sampling_rate:g}, "
        f"steps={claim.steps}) by dpverify's PLD accountant; {claim.accountant} states "
        f"{claim.relation} ε = {claim.epsilon:.4g}"
    )


def claimed_run(claim: PrivacyClaim, relation: str) -> ClaimedRun:
    """The mechanism ``claim`` describes, in ``relation``: its σ, q and steps, whose whole trade-off curve
    the claim asserts (design rule 9)."""
    return ClaimedRun(
        noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate, steps=claim.steps, relation=relation
    )


def claim_inconsistency(claim: PrivacyClaim) -> str | None:
    """Why the stated ε cannot hold for the run the claim itself describes, or ``None``.

    A claim whose ε is below the least ε of its own (σ, q, steps) in its own relation is refuted by its own
    numbers, with certainty: it is not silently tested at the larger value (design rule 8). The least ε is
    a certified lower bound (:func:`~dpverify.stats.accounting.optimistic_epsilon`; the exact GDP ε at
    q = 1), so no correct accountant, however tight, is refuted; the pessimistic ε the audit tests with is
    an upper bound, and would refute correct claims of tighter accountants than ours."""
    if not math.isfinite(claim.epsilon):
        return None
    run = claimed_run(claim, claim.relation)
    if run.mu is not None:  # full batch: exactly Gaussian DP
        least, source = run.epsilon(claim.delta), "the exact Gaussian-DP accountant"
    else:
        source = "dpverify's optimistic PLD accountant"
        least = optimistic_epsilon(
            noise_multiplier=claim.noise_multiplier,
            sampling_rate=claim.sampling_rate,
            steps=claim.steps,
            delta=claim.delta,
            relation=claim.relation,
        )
    if claim.epsilon >= least:
        return None
    return (
        f"{claim.accountant} states {claim.relation} ε = {claim.epsilon:.4g} at δ = {claim.delta:g}, but the run it "
        f"describes (σ = {claim.noise_multiplier:.4g}, q = {claim.sampling_rate:g}, {claim.steps} steps) has "
        f"at least {claim.relation} ε = {least:.4g} by {source}: the claim contradicts its own numbers"
    )


def claimed_epsilon(trained: TrainedModel | ScoredRun, relation: str) -> tuple[float, str]:
    """:func:`claim_in_relation` of a trained model's or a scored run's claim; a claim that cannot be
    converted fails."""
    claim = trained.claim
    if math.isnan(claim.epsilon):
        raise AuditFailure("its claim states ε = nan", device=trained.device)
    try:
        return claim_in_relation(claim, relation)
    except Exception as exc:
        raise AuditFailure(f"its claim could not be converted to {relation}: {exc}", device=trained.device) from exc


def claimed_numbers(claim: PrivacyClaim) -> tuple:
    """What a claim states (ε, δ, σ, q, steps, relation): the pooled runs of one audit must state the same."""
    return (claim.epsilon, claim.delta, claim.noise_multiplier, claim.sampling_rate, claim.steps, claim.relation)
