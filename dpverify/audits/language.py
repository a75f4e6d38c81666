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

Two designs, as for classification. ``inclusion`` (the default) keeps each canary in the training set
with probability ½ (S_i drawn before training) and scores every canary by how much more likely its
trained suffix is than the fresh one; it tests the *add/remove* ε that libraries report. ``pair``
(Algorithm 2) trains on all m canaries, then draws S_i ∈ {−1, +1}, shows the trained suffix (S = +1) or
the fresh one (S = −1), and scores

    score_i = Σ_{t ∈ suffix} log p(shown_t | shown_<t) − Σ_{t ∈ suffix} log p(other_t | other_<t);

it bounds the *replace-one* ε (one sequence's suffix replaced), so the claim is converted with
:func:`dpverify.audits.steps.claim_in_relation`. The inclusion design is the default because a replace-one claim
is about twice the add/remove one, which the same m canaries can refute far less often.
One sequence is the privacy unit. This module imports numpy (and dpverify's numpy/scipy modules) only.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from dpverify._validation import check_choice, check_int, check_probability
from dpverify.audits.steps import (
    AuditClock,
    Progress,
    audit_streams,
    audit_through_contract,
    draw_membership,
    membership_before_training,
    query_black_box,
    resolve_device,
)
from dpverify.config import DESIGN_RELATION, DEVICES, HYPERPARAMETER_FIELDS, override_guess_rule, override_hyperparameters
from dpverify.contract import DPHyperparameters, Implementation, PrivacyClaim
from dpverify.results import AuditResult
from dpverify.stats.scoring import GuessRule

TokenCanaryMode = Literal["repeated", "new_token"]
TOKEN_CANARY_MODES: tuple[str, ...] = ("repeated", "new_token")



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
    learning rate 20. A full batch averages each sequence's clipped gradient over the ~500 canaries kept;
    lr 50 diverged on most seeds, and at lr 20 a run without noise gave ε_L 2.4–3.0 at confidence 0.994 on
    10 of 10 seeds (ε_O 4.15), which refutes a claim of 2. About 3.5 s on an idle 2-core CPU, up to 40 s on a
    busy one. ``design`` is ``inclusion`` (add/remove ε, the default) or ``pair`` (replace-one ε).
    """

    canaries: TokenCanaryConfig = field(default_factory=TokenCanaryConfig)
    architecture: TransformerArchitecture = field(default_factory=TransformerArchitecture)
    hyperparameters: DPHyperparameters = field(
        default_factory=lambda: DPHyperparameters(target_epsilon=2.0, sampling_rate=1.0, epochs=30, learning_rate=20.0)
    )
    design: str = "inclusion"
    guess_rule: GuessRule = field(default_factory=GuessRule)
    confidence: float = 0.95
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        check_choice("design", self.design, tuple(DESIGN_RELATION))
        check_probability("confidence", self.confidence)
        check_int("seed", self.seed, low=0)
        check_choice("device", self.device, DEVICES)
        if self.canaries.sequence_length > self.architecture.max_sequence_length:
            raise ValueError(
                f"canaries of {self.canaries.sequence_length} tokens do not fit "
                f"architecture.max_sequence_length = {self.architecture.max_sequence_length}"
            )

    @property
    def relation(self) -> str:
        return DESIGN_RELATION[self.design]

    @property
    def audit_size(self) -> int:
        """m, the number of canaries the bound counts (what :func:`dpverify.audits.steps.audit_ceiling` reads)."""
        return self.canaries.m

    def with_overrides(self, **overrides: Any) -> LanguageAuditConfig:
        """A copy with flat overrides: the canaries' and the architecture's field names, the classification
        audit's hyperparameter names (``epsilon``, ``noise_multiplier``, ``learning_rate``, ...),
        ``guesses``/``sides``, ``confidence``, ``seed`` and ``device``; unknown names are a ``ValueError``."""
        canary_names = {f.name for f in dataclasses.fields(TokenCanaryConfig)}
        architecture_names = {f.name for f in dataclasses.fields(TransformerArchitecture)}
        unknown = sorted(set(overrides) - set(LANGUAGE_SETTINGS))
        if unknown:
            raise ValueError(
                f"unknown language audit setting(s) {', '.join(unknown)}; known: {', '.join(LANGUAGE_SETTINGS)}"
            )
        return dataclasses.replace(
            self,
            canaries=dataclasses.replace(self.canaries, **{k: v for k, v in overrides.items() if k in canary_names}),
            architecture=dataclasses.replace(
                self.architecture, **{k: v for k, v in overrides.items() if k in architecture_names}
            ),
            hyperparameters=override_hyperparameters(self.hyperparameters, overrides),
            guess_rule=override_guess_rule(self.guess_rule, overrides),
            **{k: v for k, v in overrides.items() if k in TOP_NAMES},
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Settings of the audit itself rather than of its canaries, model or training.
TOP_NAMES = ("design", "confidence", "seed", "device")
#: Every flat name :meth:`LanguageAuditConfig.with_overrides` takes.
LANGUAGE_SETTINGS: tuple[str, ...] = tuple(
    sorted(
        {f.name for f in dataclasses.fields(TokenCanaryConfig)}
        | {f.name for f in dataclasses.fields(TransformerArchitecture)}
        | set(HYPERPARAMETER_FIELDS)
        | {"epsilon", "guesses", "sides", *TOP_NAMES}
    )
)


def language_config_like(config: Any) -> LanguageAuditConfig:
    """The language quick default with ``config``'s privacy target (target ε or σ, δ), guess rule,
    confidence, seed and device: what a classification audit's settings mean for a language model (its
    canary and MLP settings do not apply). A :class:`LanguageAuditConfig` is returned as it is."""
    if isinstance(config, LanguageAuditConfig):
        return config
    hp = config.hyperparameters
    target = {"epsilon": hp.target_epsilon} if hp.target_epsilon is not None else {"noise_multiplier": hp.noise_multiplier}
    return dataclasses.replace(LanguageAuditConfig(), guess_rule=config.guess_rule).with_overrides(
        **target, delta=hp.delta, confidence=config.confidence, seed=config.seed, device=config.device
    )


def run_language_audit(
    implementation: Implementation, config: LanguageAuditConfig, *, progress: Progress | None = None
) -> AuditResult:
    """Audit a language-model ``implementation`` once; never raises for its failures.

    One :class:`numpy.random.SeedSequence` from ``config.seed`` spawns the canaries', the membership bits'
    and the trainer's streams. In the pair design the bits are drawn after training, so training cannot
    depend on them; in the inclusion design they pick the canaries trained on and never reach the trainer.
    """
    say = progress or (lambda message: None)
    clock = AuditClock(time.perf_counter())
    device = resolve_device(config.device)
    auditor_started = time.perf_counter()
    canary_rng, membership_rng, training_seed = audit_streams(config.seed)
    canaries = make_token_canaries(config.canaries, rng=canary_rng)
    m = canaries.m
    drawn_before, trained_on = membership_before_training(config.design, membership_rng, m)
    trained_sequences = canaries.sequences(canaries.suffixes)
    request = SequenceRequest(
        sequences=trained_sequences[trained_on],
        loss_mask=canaries.loss_mask()[trained_on],
        vocab_size=config.canaries.vocab_size,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
    )
    clock.auditor_seconds = time.perf_counter() - auditor_started

    def score(trained: SequenceModel) -> tuple[np.ndarray, np.ndarray, None]:
        both = np.concatenate([trained_sequences, canaries.sequences(canaries.comparison_suffixes)])
        log_probs = query_black_box(
            trained, both, expected_shape=(2 * m, config.canaries.sequence_length - 1), head="token_log_probs"
        )
        likelihood = suffix_log_likelihood(log_probs, prefix_length=config.canaries.prefix_length)
        preference = likelihood[:m] - likelihood[m:]  # how much likelier the trained suffix is than the fresh one
        if drawn_before is not None:
            return preference, drawn_before, None
        membership = draw_membership(membership_rng, m)  # after training (Algorithm 2)
        # S = +1 shows the trained suffix, S = −1 the fresh one: the score is log p(shown) − log p(other).
        return membership * preference, membership, None

    say(f"training {implementation.info.name} on {request.num_records} of {m} token canaries ({device})")
    return audit_through_contract(
        implementation, config, request, score, m=m, clock=clock, say=say, returns=SequenceModel
    )  # type: ignore[arg-type]  # the shared steps read only what both configs have
