"""The conformance suite for language-model implementations (numpy only, no framework).

What :mod:`dpverify.conformance` checks for a classifier, for a trainer of the language-model contract
(:class:`~dpverify.contract.SequenceRequest` in, :class:`~dpverify.contract.SequenceModel` out), on tiny runs
that take seconds::

    from dpverify.language_conformance import run_language_conformance
    run_language_conformance(my_lm_trainer)

The checks: the black box's form (:func:`check_sequence_output_contract`), the claim is about the requested
run and a target ε is met (shared with classification), the seed decides the run
(:func:`check_sequence_determinism`), and the designated transformer (:func:`check_dirac_transformer`): the
Dirac token audit is blind unless the token embedding and the LM head start at zero, which only the black box
after one noiseless step can show. Every check raises ``AssertionError`` naming the implementation.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpverify.conformance import (
    LOGSUMEXP_ATOL,
    _name,
    _train,
    check_calibration,
    check_claim_matches_request,
    with_target_epsilon,
)
from dpverify.contract import RELATIONS, DPHyperparameters, Implementation, PrivacyClaim, SequenceModel, SequenceRequest, TransformerArchitecture

__all__ = [
    "UNTRAINED_TOKENS",
    "small_sequence_request",
    "check_sequence_output_contract",
    "check_sequence_determinism",
    "check_dirac_transformer",
    "run_language_conformance",
]

#: The last tokens of :func:`small_sequence_request`'s vocabulary, which no sequence contains.
UNTRAINED_TOKENS = 8
#: Log-probabilities that the designated transformer makes equal must agree to this (float32 rounding).
EQUAL_ATOL = 1e-5


def small_sequence_request(
    *,
    num_sequences: int = 24,
    noise_multiplier: float | None = 2.0,
    target_epsilon: float | None = None,
    sampling_rate: float = 0.5,
    epochs: int = 2,
    learning_rate: float = 1.0,
    max_grad_norm: float = 0.5,
    delta: float = 1e-5,
    seed: int = 0,
    device: str = "cpu",
) -> SequenceRequest:
    """A tiny language-model request: ``num_sequences`` sequences of 4 tokens over a vocabulary of 32 (two
    context tokens from [0, 16), two targets from [16, 24), the loss on the targets only; tokens [24, 32)
    appear nowhere), a one-block transformer of width 8 with the Dirac init, σ = 2, q = 0.5, 2 epochs."""
    if target_epsilon is not None:
        noise_multiplier = None
    rng = np.random.default_rng(0)
    context = rng.integers(0, 16, size=(num_sequences, 2))
    targets = rng.integers(16, 32 - UNTRAINED_TOKENS, size=(num_sequences, 2))
    sequences = np.concatenate([context, targets], axis=1).astype(np.int64)
    mask = np.zeros(sequences.shape, dtype=bool)
    mask[:, 2:] = True
    return SequenceRequest(
        sequences=sequences,
        loss_mask=mask,
        vocab_size=32,
        architecture=TransformerArchitecture(width=8, heads=2, max_sequence_length=8, init="dirac"),
        hyperparameters=DPHyperparameters(
            noise_multiplier=noise_multiplier,
            target_epsilon=target_epsilon,
            sampling_rate=sampling_rate,
            epochs=epochs,
            learning_rate=learning_rate,
            max_grad_norm=max_grad_norm,
            delta=delta,
        ),
        seed=seed,
        device=device,
    )


def _token_log_probs(impl: Implementation, trained: SequenceModel, sequences: np.ndarray, label: str) -> np.ndarray:
    """The black box on ``sequences``, checked for the contract's shape, dtype and values."""
    name = _name(impl)
    out = trained.token_log_probs(sequences)
    assert isinstance(out, np.ndarray), f"{name}: token_log_probs must return a numpy array, got {type(out).__name__}"
    expected = (sequences.shape[0], sequences.shape[1] - 1)
    assert out.shape == expected, f"{name}: token_log_probs on {label} returned shape {out.shape}, expected {expected}"
    assert np.issubdtype(out.dtype, np.floating), f"{name}: token_log_probs on {label} returned dtype {out.dtype}"
    bad = ~np.isfinite(out)
    assert not bad.any(), (
        f"{name}: token_log_probs on {label} returned {int(bad.sum())} non-finite values; training diverged or failed"
    )
    assert out.max() <= LOGSUMEXP_ATOL, f"{name}: a log-probability on {label} is positive ({out.max():.3g})"
    return out.astype(np.float64)


