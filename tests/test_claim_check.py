"""The claim check refutes a claim only when its ε is below a certified lower bound on its own run's ε.

The lower bound is dpverify.stats.accounting.optimistic_epsilon. It is checked against upper bounds that
are valid by construction (dp_accounting's pessimistic PLD and RDP accountants, dpverify's own
pessimistic PLD at a fine spacing, and the exact GDP ε at q = 1): it must never exceed them, and must
come within 1 % of the tightest.
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from dp_accounting.pld import privacy_loss_distribution

from dpverify.audits import run_audit
from dpverify.audits.claims import claim_inconsistency
from dpverify.contract import PrivacyClaim
from dpverify.stats import accounting
from dpverify.stats.bounds import _gdp_epsilon
from tests.doubles import Oblivious
from tests.test_audit import small_config

DELTA = 1e-5
# How far below the tightest valid upper bound the optimistic ε may lie. Measured over the whole grid
# σ ∈ {0.8, 2, 4, 8} × q ∈ {2e-4, 1e-3, 1e-2, 1} × T ∈ {10, 1000, 5·10⁴}, both relations: at most 0.65 %
# (σ = 0.8, q = 2e-4, T = 5·10⁴, add/remove), 0.1-0.3 % at σ >= 2.
CLOSENESS = 0.01
# (σ, q, steps): typical claims, skewed per-step losses (σ = 0.8) and tiny ones (q = 2e-4 over 5·10⁴ steps).
SETTINGS = [
    (0.8, 1e-2, 1000),
    (0.8, 1e-3, 10),
    (2.0, 1e-3, 1000),
    (2.0, 2e-4, 50_000),
    (4.0, 2e-4, 50_000),
    (4.0, 1e-2, 10),
    (8.0, 2e-4, 10_000),
    (8.0, 1e-2, 1000),
    (0.8, 1.0, 10),
    (2.0, 1.0, 1000),
]


def dp_accounting_pld(sigma, q, steps, *, pessimistic, interval=1e-4):
    """dp_accounting's add/remove PLD ε; optimistic rounds every loss down (connect-the-dots is pessimistic only)."""
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        sigma,
        sampling_prob=q,
        value_discretization_interval=interval,
        pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic,
    )
    return pld.self_compose(steps).get_epsilon_for_delta(DELTA)


def dp_accounting_rdp(sigma, q, steps):
    accountant = rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(DELTA)


def upper_bounds(sigma, q, steps, relation, monkeypatch):
    """Valid upper bounds on the run's ε: for add/remove dp_accounting's RDP ε and (σ >= 2, where it is
    fast) its pessimistic PLD ε; at q = 1 the exact GDP ε (to 1e-9); below it dpverify's pessimistic PLD, for
    σ >= 2 at spacing 2e-6, 50 times finer than its default, so that it resolves per-step losses of 1e-5."""
    bounds = [dp_accounting_rdp(sigma, q, steps)] if relation == "add_remove" else []
    if relation == "add_remove" and sigma >= 2 and q < 1:
        bounds.append(dp_accounting_pld(sigma, q, steps, pessimistic=True))
    if q == 1:
        mu = (1.0 if relation == "add_remove" else 2.0) * math.sqrt(steps) / sigma
        return bounds + [float(_gdp_epsilon(np.array(mu), DELTA)) + 1e-9]
    account = accounting.add_remove_epsilon if relation == "add_remove" else accounting.replace_one_epsilon
    with monkeypatch.context() as patch:
        if sigma >= 2:  # at σ = 0.8 the per-step losses are of order 1e-2 and the default resolves them
            patch.setattr(accounting, "_SPACING", 2e-6)
        return bounds + [account(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=DELTA)]


@pytest.mark.parametrize("relation", ["add_remove", "replace_one"])
@pytest.mark.parametrize("sigma, q, steps", SETTINGS)
def test_optimistic_epsilon_is_below_every_valid_bound_and_close_to_the_tightest(sigma, q, steps, relation, monkeypatch):
    least = accounting.optimistic_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=DELTA, relation=relation)
    bounds = upper_bounds(sigma, q, steps, relation, monkeypatch)
    assert least <= min(bounds), bounds
    assert least >= (1 - CLOSENESS) * min(bounds), bounds


@pytest.mark.parametrize("sigma, q, steps", [(2.0, 1e-2, 1000), (2.0, 1e-3, 10), (4.0, 2e-4, 50_000)])
def test_optimistic_epsilon_is_at_least_as_tight_as_dp_accountings(sigma, q, steps):
    """dp_accounting's optimistic PLD rounds every loss down, losing half its spacing per step: over
    many steps of tiny losses it says ε = 0 (the last case), where ours stays within 1 % of the truth."""
    ours = accounting.optimistic_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=DELTA, relation="add_remove")
    assert ours >= (1 - CLOSENESS) * dp_accounting_pld(sigma, q, steps, pessimistic=False)


