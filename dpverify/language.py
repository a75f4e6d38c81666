"""Language-model canaries and their one-run audit (UniAud section 6, "Extending to language modeling").

The classification audit asks whether a model learned the label of a trigger; here it asks whether a
causal language model learned the *suffix* of a prefix. The vocabulary is augmented with new tokens, so
no canary competes with text the model knows, and each canary is a prefix followed by a suffix:

- ``repeated`` (UniAud): one new token repeated ``prefix_length`` times, then another new token repeated
  ``suffix_length`` times. The comparison sequence keeps the prefix and repeats a fresh new token.
- ``new_token`` (the NewToken baseline of Panda et al. 2025): random tokens of the base vocabulary as
  prefix and random new tokens as suffix (one draw per position). The comparison is a fresh new-token
  suffix after the same prefix.

The fresh suffix token is drawn uniformly from the new tokens *other* than the trained one at that
position, so (trained, fresh) is an exchangeable pair before training (the paper's Property 1) and the
comparison can never coincide with the trained suffix.

The audit is the pair design (Algorithm 2): train on all m canaries, then draw S_i ∈ {−1, +1}, show
the trained suffix (S = +1) or the fresh one (S = −1), and score

    score_i = Σ_{t ∈ suffix} log p(shown_t | shown_<t) − Σ_{t ∈ suffix} log p(other_t | other_<t),

the loss of the other sequence minus the loss of the shown one. It bounds the *replace-one* ε (one
sequence's suffix replaced), so the claim is converted with :func:`dpverify.audit.claim_in_relation`.
One sequence is the privacy unit. This module imports numpy (and dpverify's numpy/scipy modules) only.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from dpverify._validation import check_choice, check_int, check_probability
from dpverify.audit import audit_ceiling, canaries_needed, claim_in_relation, resolve_device
from dpverify.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.config import DEVICES
from dpverify.contract import DPHyperparameters, Implementation, PrivacyClaim
from dpverify.results import AuditResult
from dpverify.scoring import GuessRule, count_correct, guesses_from_scores

TokenCanaryMode = Literal["repeated", "new_token"]
TOKEN_CANARY_MODES: tuple[str, ...] = ("repeated", "new_token")

#: The language audit's design and the neighbouring relation its ε_L bounds.
LANGUAGE_DESIGN = "pair"
LANGUAGE_RELATION = "replace_one"


@dataclass(frozen=True, kw_only=True)
class TransformerArchitecture:
    """The designated model: a causal transformer of ``layers`` pre-norm blocks, ``width``-dimensional
    token and position embeddings, ``heads`` attention heads and an LM head, randomly initialised."""

    layers: int = 1
    width: int = 64
    heads: int = 4
    max_sequence_length: int = 32

    def __post_init__(self) -> None:
        check_int("layers", self.layers, low=1)
        check_int("width", self.width, low=1)
        check_int("heads", self.heads, low=1)
        check_int("max_sequence_length", self.max_sequence_length, low=2)
        if self.width % self.heads:
            raise ValueError(f"width must be a multiple of heads, got width={self.width}, heads={self.heads}")


@dataclass(frozen=True, kw_only=True, eq=False)
class SequenceRequest:
    """What the auditor sends to a language-model trainer.

    ``sequences`` (n, T) int64 token ids in [0, vocab_size); ``loss_mask`` (n, T) bool marks the *target*
    positions t whose token x_t, predicted from x_<t, counts in the loss (the suffix only; position 0 has
    no context and never counts). ``vocab_size`` is the base vocabulary plus the new tokens.
    """

    sequences: np.ndarray
    loss_mask: np.ndarray
    vocab_size: int
    architecture: TransformerArchitecture = field(default_factory=TransformerArchitecture)
    hyperparameters: DPHyperparameters
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, low=2)
        check_int("seed", self.seed, low=0)
        check_choice("device", self.device, ("cpu", "cuda"))
        if self.sequences.ndim != 2 or self.sequences.dtype != np.int64:
            raise ValueError(
                f"sequences must be a 2-D int64 array, got shape {self.sequences.shape} dtype {self.sequences.dtype}"
            )
        n, length = self.sequences.shape
        if not 2 <= length <= self.architecture.max_sequence_length:
            raise ValueError(
                f"sequence length must be in [2, {self.architecture.max_sequence_length}] "
                f"(architecture.max_sequence_length), got {length}"
            )
        if n and (self.sequences.min() < 0 or self.sequences.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size - 1}]")
        if self.loss_mask.shape != self.sequences.shape or self.loss_mask.dtype != np.bool_:
            raise ValueError(
                f"loss_mask must be a bool array of shape {self.sequences.shape}, "
                f"got shape {self.loss_mask.shape} dtype {self.loss_mask.dtype}"
            )
        if n and self.loss_mask[:, 0].any():
            raise ValueError("loss_mask must be False at position 0: the first token has no context to predict it")
        if n and not self.loss_mask.any(axis=1).all():
            raise ValueError("loss_mask must mark at least one target position in every sequence")

    @property
    def num_records(self) -> int:
        return int(self.sequences.shape[0])


@dataclass(frozen=True, kw_only=True, eq=False)
class SequenceModel:
    """What a language-model trainer returns: the black box and its claim.

    ``token_log_probs`` maps (n, T) int64 sequences to (n, T − 1) float64 log p(x_{t+1} | x_≤t).
    ``device`` is where training actually ran."""

    token_log_probs: Callable[[np.ndarray], np.ndarray]
    claim: PrivacyClaim
    device: str


class LanguageImplementation(Implementation):
    """An implementation with ``info.task == "language"``: it trains on a :class:`SequenceRequest`."""

    @abc.abstractmethod
    def train(self, request: SequenceRequest) -> SequenceModel:  # type: ignore[override]
        """Train the designated transformer with the implementation's own DP code."""