def _next_token_log_probs(impl: Implementation, trained: SequenceModel, context: np.ndarray, vocab_size: int) -> np.ndarray:
    """(contexts, V): log p(v | context) for every token v, read from the black box one candidate at a time."""
    candidates = np.arange(vocab_size, dtype=np.int64)
    rows = []
    for prefix in np.atleast_2d(context):
        sequences = np.concatenate([np.repeat(prefix[None], vocab_size, axis=0), candidates[:, None]], axis=1)
        rows.append(_token_log_probs(impl, trained, sequences, f"context {prefix.tolist()}")[:, -1])
    return np.array(rows)


def check_sequence_output_contract(
    impl: Implementation, request: SequenceRequest, trained: SequenceModel | None = None
) -> SequenceModel:
    """The black box and the claim have the contract's form.

    On the training sequences, on fresh sequences of another count and length, and on a single one:
    shape (n, T − 1), a float dtype, finite, every value ≤ 0. At a few contexts the next token's
    probabilities over the whole vocabulary sum to 1 (logsumexp within ``LOGSUMEXP_ATOL`` of 0). The claim is
    a :class:`PrivacyClaim` for the request's δ with a known relation; ``device`` is where it ran."""
    name = _name(impl)
    trained = trained if trained is not None else _train(impl, request)  # type: ignore[assignment]
    assert isinstance(trained.claim, PrivacyClaim), f"{name}: claim must be a PrivacyClaim, got {trained.claim!r}"
    assert trained.device in ("cpu", "cuda"), f"{name}: device must be 'cpu' or 'cuda', got {trained.device!r}"
    if request.device == "cpu":
        assert trained.device == "cpu", f"{name}: CPU was requested but training reports device {trained.device!r}"
    rng = np.random.default_rng(12345)
    length = min(request.architecture.max_sequence_length, request.sequences.shape[1] + 1)
    fresh = rng.integers(0, request.vocab_size, size=(request.num_records + 3, length)).astype(np.int64)
    for label, sequences in (("the training sequences", request.sequences), ("fresh sequences", fresh), ("a single sequence", request.sequences[:1])):
        _token_log_probs(impl, trained, sequences, label)
    totals = _next_token_log_probs(impl, trained, request.sequences[:3, :2], request.vocab_size)
    lse = np.logaddexp.reduce(totals, axis=1)
    worst = int(np.argmax(np.abs(lse)))
    assert abs(lse[worst]) <= LOGSUMEXP_ATOL, (
        f"{name}: after context {request.sequences[worst, :2].tolist()} the next token's probabilities sum to "
        f"exp({lse[worst]:.3g}), not 1; return log-softmax over the whole vocabulary"
    )
    claim = trained.claim
    assert claim.delta == request.hyperparameters.delta, (
        f"{name}: the claim is for δ = {claim.delta}, the request asked for δ = {request.hyperparameters.delta}"
    )
    assert claim.relation in RELATIONS, f"{name}: unknown neighbouring relation {claim.relation!r}"
    return trained


def check_sequence_determinism(
    impl: Implementation, request: SequenceRequest, trained: SequenceModel | None = None, *, atol: float = 1e-6
) -> SequenceModel:
    """The request's seed decides the run: the same request gives the same outputs (within ``atol``) and
    claim, and with noise another seed gives other outputs."""
    name = _name(impl)
    first = trained if trained is not None else _train(impl, request)
    second = _train(impl, request)
    a, b = (_token_log_probs(impl, model, request.sequences, "the training sequences") for model in (first, second))  # type: ignore[arg-type]
    diff = float(np.max(np.abs(a - b)))
    assert diff <= atol, (
        f"{name}: two runs with the same seed {request.seed} differ by up to {diff:.3g} in log-probability "
        f"(allowed {atol:g}); seed every random source (init, sampling, noise)"
    )
    assert first.claim == second.claim, f"{name}: two runs with the same seed claim {first.claim} and {second.claim}"
    hp = request.hyperparameters
    if hp.noise_multiplier is None or hp.noise_multiplier > 0:
        other = _train(impl, dataclasses.replace(request, seed=request.seed + 1))
        c = _token_log_probs(impl, other, request.sequences, "the training sequences")  # type: ignore[arg-type]
        assert not np.allclose(a, c, rtol=0.0, atol=atol), (
            f"{name}: seeds {request.seed} and {request.seed + 1} gave the same outputs; the seed is ignored"
        )
    return first  # type: ignore[return-value]


