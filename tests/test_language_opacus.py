"""Opacus on the language-model contract: the transformer, the masked loss, and the audit end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("opacus")

from dpverify.audits.language import REPEATED_TOKEN_BASELINE, LanguageAuditConfig, run_language_audit  # noqa: E402
from dpverify.canaries.tokens import TokenCanaryConfig, make_token_canaries  # noqa: E402
from dpverify.contract import DPHyperparameters, SequenceRequest, TransformerArchitecture  # noqa: E402
from dpverify_opacus import language_implementations  # noqa: E402
from dpverify_opacus._language import IGNORED_TARGET, build_transformer, next_token_tensors, train_opacus_language  # noqa: E402

IMPLEMENTATIONS = {implementation.info.name: implementation for implementation in language_implementations()}

#: The pair design with m = 200 keeps one audit to a few seconds. A full batch averages each clipped
#: gradient over 200, so lr 10 lets a run without noise memorise its canaries.
SMALL = dataclasses.replace(
    REPEATED_TOKEN_BASELINE,
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
    assert set(IMPLEMENTATIONS) == {
        "opacus-lm", "opacus-lm-hooks", "opacus-lm-no-noise", "opacus-lm-clip-2c", "opacus-lm-hooks-clip-2c",
        "opacus-lm-unnoised-embedding", "opacus-lm-unclipped-embedding",
    }  # fmt: skip
    for implementation in IMPLEMENTATIONS.values():
        assert implementation.info.task == "language" and implementation.unavailable_reason() is None
    assert {n for n, i in IMPLEMENTATIONS.items() if i.info.expected == "private"} == {"opacus-lm", "opacus-lm-hooks"}
    assert IMPLEMENTATIONS["opacus-lm-hooks"].grad_sample_mode == "hooks"
    assert IMPLEMENTATIONS["opacus-lm-no-noise"].info.detectability == "D1"
    assert IMPLEMENTATIONS["opacus-lm-unnoised-embedding"].info.detectability == "D1"


#: The Dirac default at a fifth of its canaries (4 runs of 500): a few seconds an audit.
SMALL_DIRAC = LanguageAuditConfig(device="cpu").with_overrides(m=2000, pooled_runs=4)


def dirac_request(*, max_grad_norm: float = 0.5, noise_multiplier: float = 1.0, init: str = "dirac", epochs: int = 1) -> SequenceRequest:
    canaries = make_token_canaries(dataclasses.replace(SMALL_DIRAC.canaries, m=50, new_tokens=100), rng=np.random.default_rng(0))
    return SequenceRequest(
        sequences=canaries.sequences(canaries.suffixes),
        loss_mask=canaries.loss_mask(),
        vocab_size=canaries.config.vocab_size,
        architecture=dataclasses.replace(SMALL_DIRAC.architecture, init=init),
        hyperparameters=DPHyperparameters(
            noise_multiplier=noise_multiplier, sampling_rate=1.0, epochs=epochs, max_grad_norm=max_grad_norm, learning_rate=1.0
        ),
    )


def test_at_the_dirac_init_a_canary_moves_only_the_head_and_mostly_its_own_suffix_row():
    """Zero token embedding and head: no gradient reaches upstream at the first step, and the head's
    gradient (p − e_s) ⊗ [h; 1] puts all but ~1/V of its squared norm on the row of the canary's suffix."""
    import torch

    request = dirac_request()
    model = build_transformer(request, seed=0, device=torch.device("cpu"))
    assert not model.token_embedding.weight.any() and not model.head.weight.any() and not model.head.bias.any()
    inputs, targets = next_token_tensors(request)
    torch.nn.functional.cross_entropy(model(inputs[:1]).transpose(1, 2), targets[:1], ignore_index=IGNORED_TARGET).backward()
    upstream = [p.grad for name, p in model.named_parameters() if not name.startswith("head.")]
    assert all(g is None or not g.any() for g in upstream)
    rows = torch.cat([model.head.weight.grad, model.head.bias.grad[:, None]], dim=1).norm(dim=1) ** 2
    own = int(request.sequences[0, -1])
    assert rows.argmax() == own and rows[own] / rows.sum() > 1 - 2 / request.vocab_size


