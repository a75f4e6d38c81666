"""Claims stated as dp_accounting events (``PrivacyClaim.dp_event``), tested in their own neighbouring relation.

The audits here run through the real two-world audit (:func:`run_two_world_audit`, its default curve: the
full-batch event's own) on the worst-case-record world, with :class:`~tests.doubles.WorldGaussianMechanism`, the full-batch Gaussian mechanism itself. Its
claim is the same mechanism's event at the true σ (true) or at twice it (too strong: σ claimed 2× above the
truth). Replace-one and zero-out events need dp_accounting >= 0.5 (the jax family's 0.6); under 0.4 they
are ``undecided`` with the reason, which is tested too.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")

from dpverify.audits.claims import claim_in_relation, claim_inconsistency, relation_gap  # noqa: E402
from dpverify.audits.training import ClaimNotTestable  # noqa: E402
from dpverify.audits.two_world import full_batch_gdp_curve, run_two_world_audit  # noqa: E402
from dpverify.canaries.worlds import WORLDS, worst_case_record_worlds  # noqa: E402
from dpverify.contract import DPHyperparameters, PrivacyClaim  # noqa: E402
from dpverify.stats.curves import ClaimedRun  # noqa: E402
from dpverify.stats.events import EventRun, event_relations  # noqa: E402
from tests.doubles import WorldGaussianMechanism, event_claim  # noqa: E402

#: The true σ per world: GDP μ = 2 either way (√T/σ for a record added, 2√T/σ for a label flipped, T = 1),
#: a curve 200 runs per world can refute when the claim is twice too strong.
SIGMA = {"add_remove": 0.5, "replace_one": 1.0}
RUNS = 200
#: (the claim's relation, the world's): zero-out has no world of its own (see World.relations), so its claim
#: is tested by its mechanism's replace-one curve in the replace-one world.
CASES = [("add_remove", "add_remove"), ("replace_one", "replace_one"), ("zero_out", "replace_one")]


def _dpsgd_event(sigma: float, rate: float, steps: int):
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)


def _needs(relation: str) -> None:
    if relation not in event_relations():
        pytest.skip(f"the installed dp_accounting cannot account {relation} (needs >= 0.5: the jax family)")


def _audit(claim_relation: str, world_relation: str, *, claimed_factor: float, seed: int = 0, confidence: float = 0.95):
    """The two-world audit of the Gaussian mechanism at the world's true σ, claiming ``claimed_factor`` × σ."""
    sigma = SIGMA[world_relation]
    return run_two_world_audit(
        WorldGaussianMechanism(noise_multiplier=sigma, claimed_noise=claimed_factor * sigma, relation=claim_relation),
        world=worst_case_record_worlds(relation=world_relation, records=2),
        runs=RUNS,
        hyperparameters=DPHyperparameters(noise_multiplier=sigma, sampling_rate=1.0, epochs=1, delta=1e-5),
        seed=seed,
        confidence=confidence,
    )


# -- validation at the door -------------------------------------------------------------------------------


def test_a_relation_that_is_not_one_is_refused_by_name():
    with pytest.raises(ValueError, match="relation"):
        PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="x", dp_event=_dpsgd_event(1.0, 1.0, 1), relation="zero-out")


def test_an_event_that_is_not_a_dp_event_is_refused_with_what_to_give():
    with pytest.raises(ValueError, match="dp_event must be a dp_accounting DpEvent.*got dict"):
        PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="x", dp_event={"sigma": 1.0})


def test_a_claim_states_its_run_once():
    with pytest.raises(ValueError, match="not both"):
        PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="x", dp_event=_dpsgd_event(1.0, 1.0, 1), noise_multiplier=1.0)
    with pytest.raises(ValueError, match="missing steps"):
        PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="x", noise_multiplier=1.0, sampling_rate=0.5)


# -- one source of truth ----------------------------------------------------------------------------------


@pytest.mark.parametrize("relation", ["add_remove", "replace_one", "zero_out"])
def test_dpsgd_numbers_are_the_event_they_build_and_dp_accounting_agrees_with_our_accountant(relation):
    _needs(relation)
    claim = PrivacyClaim(epsilon=5.0, delta=1e-5, accountant="x", noise_multiplier=1.2, sampling_rate=0.25, steps=8, relation=relation)
    assert claim.event == _dpsgd_event(1.2, 0.25, 8)
    ours = ClaimedRun(noise_multiplier=1.2, sampling_rate=0.25, steps=8, relation=relation).epsilon(1e-5)
    theirs = EventRun(event=claim.event, relation=relation).epsilon(1e-5)
    assert theirs == pytest.approx(ours, rel=2e-3)