def check_dirac_transformer(impl: Implementation, request: SequenceRequest) -> SequenceModel:
    """The designated transformer with ``init="dirac"``, as only its black box shows it.

    One full-batch step without noise (σ = 0, q = 1, one epoch) of ``request``. The token embedding and the
    head start at zero, so that step moves only the head rows (and biases) of the tokens that are targets
    somewhere, each by the same amount for every other token; and a never-seen token's embedding row stays
    zero. Hence, after any never-seen token at position 0: (1) every token that is no target has the same
    log-probability (a random head, bias or a head that moved otherwise breaks it), and (2) the whole
    next-token distribution is the same whatever never-seen token the context is (a random token embedding
    breaks it). Needs a request whose last :data:`UNTRAINED_TOKENS` tokens appear in no sequence."""
    name = _name(impl)
    if request.architecture.init != "dirac":
        raise ValueError(f"check_dirac_transformer needs a request with architecture.init='dirac' (checking {name})")
    hp = dataclasses.replace(
        request.hyperparameters, noise_multiplier=0.0, target_epsilon=None, sampling_rate=1.0, epochs=1
    )
    vocab = request.vocab_size
    unseen = np.setdiff1d(np.arange(vocab), request.sequences)
    if unseen.size < 2:
        raise ValueError(f"check_dirac_transformer needs two tokens that no sequence contains (checking {name})")
    trained = _train(impl, dataclasses.replace(request, hyperparameters=hp))
    targets = np.unique(request.sequences[request.loss_mask])
    others = np.setdiff1d(np.arange(vocab), targets)
    table = _next_token_log_probs(impl, trained, unseen[:, None], vocab)  # type: ignore[arg-type]
    spread = float(np.max(np.ptp(table[:, others], axis=1)))
    assert spread <= EQUAL_ATOL, (
        f"{name}: after one noiseless step, tokens that are no target differ in log-probability by up to "
        f"{spread:.3g} (allowed {EQUAL_ATOL:g}); the designated transformer's LM head (weights and bias) starts "
        "at zero with init='dirac'"
    )
    drift = float(np.max(np.abs(table - table[0])))
    assert drift <= EQUAL_ATOL, (
        f"{name}: after one noiseless step, contexts of never-seen tokens give next-token distributions that "
        f"differ by up to {drift:.3g} (allowed {EQUAL_ATOL:g}); the designated transformer's token embedding "
        "starts at zero with init='dirac'"
    )
    return trained  # type: ignore[return-value]


def run_language_conformance(
    impl: Implementation, *, request: SequenceRequest | None = None, target_epsilon: float = 1.0
) -> None:
    """Every check on ``request`` (default :func:`small_sequence_request`) and on its target-ε twin, then
    the designated transformer (:func:`check_dirac_transformer`)."""
    if impl.info.task != "language":
        raise ValueError(f"{impl.info.name} trains a {impl.info.task} model; use dpverify.conformance.run_conformance")
    request = request if request is not None else small_sequence_request()
    trained = check_sequence_output_contract(impl, request)
    check_claim_matches_request(impl, request, trained)
    check_sequence_determinism(impl, request, trained)
    calibrated_request = with_target_epsilon(request, target_epsilon)
    calibrated = check_calibration(impl, calibrated_request)
    check_sequence_output_contract(impl, calibrated_request, calibrated)  # type: ignore[arg-type]
    check_claim_matches_request(impl, calibrated_request, calibrated)
    check_dirac_transformer(impl, request)