def embedding_rows_after_one_step(name: str, **request_settings) -> "np.ndarray":
    """The token embedding after one step of ``name`` on :func:`dirac_request` (a random init, so the
    embedding has a gradient from the first step)."""
    from dpverify_opacus._language import LANGUAGE, language_loss
    from dpverify_opacus._training import build_run, mix_into, run_steps, trained_module

    implementation = IMPLEMENTATIONS[name]
    run = build_run(
        dirac_request(init="random", **request_settings), name=name, grad_sample_mode=implementation.grad_sample_mode,
        tweak=mix_into(implementation.make_tweak(), language_loss), task=LANGUAGE,
    )  # fmt: skip
    before = trained_module(run).token_embedding.weight.detach().clone()
    run_steps(run)
    return (trained_module(run).token_embedding.weight.detach() - before).numpy()


def test_the_unnoised_embedding_leaves_unused_rows_exactly_where_they_started():
    """Opacus noises every row of the embedding; the variant none, so rows of tokens no sequence uses
    (the base vocabulary) stay put, which is the leak: a member's prefix row moves, a non-member's does not."""
    base = SMALL_DIRAC.canaries.base_vocab_size
    assert np.abs(embedding_rows_after_one_step("opacus-lm-hooks")[:base]).max() > 0
    assert np.abs(embedding_rows_after_one_step("opacus-lm-unnoised-embedding")[:base]).max() == 0


def test_the_unclipped_embedding_moves_further_than_clipping_allows():
    """Without noise and C = 1e-4, one step moves any parameter by at most lr·C (the mean of rows of norm
    ≤ C); the embedding left out of the clipping moves by its raw gradient."""
    correct = embedding_rows_after_one_step("opacus-lm-hooks", max_grad_norm=1e-4, noise_multiplier=0.0)
    unclipped = embedding_rows_after_one_step("opacus-lm-unclipped-embedding", max_grad_norm=1e-4, noise_multiplier=0.0)
    assert np.linalg.norm(correct) <= 1e-4 * 1.001 < 100 * 1e-4 < np.linalg.norm(unclipped)


@pytest.mark.parametrize("name", ["opacus-lm-clip-2c", "opacus-lm-hooks-clip-2c"])
def test_clipping_at_2c_moves_twice_as_far_as_opacus_without_noise(name):
    """Every row is clipped (norms ≈ the hidden state's, far above C), so without noise the step is
    twice Opacus' own, in both modes (to first order: the log-probabilities are near uniform)."""

    def step(implementation_name: str) -> np.ndarray:
        request = dirac_request(noise_multiplier=0.0)
        trained = train_opacus_language(request, name=implementation_name, grad_sample_mode=IMPLEMENTATIONS[implementation_name].grad_sample_mode,
                                        tweak=IMPLEMENTATIONS[implementation_name].make_tweak())  # fmt: skip
        return trained.token_log_probs(request.sequences)

    uniform = -np.log(dirac_request().vocab_size)
    correct, doubled = step("opacus-lm") - uniform, step(name) - uniform
    np.testing.assert_allclose(doubled, 2 * correct, rtol=0.05)


def test_the_dirac_audit_passes_opacus_in_both_modes_and_catches_the_missing_noise():
    """Seed 0 at claimed ε = 2, 2000 canaries in 4 runs. A correct run fails with probability ≤ 5 %
    (both tests at 95 % together); without noise each member's own head row moves by lr·C·steps/N with
    nothing to hide it, so every member scores above every non-member, across the pooled runs too."""
    results = {name: run_language_audit(IMPLEMENTATIONS[name], SMALL_DIRAC) for name in ("opacus-lm", "opacus-lm-hooks", "opacus-lm-no-noise")}
    for name in ("opacus-lm", "opacus-lm-hooks"):
        assert results[name].verdict == "pass", results[name].summary()
    assert results["opacus-lm"].epsilon_lower_bound == pytest.approx(results["opacus-lm-hooks"].epsilon_lower_bound, abs=1e-6)
    assert results["opacus-lm-no-noise"].verdict == "violation"
    scores, membership = results["opacus-lm-no-noise"].scores, results["opacus-lm-no-noise"].membership
    assert scores[membership == 1].min() > scores[membership == -1].max()


def test_the_unnoised_embedding_is_caught_by_its_untouched_prefix_rows():
    """Seed 0 at claimed ε = 2, 2000 canaries in 4 runs: a non-member's prefix row never moves without the
    embedding's noise, so its suffix is exactly as likely after its prefix as after an unseen token and it
    ranks below every member."""
    result = run_language_audit(IMPLEMENTATIONS["opacus-lm-unnoised-embedding"], SMALL_DIRAC)
    assert result.verdict == "violation", result.summary()
    assert result.scores[result.membership == 1].min() > result.scores[result.membership == -1].max()