# -- the claim check and undecided events -----------------------------------------------------------------


def test_an_event_claim_below_its_own_events_epsilon_contradicts_itself():
    event = _dpsgd_event(1.0, 1.0, 4)
    least = EventRun(event=event).least_epsilon(1e-5)
    assert claim_inconsistency(PrivacyClaim(epsilon=least, delta=1e-5, accountant="x", dp_event=event)) is None
    message = claim_inconsistency(PrivacyClaim(epsilon=0.9 * least, delta=1e-5, accountant="x", dp_event=event))
    assert message is not None and "dp_accounting's PLD accountant" in message


def test_an_event_dp_accounting_cannot_account_is_undecided_with_the_reason():
    claim = PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="x", dp_event=dp_accounting.UnsupportedDpEvent())
    with pytest.raises(ClaimNotTestable, match="cannot account the claimed event"):
        claim_in_relation(claim, "add_remove")
    assert claim_inconsistency(claim) is None  # not a violation either: nothing to check it against


@pytest.mark.skipif("replace_one" in event_relations(), reason="this dp_accounting accounts replace-one")
def test_a_relation_the_installed_dp_accounting_cannot_account_is_undecided():
    result = _audit("replace_one", "replace_one", claimed_factor=1.0)
    assert result.verdict == "undecided" and "dp-accounting >= 0.5" in result.not_run


# -- each world tests the claim's own relation, or says it cannot ----------------------------------------


def test_each_world_is_built_in_the_relations_it_declares():
    for name, world in WORLDS.items():
        assert world.maker().relation == world.relations[0], name
        for relation in world.relations[1:]:
            assert world.maker(relation=relation).relation == relation, name


@pytest.mark.parametrize("claimed", ["replace_one", "zero_out"])
def test_a_size_preserving_claim_in_an_add_remove_world_is_undecided_not_passed(claimed):
    assert relation_gap("add_remove", "replace_one") is None and relation_gap(claimed, "replace_one") is None
    _needs(claimed)
    result = _audit(claimed, "add_remove", claimed_factor=1.0)
    assert result.verdict == "undecided"
    assert f"stated for {claimed} neighbours" in result.not_run and "add_remove neighbours" in result.not_run


# -- through the real audit: a true claim passes, a too-strong one is refuted, per relation --------------


@pytest.mark.parametrize("claimed, world", CASES)
def test_a_true_event_claim_passes_in_its_relation(claimed, world):
    """At the truth the audit refutes with probability at most its level, 1 − confidence = 1 %."""
    _needs(claimed)
    result = _audit(claimed, world, claimed_factor=1.0, confidence=0.99)
    assert result.verdict == "pass", (result.verdict, result.epsilon_lower_bound, result.claimed_epsilon)
    assert math.isclose(result.claimed_epsilon, EventRun(event=_dpsgd_event(SIGMA[world], 1.0, 1), relation=world).epsilon(1e-5), rel_tol=1e-9)


@pytest.mark.parametrize("claimed, world", CASES)
def test_an_event_claim_with_twice_the_true_noise_is_refuted_in_its_relation(claimed, world):
    """σ claimed 2× the truth: GDP μ 1 claimed against 2 true."""
    _needs(claimed)
    result = _audit(claimed, world, claimed_factor=2.0)
    assert result.verdict == "violation", (result.verdict, result.epsilon_lower_bound, result.claimed_epsilon)


def test_a_full_batch_event_claim_asserts_its_event_curve_by_default_and_another_event_none():
    claim = event_claim(noise_multiplier=1.0, steps=2, delta=1e-5, relation="add_remove")
    assert full_batch_gdp_curve(claim, "add_remove") is EventRun(event=claim.dp_event).curve()
    laplace = PrivacyClaim(epsilon=2.0, delta=1e-5, accountant="x", dp_event=dp_accounting.LaplaceDpEvent(1.0))
    assert full_batch_gdp_curve(laplace, "add_remove") is None


def test_event_claims_keep_the_curve_of_their_relation():
    for relation, scale in (("add_remove", 1.0), ("replace_one", 2.0), ("zero_out", 1.0)):
        if relation not in event_relations():
            continue
        curve = EventRun(event=_dpsgd_event(2.0, 1.0, 4), relation=relation).curve()
        mu = scale * math.sqrt(4) / 2.0  # exact GDP at full batch
        from scipy import stats

        alpha = np.array([0.01, 0.1, 0.5])
        exact = stats.norm.cdf(stats.norm.ppf(1 - alpha) - mu)
        assert np.all(curve(alpha) <= exact + 1e-9) and np.allclose(curve(alpha), exact, atol=2e-3)