@dataclass(frozen=True, kw_only=True)
class TokenCanaryConfig:
    """m prefix → suffix canaries over a vocabulary of ``base_vocab_size`` + ``new_tokens`` tokens.

    New tokens are the ids [base_vocab_size, base_vocab_size + new_tokens). The paper finds the encoding
    degrades roughly as m / √new_tokens, so keep ``new_tokens`` of the order of m."""

    m: int = 1000
    prefix_length: int = 4
    suffix_length: int = 4
    base_vocab_size: int = 100
    new_tokens: int = 1000
    mode: TokenCanaryMode = "repeated"

    def __post_init__(self) -> None:
        check_int("m", self.m, low=1)
        check_int("prefix_length", self.prefix_length, low=1)
        check_int("suffix_length", self.suffix_length, low=1)
        check_int("base_vocab_size", self.base_vocab_size, low=1)
        check_int("new_tokens", self.new_tokens, low=2)
        check_choice("mode", self.mode, TOKEN_CANARY_MODES)

    @property
    def vocab_size(self) -> int:
        return self.base_vocab_size + self.new_tokens

    @property
    def sequence_length(self) -> int:
        return self.prefix_length + self.suffix_length


@dataclass(frozen=True, kw_only=True, eq=False)
class TokenCanaries:
    """Prefixes (m, prefix_length), trained suffixes and fresh comparison suffixes (m, suffix_length)."""

    config: TokenCanaryConfig
    prefixes: np.ndarray
    suffixes: np.ndarray
    comparison_suffixes: np.ndarray

    @property
    def m(self) -> int:
        return int(self.prefixes.shape[0])

    def sequences(self, suffixes: np.ndarray) -> np.ndarray:
        """Each prefix followed by the given suffix, (m, T) int64."""
        return np.concatenate([self.prefixes, suffixes], axis=1)

    def loss_mask(self) -> np.ndarray:
        """True on the suffix positions: the targets the model is trained and scored on."""
        mask = np.zeros((self.m, self.config.sequence_length), dtype=bool)
        mask[:, self.config.prefix_length :] = True
        return mask


