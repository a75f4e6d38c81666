"""Opacus on the language-model contract: the transformer, the masked loss, and the audit end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("opacus")

from dpverify.audits.language import LanguageAuditConfig, run_language_audit  # noqa: E402
from dpverify.canaries.tokens import TokenCanaryConfig, make_token_canaries  # noqa: E402
from dpverify.contract import DPHyperparameters, SequenceRequest  # noqa: E402
from dpverify_opacus import language_implementations  # noqa: E402
from dpverify_opacus._language import IGNORED_TARGET, next_token_tensors, train_opacus_language  # noqa: E402

IMPLEMENTATIONS = {implementation.info.name: implementation for implementation in language_implementations()}

#: The pair design with m = 200 keeps one audit to a few seconds. A full batch averages each clipped
#: gradient over 200, so lr 10 lets a run without noise memorise its canaries.
SMALL = LanguageAuditConfig(
    design="pair",
    canaries=TokenCanaryConfig(m=200, new_tokens=200),
    hyperparameters=DPHyperparameters(target_epsilon=1.0, sampling_rate=1.0, epochs=30, learning_rate=10.0),
    device="cpu",
)


def small_request(m: int = 16, *, noise_multiplier: float = 1.0, epochs: int = 2) -> SequenceRequest:
    canaries = make_token_canaries(dataclasses.replace(SMALL.canaries, m=m), rng=np.random.default_rng(0))
    return SequenceRequest(
        sequences=canaries.sequences(canaries.suffixes),
        loss_mask=canaries.loss_mask(),
        vocab_size=SMALL.canaries.vocab_size,
        hyperparameters=DPHyperparameters(noise_multiplier=noise_multiplier, sampling_rate=0.5, epochs=epochs),
    )


def test_only_suffix_tokens_are_targets():
    request = small_request()
    inputs, targets = next_token_tensors(request)
    prefix = SMALL.canaries.prefix_length
    assert inputs.shape == targets.shape == (16, SMALL.canaries.sequence_length - 1)
    assert (targets[:, : prefix - 1] == IGNORED_TARGET).all()
    assert np.array_equal(targets[:, prefix - 1 :].numpy(), request.sequences[:, prefix:])


def test_hooks_and_ghost_clipping_train_the_same_model():
    """Per-sample gradients (hooks) and ghost clipping clip the same rows and draw the same noise from the
    same seed, so the two black boxes agree up to float32 rounding."""
    request = small_request()
    outputs = {
        mode: train_opacus_language(request, name=f"opacus-lm-{mode}", grad_sample_mode=mode).token_log_probs(request.sequences)
        for mode in ("hooks", "ghost")
    }
    assert outputs["hooks"].shape == (16, SMALL.canaries.sequence_length - 1)
    np.testing.assert_allclose(outputs["hooks"], outputs["ghost"], rtol=0, atol=1e-4)


def test_the_claim_is_opacus_own_for_the_steps_taken():
    trained = train_opacus_language(small_request(epochs=3), name="opacus-lm")
    claim = trained.claim
    assert claim.accountant == "opacus.rdp" and claim.relation == "add_remove"
    assert (claim.noise_multiplier, claim.sampling_rate, claim.steps) == (1.0, 0.5, 6)
    assert 0 < claim.epsilon < np.inf and "opacus.prv" in claim.other_epsilons


def test_without_noise_the_audit_reaches_near_its_ceiling():
    """At ε = ∞ the transformer memorises nearly every prefix → suffix pair, so ε_L is close to ε_O (every
    guess right). Tolerance 25 % of ε_O: the m = 200 prefix tokens drawn from 200 new tokens collide (about
    m²/2|V_new| = 100 pairs share a prefix), which costs a few guesses at the full count (measured: 195–196
    of 200 right, ε_L = 2.97 of ε_O = 3.67 on seeds 0–2). A score or alignment bug leaves ε_L near 0."""
    config = dataclasses.replace(SMALL, hyperparameters=dataclasses.replace(SMALL.hyperparameters, noise_multiplier=0.0, target_epsilon=None))
    result = run_language_audit(IMPLEMENTATIONS["opacus-lm"], config)
    assert result.error is None and result.claimed_epsilon == np.inf and result.verdict == "undecided"
    assert result.epsilon_lower_bound >= 0.75 * result.optimal_epsilon


def test_missing_noise_is_caught_while_opacus_passes_at_the_same_claim():
    """Both claim Opacus' add/remove ε = 1 (replace-one ≈ 2.0 for this run). Error rates: a correct run
    fails with probability ≤ 5 % (Theorem 1 at 95 % confidence, Bonferroni over the guess grid); the
    no-noise variant trains as the ε = ∞ run above (ε_L ≈ 2.97 on every seed measured), far above 2.0,
    so it passes only if memorisation fails, which no measured seed showed."""
    correct = run_language_audit(IMPLEMENTATIONS["opacus-lm"], SMALL)
    buggy = run_language_audit(IMPLEMENTATIONS["opacus-lm-no-noise"], SMALL)
    assert correct.claimed_epsilon == pytest.approx(buggy.claimed_epsilon)
    assert correct.claimed_epsilon < correct.optimal_epsilon  # the audit can decide at this claim
    assert correct.verdict == "pass", correct.summary()
    assert buggy.verdict == "violation", buggy.summary()


def test_the_registry_names_and_tasks():
    assert set(IMPLEMENTATIONS) == {"opacus-lm", "opacus-lm-no-noise"}
    for implementation in IMPLEMENTATIONS.values():
        assert implementation.info.task == "language" and implementation.unavailable_reason() is None
    assert IMPLEMENTATIONS["opacus-lm-no-noise"].info.expected == "violation"
    assert IMPLEMENTATIONS["opacus-lm-no-noise"].info.detectability == "D1"
