"""A trained run's claim as the audit tests it: converted to the design's neighbouring relation
(:func:`claim_in_relation`), the mechanism it describes (:func:`claimed_run`), and the check that a claim does
not contradict its own numbers (:func:`claim_inconsistency`).
"""

from __future__ import annotations

import math


from dpverify.audits.training import AuditFailure, ClaimContradictsItself, ClaimNotTestable, ScoredRun
from dpverify.contract import PrivacyClaim, TrainedModel
from dpverify.stats.accounting import optimistic_epsilon
from dpverify.stats.curves import ClaimedMechanism, ClaimedRun

#: For each relation an audit tests in, the other relations whose claims it can test: replacing a record by
#: another is removing it and adding the other, or zeroing it out and filling the null record in, so a
#: mechanism private for add/remove or zero-out neighbours is private for replace-one neighbours, with the
#: curve its own mechanism has in that relation. Nothing else follows: a replace-one or zero-out claim
#: bounds only datasets of one size, which an add/remove audit's datasets are not.
DERIVED_RELATIONS: dict[str, tuple[str, ...]] = {"replace_one": ("add_remove", "zero_out")}
#: What the datasets of an audit in each relation differ by.
NEIGHBOURS = {
    "add_remove": "one has one record more",
    "replace_one": "one record's value differs",
    "zero_out": "one record is replaced by a null record",
}


def relation_gap(claimed: str, tested: str) -> str | None:
    """Why a claim stated in relation ``claimed`` cannot be tested by an audit whose datasets are ``tested``
    neighbours, or ``None`` when it can (the same relation, or one of :data:`DERIVED_RELATIONS`)."""
    if claimed == tested or claimed in DERIVED_RELATIONS.get(tested, ()):
        return None
    testable = [r for r in NEIGHBOURS if r == claimed or claimed in DERIVED_RELATIONS.get(r, ())]
    return (
        f"the claim is stated for {claimed} neighbours, and this audit's datasets are {tested} neighbours "
        f"({NEIGHBOURS[tested]}), which a {claimed} claim does not bound; audit it in the "
        f"{' or '.join(testable)} relation"
    )


def claim_in_relation(claim: PrivacyClaim, relation: str) -> tuple[float, str]:
    """The claimed run's ε in ``relation``, and how it was obtained; :class:`ClaimNotTestable` with the
    reason when the claim cannot be tested there (:func:`relation_gap`) or its event cannot be accounted.

    The same relation: the claim as stated. Otherwise (:data:`DERIVED_RELATIONS`) the ε of the claimed
    mechanism in that relation: a claim's event by dp_accounting's PLD accountant, DP-SGD's (σ, q, steps, δ)
    by our own upper-bounding PLD accountant; never below the library's own ε. This trusts that the claim's
    mechanism is the one the run used; the inclusion design tests the library's ε as stated, without that
    assumption.
    """
    gap = relation_gap(claim.relation, relation)
    if gap is not None:
        raise ClaimNotTestable(gap)
    if claim.dp_event is not None:
        from dpverify.stats.events import UnaccountableEvent

        try:
            derived = claimed_run(claim, relation).epsilon(claim.delta)
        except UnaccountableEvent as exc:
            raise ClaimNotTestable(str(exc)) from exc
        source = f"the claimed event's {relation} ε = {derived:.4g} by dp_accounting's PLD accountant"
        if claim.relation == relation:
            return claim.epsilon, f"as stated by {claim.accountant} ({source})"
        return max(derived, claim.epsilon), f"{source}; {claim.accountant} states {claim.relation} ε = {claim.epsilon:.4g}"
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
        f"{relation} ε of the claimed run ({claim.mechanism}) by dpverify's PLD accountant; {claim.accountant} "
        f"states {claim.relation} ε = {claim.epsilon:.4g}"
    )


def claimed_run(claim: PrivacyClaim, relation: str) -> ClaimedMechanism:
    """The mechanism ``claim`` describes, in ``relation``, whose whole trade-off curve the claim asserts
    (design rule 9): its dp_accounting event (:class:`~dpverify.stats.events.EventRun`), or DP-SGD's σ, q and
    steps (:class:`~dpverify.stats.curves.ClaimedRun`). A mechanism of another kind is resolved here."""
    if claim.dp_event is not None:
        from dpverify.stats.events import EventRun

        return EventRun(event=claim.dp_event, relation=relation)
    return ClaimedRun(
        noise_multiplier=claim.noise_multiplier, sampling_rate=claim.sampling_rate, steps=claim.steps, relation=relation
    )


def claim_inconsistency(claim: PrivacyClaim) -> str | None:
    """Why the stated ε cannot hold for the run the claim itself describes, or ``None``.

    A claim whose ε is below the least ε of its own mechanism in its own relation is refuted by its own
    numbers, with certainty: it is not silently tested at the larger value (design rule 8). The least ε is
    a certified lower bound (DP-SGD's numbers: :func:`~dpverify.stats.accounting.optimistic_epsilon`, the
    exact GDP ε at q = 1; an event: dp_accounting's PLD ε less its discretisation's reach,
    :meth:`~dpverify.stats.events.EventRun.least_epsilon`), so no correct accountant, however tight, is
    refuted; the pessimistic ε the audit tests with is an upper bound, and would refute correct claims of
    tighter accountants than ours. An event dp_accounting cannot account is not checked here (its audit is
    ``undecided``, :func:`claim_in_relation`)."""
    if not math.isfinite(claim.epsilon):
        return None
    run = claimed_run(claim, claim.relation)
    if claim.dp_event is not None:
        from dpverify.stats.events import UnaccountableEvent

        try:
            least = run.least_epsilon(claim.delta)
        except UnaccountableEvent:
            return None
        source = "dp_accounting's PLD accountant, less its discretisation"
    elif run.mu is not None:  # full batch: exactly Gaussian DP
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
        f"describes ({claim.mechanism}) has at least {claim.relation} ε = {least:.4g} by {source}: the claim "
        "contradicts its own numbers"
    )


def claimed_epsilon(trained: TrainedModel | ScoredRun, relation: str) -> tuple[float, str]:
    """:func:`claim_in_relation` of a trained model's or a scored run's claim; a claim that cannot be
    converted fails, one that cannot be tested there is not run (:class:`ClaimNotTestable`) unless it
    contradicts its own numbers (:class:`ClaimContradictsItself`)."""
    claim = trained.claim
    if math.isnan(claim.epsilon):
        raise AuditFailure("its claim states ε = nan", device=trained.device)
    try:
        return claim_in_relation(claim, relation)
    except ClaimNotTestable as exc:
        contradiction = claim_inconsistency(claim)  # a claim refuted by its own numbers is so in any design
        if contradiction is not None:
            raise ClaimContradictsItself(contradiction, device=trained.device) from exc
        raise ClaimNotTestable(exc.cause, device=trained.device) from exc
    except Exception as exc:
        raise AuditFailure(f"its claim could not be converted to {relation}: {exc}", device=trained.device) from exc


def claimed_numbers(claim: PrivacyClaim) -> tuple:
    """What a claim states (ε, δ, its mechanism and noise structure, relation): the pooled runs of one audit
    must state the same."""
    event = None if claim.dp_event is None else repr(claim.dp_event)  # an event that composes a list is not hashable
    mechanism = (claim.noise_multiplier, claim.sampling_rate, claim.steps, event, claim.noise_structure)
    return (claim.epsilon, claim.delta, *mechanism, claim.relation)