def test_optimistic_epsilon_checks_its_input_and_is_infinite_without_noise():
    run = {"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 10, "delta": DELTA}
    with pytest.raises(ValueError, match=r"relation must be one of 'add_remove', 'replace_one', 'zero_out', got 'swap'"):
        accounting.optimistic_epsilon(**run, relation="swap")
    with pytest.raises(ValueError, match=r"sampling_rate must be in \(0, 1\], got 1.5"):
        accounting.optimistic_epsilon(**{**run, "sampling_rate": 1.5}, relation="add_remove")
    assert accounting.optimistic_epsilon(**{**run, "noise_multiplier": 0.0}, relation="add_remove") == math.inf

def claim(epsilon, sigma, q, steps, relation="add_remove"):
    return PrivacyClaim(
        epsilon=epsilon, delta=DELTA, accountant="the library", noise_multiplier=sigma, sampling_rate=q, steps=steps, relation=relation
    )


def test_the_reviews_rdp_claim_is_not_refuted():
    """dp_accounting's RDP accountant states ε = 0.03606 for σ = 4, q = 2e-4, 50 000 steps: a valid upper
    bound, so a correct claim, which the pessimistic check (ε = 0.04147) refuted."""
    stated = dp_accounting_rdp(4.0, 2e-4, 50_000)
    assert stated == pytest.approx(0.03606, abs=1e-5)
    assert claim_inconsistency(claim(stated, 4.0, 2e-4, 50_000)) is None


@pytest.mark.parametrize("sigma, q, steps", [(5.0, 2e-4, 10_000), (6.0, 5e-4, 20_000), (8.0, 1e-3, 10_000)])
def test_claims_of_a_tighter_pld_are_not_refuted(sigma, q, steps):
    """dp_accounting's pessimistic PLD at spacing 2e-6 is a valid upper bound 6-48 % below dpverify's
    pessimistic PLD (spacing 1e-4) at these settings; claiming it is correct."""
    stated = dp_accounting_pld(sigma, q, steps, pessimistic=True, interval=2e-6)
    assert claim_inconsistency(claim(stated, sigma, q, steps)) is None


@pytest.mark.parametrize("relation", ["add_remove", "replace_one"])
@pytest.mark.parametrize("sigma, q, steps", [(2.0, 1e-2, 1000), (4.0, 2e-4, 50_000)])
def test_a_claim_well_below_its_own_runs_epsilon_is_refuted(sigma, q, steps, relation):
    """Half the optimistic ε, which is itself below the truth, cannot hold."""
    least = accounting.optimistic_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=DELTA, relation=relation)
    message = claim_inconsistency(claim(least / 2, sigma, q, steps, relation))
    assert message is not None
    for needle in (f"{relation} ε = {least / 2:.4g}", f"at least {relation} ε = {least:.4g}", "optimistic PLD", "contradicts"):
        assert needle in message
    assert claim_inconsistency(claim(least, sigma, q, steps, relation)) is None


def test_a_full_batch_claim_is_checked_against_the_exact_gdp_epsilon():
    exact = float(_gdp_epsilon(np.array(2 * math.sqrt(100) / 4.0), DELTA))  # replace-one: sensitivity 2
    assert claim_inconsistency(claim(exact, 4.0, 1.0, 100, "replace_one")) is None
    assert "exact Gaussian-DP" in claim_inconsistency(claim(0.99 * exact, 4.0, 1.0, 100, "replace_one"))


@dataclasses.dataclass
class ClaimsTheReviewsRun(Oblivious):
    """Private whatever it claims; its claim is RDP's ε for σ = 4, q = 2e-4 and 50 000 steps, times ``scale``."""

    scale: float = 1.0

    def train(self, request):
        trained = super().train(request)
        stated = claim(self.scale * 0.03606, 4.0, 2e-4, 50_000)
        return dataclasses.replace(trained, claim=stated)


def test_the_audit_refutes_only_the_claim_that_contradicts_itself():
    consistent = run_audit(ClaimsTheReviewsRun(), small_config(m=100))
    assert consistent.claim_consistent and consistent.verdict != "violation"
    inconsistent = run_audit(ClaimsTheReviewsRun(scale=0.5), small_config(m=100))
    assert not inconsistent.claim_consistent and inconsistent.verdict == "violation"
    assert "contradicts its own numbers" in inconsistent.claim_derivation