def make_token_canaries(config: TokenCanaryConfig, *, rng: np.random.Generator) -> TokenCanaries:
    """Draw the canaries of ``config`` from ``rng`` (same seed, same canaries)."""
    m, base, new = config.m, config.base_vocab_size, config.new_tokens
    if config.mode == "repeated":
        prefixes = np.repeat(base + rng.integers(0, new, size=(m, 1)), config.prefix_length, axis=1)
        suffix_shape = (m, 1)
    else:
        prefixes = rng.integers(0, base, size=(m, config.prefix_length))
        suffix_shape = (m, config.suffix_length)
    suffixes = rng.integers(0, new, size=suffix_shape)
    # Uniform over the other new - 1 tokens: a shift by 1..new-1 modulo new.
    comparison = (suffixes + rng.integers(1, new, size=suffix_shape)) % new
    width = config.suffix_length // suffix_shape[1]
    return TokenCanaries(
        config=config,
        prefixes=prefixes.astype(np.int64),
        suffixes=np.repeat(base + suffixes, width, axis=1).astype(np.int64),
        comparison_suffixes=np.repeat(base + comparison, width, axis=1).astype(np.int64),
    )


def suffix_log_likelihood(token_log_probs: np.ndarray, *, prefix_length: int) -> np.ndarray:
    """Σ over suffix positions of log p(x_t | x_<t), from the black box's (n, T − 1) output whose column
    t − 1 predicts position t."""
    return token_log_probs[:, prefix_length - 1 :].sum(axis=1)