@pytest.mark.parametrize("relation", ["add_remove", "replace_one", "zero_out"])
@pytest.mark.parametrize("sampling_rate", [0.1, 1.0])
def test_an_event_curves_profile_is_dp_accountings_own_delta_at_each_epsilon(relation, sampling_rate):
    """The profile a curve is built from is dp_accounting's get_delta_for_epsilon on the grid, both directions
    (Poisson-sampled add/remove is asymmetric), from suffix sums instead of its Python loop over the losses."""
    from dpverify.stats.events import _profile_deltas

    _needs(relation)
    run = EventRun(event=_dpsgd_event(1.5, sampling_rate, 20), relation=relation)
    try:
        pld = run.accountant()._pld
    except ValueError as exc:  # UnaccountableEvent: this release cannot sample in this relation
        pytest.skip(str(exc))
    epsilons = np.linspace(0.0, run.accountant().get_epsilon(1e-12), 300)
    np.testing.assert_allclose(_profile_deltas(pld, epsilons), pld.get_delta_for_epsilon(epsilons), rtol=1e-12, atol=1e-15)


# -- the one-run audit reads an event claim's curve from dp_accounting -----------------------------------


def _event_claiming(implementation):
    """``implementation`` stating its own DP-SGD numbers as the event they build instead."""
    from dpverify.contract import TrainedModel

    class EventClaiming(type(implementation)):
        def train(self, request):
            trained = super().train(request)
            claim = dataclasses.replace(
                trained.claim, noise_multiplier=None, sampling_rate=None, steps=None, dp_event=trained.claim.event
            )
            return TrainedModel(predict_log_proba=trained.predict_log_proba, claim=claim, device="cpu")

    return EventClaiming(**{f.name: getattr(implementation, f.name) for f in dataclasses.fields(implementation)})


def test_the_one_run_audit_refutes_an_event_claim_far_below_the_truth_by_its_event_curve():
    from dpverify.audits import run_audit
    from tests.doubles import GaussianMechanism
    from tests.test_audit import small_config

    result = run_audit(_event_claiming(GaussianMechanism(claimed_epsilon=4.0, signal=20.0)), small_config(m=300, sampling_rate=1.0))
    assert result.verdict == "violation" and result.curve_refuted
    assert "by dp_accounting's PLD accountant" in result.claim_derivation


def test_the_two_world_design_chooses_its_worlds_relation_among_those_the_world_can_build():
    from dpverify.config import AuditConfig, apply_overrides

    config = apply_overrides(AuditConfig(), {"design": "two_world", "world": "worst_case_record", "relation": "replace_one"})
    assert config.relation == "replace_one" and config.worlds.worlds().relation == "replace_one"
    with pytest.raises(ValueError, match="dataset_size world's datasets are add_remove neighbours only"):
        apply_overrides(AuditConfig(), {"design": "two_world", "world": "dataset_size", "relation": "replace_one"})
    with pytest.raises(ValueError, match="relation sets the two-world design's neighbours"):
        apply_overrides(AuditConfig(), {"design": "inclusion", "relation": "replace_one"})


def test_an_events_family_scales_every_noise_multiplier_it_holds():
    step = dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(2.0))
    event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(step, 3), dp_accounting.LaplaceDpEvent(4.0)])
    member = EventRun(event=event).with_noise(1.0).member_event  # the reference σ is the first: 2 -> 1 halves all
    halved = dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 3), dp_accounting.LaplaceDpEvent(2.0)]
    )
    assert member == halved
    assert EventRun(event=event).epsilon(1e-5) < EventRun(event=event).with_noise(1.0).epsilon(1e-5)
    with pytest.raises(ValueError, match="not DP-SGD"):
        EventRun(event=event).steps


def test_a_claim_untestable_in_the_design_that_contradicts_its_own_numbers_is_still_a_violation():
    """docs/bugs.md class 10 (opacus-replace-one-claim): an add/remove ε stated as replace-one, audited by the
    add/remove inclusion design, which cannot test a replace-one claim but still reads its numbers."""
    from dpverify.audits import run_audit
    from tests.doubles import GaussianMechanism
    from tests.test_audit import small_config

    class ReplaceOneClaim(GaussianMechanism):
        def train(self, request):
            trained = super().train(request)
            claim = dataclasses.replace(trained.claim, relation="replace_one")
            return dataclasses.replace(trained, claim=claim)

    result = run_audit(ReplaceOneClaim(claimed_epsilon=2.0), small_config(m=200, sampling_rate=1.0))
    assert result.verdict == "violation" and not result.claim_consistent
    assert "contradicts its own numbers" in result.claim_derivation
