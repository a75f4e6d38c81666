"""The every-update audit reads only updates that belong to the model returned, and states what it could
have caught: a frozen, foreign or partial hand-over makes it not run (undecided, with the reason), never a
pass; updates that carry too little of the claimed signal are blind (undecided); an honest correct trainer
passes with ρ stated and k* "not stated"; an honest trainer that adds no noise is refuted.

The trainers are the reference DP-SGD (plain torch, dp_accounting's claim), changed only in what they
hand over, what they clip to and how much noise they add, through the public audit path (``run_audit``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")
pytest.importorskip("dp_accounting")

from dpverify_reference import accounting  # noqa: E402
from dpverify_reference.dpsgd import train_reference  # noqa: E402

from dpverify.audits import run_audit  # noqa: E402
from dpverify.config import AuditConfig, profile_config  # noqa: E402
from dpverify.contract import Implementation, ImplementationInfo, TrainedModel, TrainingRequest  # noqa: E402


def _frozen(observe):
    """Hands over the initial parameters at every step."""
    first = []

    def relay(step, parameters):
        first.append(first[0] if first else parameters)
        observe(step, first[-1])

    return relay


def _first_four_steps(observe):
    """Hands over the first four steps' parameters only (half of the test's 8 steps)."""
    return lambda step, parameters: observe(step, parameters) if step <= 4 else None


def _weight_only(observe):
    """Hands over the weight and leaves the bias out."""
    return lambda step, parameters: observe(step, parameters[:1])


HAND_OVERS = {"frozen": _frozen, "first_four_steps": _first_four_steps, "weight_only": _weight_only}


@dataclass
class ReferenceHandingOver(Implementation):
    """The reference DP-SGD claiming the requested σ and clip norm C, while it clips to ``signal`` × C and
    adds ``noise`` × σC; it hands its updates over honestly, or as :data:`HAND_OVERS` says, or ``foreign``:
    another run's (another seed's, at the requested σ and C), while the model it returns is its own."""

    hand_over: str = "honest"
    signal: float = 1.0
    noise: float = 1.0
    info: ImplementationInfo = field(default_factory=lambda: ImplementationInfo(name="test-reference-handing-over", library="torch"))

    def train(self, request: TrainingRequest) -> TrainedModel:
        observe = request.observe_update
        if self.hand_over == "foreign":
            train_reference(dataclasses.replace(request, seed=request.seed + 1))
            observe = None
        elif self.hand_over != "honest":
            observe = HAND_OVERS[self.hand_over](observe)
        hp = request.hyperparameters
        clip = self.signal * hp.max_grad_norm
        run = dataclasses.replace(hp, max_grad_norm=clip, noise_multiplier=self.noise * hp.noise_multiplier * hp.max_grad_norm / clip)
        trained = train_reference(dataclasses.replace(request, hyperparameters=run, observe_update=observe))
        sigma, q, steps, delta = hp.noise_multiplier, hp.sampling_rate, hp.steps, hp.delta
        claim = dataclasses.replace(
            trained.claim,
            epsilon=accounting.rdp_epsilon(sigma, q, steps, delta),
            noise_multiplier=sigma,
            other_epsilons={accounting.PLD_NAME: accounting.pld_epsilon(sigma, q, steps, delta)},
        )
        return dataclasses.replace(trained, claim=claim)


def _config(seed: int) -> AuditConfig:
    """Every update of 8 steps at q = 1/4 and σ = 1, two pooled runs of 1000 Dirac canaries: twice the size at
    which a 10× noise deficit at half the claimed signal was caught in 10 of 10 simulated audits (2 × 500; at
    2 × 200, in 2 of 10 at the full signal, so that a correct trainer's pass would be blind)."""
    return profile_config("quick", observe="every_update", m=2000, pooled_runs=2, sampling_rate=0.25, epochs=2,
                          noise_multiplier=1.0, sides="one", device="cpu", seed=seed)  # fmt: skip


def test_an_honest_correct_trainer_passes_stating_its_signal_and_no_k_star():
    """A false alarm here has probability at most the audit's level (0.05) at this fixed seed."""
    result = run_audit(ReferenceHandingOver(), _config(0))
    assert result.verdict == "pass", result.summary()
    power = result.power
    assert power is not None and power.smallest_deficit is None and power.blind is None, result.summary()
    assert 0.7 < power.signal_fraction < 1.3, result.summary()
    assert "not stated" in result.power_sentence()


def test_an_honest_trainer_that_adds_no_noise_is_refuted():
    result = run_audit(ReferenceHandingOver(noise=0.0), _config(1))
    assert result.verdict == "violation", result.summary()


def test_a_noiseless_trainer_handing_over_a_frozen_copy_of_its_initial_parameters_is_not_run():
    result = run_audit(ReferenceHandingOver(hand_over="frozen", noise=0.0), _config(2))
    assert result.verdict == "undecided" and result.error is None, result.summary()
    assert "not the returned model's" in result.not_run and "frozen" in result.not_run


def test_a_noiseless_trainer_handing_over_another_honest_runs_updates_is_not_run():
    result = run_audit(ReferenceHandingOver(hand_over="foreign", noise=0.0), _config(3))
    assert result.verdict == "undecided" and result.error is None, result.summary()
    assert "not the returned model's" in result.not_run


@pytest.mark.parametrize(
    "hand_over, reason",
    [("first_four_steps", "parameters of 4 of the 8 steps"), ("weight_only", r"got shapes ((10, 1000),) after step 0")],
)
def test_a_partial_hand_over_is_not_run_never_an_error_nor_a_pass(hand_over, reason):
    result = run_audit(ReferenceHandingOver(hand_over=hand_over, noise=0.0), _config(4))
    assert result.verdict == "undecided" and result.error is None, result.summary()
    assert reason in result.not_run


def test_updates_that_carry_a_tenth_of_the_claimed_signal_are_blind():
    """Clipped to C/10 under noise σC: a more private trainer than it claims, whose audit could not have
    seen a deficit; its pass would promise what the audit cannot see."""
    result = run_audit(ReferenceHandingOver(signal=0.1), _config(5))
    assert result.verdict == "undecided" and result.not_run is None, result.summary()
    assert result.blind is not None and result.power.signal_fraction < 0.3, result.summary()