@dataclass(frozen=True, kw_only=True)
class LanguageAuditConfig:
    """Everything one language-model audit designates.

    The default is the quick profile: 1000 repeated-token canaries of 4 + 4 tokens over 100 + 1000 tokens,
    a one-block transformer of width 64, full-batch DP-SGD (q = 1, as the classification quick profile:
    for a given ε the one-run audit is tightest without subsampling) calibrated to ε = 2, 30 steps at
    learning rate 50 (a full batch averages each sequence's clipped gradient over m = 1000, and lr 50 is
    what lets a run without noise guess 998 of 1000 canaries); 6 s on an idle 2-core CPU, up to 40 s on a
    busy one. The design is always the pair design, so ε_L bounds the replace-one ε.
    """

    canaries: TokenCanaryConfig = field(default_factory=TokenCanaryConfig)
    architecture: TransformerArchitecture = field(default_factory=TransformerArchitecture)
    hyperparameters: DPHyperparameters = field(
        default_factory=lambda: DPHyperparameters(target_epsilon=2.0, sampling_rate=1.0, epochs=30, learning_rate=50.0)
    )
    guess_rule: GuessRule = field(default_factory=GuessRule)
    confidence: float = 0.95
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        check_probability("confidence", self.confidence)
        check_int("seed", self.seed, low=0)
        check_choice("device", self.device, DEVICES)
        if self.canaries.sequence_length > self.architecture.max_sequence_length:
            raise ValueError(
                f"canaries of {self.canaries.sequence_length} tokens do not fit "
                f"architecture.max_sequence_length = {self.architecture.max_sequence_length}"
            )

    design = LANGUAGE_DESIGN
    relation = LANGUAGE_RELATION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_language_audit(implementation: Implementation, config: LanguageAuditConfig) -> AuditResult:
    """Audit a language-model ``implementation`` once (pair design); never raises for its failures.

    One :class:`numpy.random.SeedSequence` from ``config.seed`` spawns the canaries', the membership bits'
    and the trainer's streams. The bits are drawn after training, so training cannot depend on them.
    """
    started = time.perf_counter()
    device = resolve_device(config.device)
    canary_seq, membership_seq, training_seq = np.random.SeedSequence(config.seed).spawn(3)
    canaries = make_token_canaries(config.canaries, rng=np.random.default_rng(canary_seq))
    m, prefix_length = canaries.m, config.canaries.prefix_length
    trained_sequences = canaries.sequences(canaries.suffixes)
    base = dict(
        implementation=implementation.info.name,
        expected=implementation.info.expected,
        detectability=implementation.info.detectability,
        design=config.design,
        relation=config.relation,
        delta=config.hyperparameters.delta,
        confidence=config.confidence,
        m=m,
        seed=config.seed,
        config=config.to_dict(),
    )

    def failed(cause: str) -> AuditResult:
        return AuditResult(
            **base, claimed_epsilon=math.nan, epsilon_lower_bound=0.0, guesses=0, correct=0,
            optimal_epsilon=audit_ceiling(config), verdict="error", device=device,
            seconds=time.perf_counter() - started, error=f"{implementation.info.name}: {cause}",
        )  # fmt: skip

    try:
        request = SequenceRequest(
            sequences=trained_sequences,
            loss_mask=canaries.loss_mask(),
            vocab_size=config.canaries.vocab_size,
            architecture=config.architecture,
            hyperparameters=config.hyperparameters,
            seed=int(training_seq.generate_state(1)[0] % 2**31),
            device=device,
        )
        trained = implementation.train(request)
        if not isinstance(trained, SequenceModel) or not isinstance(trained.claim, PrivacyClaim):
            return failed(f"train() must return a dpverify.language.SequenceModel with a PrivacyClaim, got {trained!r}")
        both = np.concatenate([trained_sequences, canaries.sequences(canaries.comparison_suffixes)])
        log_probs = np.asarray(trained.token_log_probs(both), dtype=np.float64)
        expected_shape = (2 * m, config.canaries.sequence_length - 1)
        if log_probs.shape != expected_shape:
            return failed(f"token_log_probs returned shape {log_probs.shape}, expected {expected_shape}")
        if not np.all(np.isfinite(log_probs)):
            return failed("token_log_probs returned NaN or infinite values (did training diverge?)")
        claimed_epsilon, derivation = claim_in_relation(trained.claim, config.relation)
    except Exception as exc:  # the implementation's failure is the audit's verdict, not a crash
        return failed(f"{type(exc).__name__}: {exc}")

    likelihood = suffix_log_likelihood(log_probs, prefix_length=prefix_length)
    trained_likelihood, comparison_likelihood = likelihood[:m], likelihood[m:]
    membership = np.random.default_rng(membership_seq).choice(np.array([-1, 1], dtype=np.int8), size=m)
    # S = +1 shows the trained suffix, S = −1 the fresh one: the score is log p(shown) − log p(other).
    scores = membership * (trained_likelihood - comparison_likelihood)
    # The best count of the declared grid and the verdict, as run_audit decides them.
    counts = config.guess_rule.counts(m)
    corrects = [count_correct(guesses_from_scores(scores, int(k), sides=config.guess_rule.sides), membership) for k in counts]
    bound_kwargs = dict(delta=config.hyperparameters.delta, confidence=config.guess_rule.corrected_confidence(config.confidence))
    bounds = np.atleast_1d(epsilon_lower_bound(m, counts, np.array(corrects), **bound_kwargs))
    rows = [(int(k), int(c), float(b)) for k, c, b in zip(counts, corrects, bounds)]
    guesses, correct, lower_bound = max(rows, key=lambda row: row[2])
    ceiling = audit_ceiling(config)
    needed = None
    if lower_bound > claimed_epsilon:
        verdict = "violation"
    elif claimed_epsilon >= ceiling:
        verdict, needed = "undecided", canaries_needed(config, claimed_epsilon)
    else:
        verdict = "pass"
    return AuditResult(
        **base,
        claimed_epsilon=claimed_epsilon,
        library_epsilon=trained.claim.epsilon,
        claim_derivation=derivation,
        epsilon_lower_bound=lower_bound,
        fdp_epsilon_lower_bound=float(fdp_epsilon_lower_bound(m, guesses, correct, **bound_kwargs)),
        guesses=guesses,
        correct=correct,
        optimal_epsilon=ceiling,
        canaries_needed=needed,
        verdict=verdict,
        device=trained.device,
        seconds=time.perf_counter() - started,
        scores=scores,
        membership=membership,
        bound_by_guesses=tuple(rows),
    )
