"""The language-model audit (UniAud section 6): token canaries (:mod:`dpverify.canaries.tokens`) through
the sequence contract, scored by how much likelier the trained suffix is than a fresh one.

The classification audit asks whether a model learned the label of a trigger; here it asks whether a
causal language model learned the *suffix* of a prefix. Two designs, as for classification.
``inclusion`` (the default) keeps each canary in the training set with probability ½ (S_i drawn before
training) and scores every canary by how much more likely its trained suffix is than the fresh one; it
tests the *add/remove* ε that libraries report. ``pair`` (Algorithm 2) trains on all m canaries, then draws
S_i ∈ {−1, +1}, shows the trained suffix (S = +1) or the fresh one (S = −1), and scores

    score_i = Σ_{t ∈ suffix} log p(shown_t | shown_<t) − Σ_{t ∈ suffix} log p(other_t | other_<t);

it bounds the *replace-one* ε (one sequence's suffix replaced), so the claim is converted with
:func:`dpverify.audits.steps.claim_in_relation`. The inclusion design is the default because a
replace-one claim is about twice the add/remove one, which the same m canaries can refute far less often.
The data-dependent designs do not apply: they audit real classification records. One sequence is the
privacy unit.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpverify._validation import check_choice, check_int, check_probability
from dpverify.audits.steps import (
    AuditClock,
    Progress,
    audit_streams,
    audit_through_contract,
    membership_after_training,
    membership_before_training,
    present_pair,
    query_black_box,
    resolve_device,
)
from dpverify.canaries.tokens import TokenCanaryConfig, make_token_canaries, suffix_log_likelihood
from dpverify.config import (
    DESIGN_RELATION,
    DEVICES,
    HYPERPARAMETER_FIELDS,
    check_timeout,
    override_guess_rule,
    override_hyperparameters,
)
from dpverify.contract import (
    DPHyperparameters,
    Implementation,
    SequenceModel,
    SequenceRequest,
    StepProgress,
    TransformerArchitecture,
)
from dpverify.results import AuditResult
from dpverify.stats.scoring import GuessRule

#: The designs whose relation a language audit honours: the bits pick the trained canaries (inclusion,
#: add/remove) or are drawn after training on all of them (pair, replace-one).
LANGUAGE_DESIGNS: tuple[str, ...] = ("inclusion", "pair")


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
    timeout: float | None = 1800

    def __post_init__(self) -> None:
        check_timeout(self.timeout)
        check_choice("design", self.design, LANGUAGE_DESIGNS)
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
TOP_NAMES = ("design", "confidence", "seed", "device", "timeout")
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
        **target, delta=hp.delta, confidence=config.confidence, seed=config.seed, device=config.device,
        timeout=config.timeout,
    )


def run_language_audit(
    implementation: Implementation,
    config: LanguageAuditConfig,
    *,
    progress: Progress | None = None,
    step_progress: StepProgress | None = None,
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
    drawn_before, trained_on = membership_before_training(config.relation, membership_rng, m)
    trained_sequences = canaries.sequences(canaries.suffixes)
    request = SequenceRequest(
        sequences=trained_sequences[trained_on],
        loss_mask=canaries.loss_mask()[trained_on],
        vocab_size=config.canaries.vocab_size,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
        progress=step_progress,
    )
    clock.auditor_seconds = time.perf_counter() - auditor_started

    def score(trained: SequenceModel) -> tuple[np.ndarray, np.ndarray, None]:
        both = np.concatenate([trained_sequences, canaries.sequences(canaries.comparison_suffixes)])
        log_probs = query_black_box(
            trained, both, expected_shape=(2 * m, config.canaries.sequence_length - 1), head="token_log_probs"
        )
        likelihood = suffix_log_likelihood(log_probs, prefix_length=config.canaries.prefix_length)
        trained_likelihood, fresh_likelihood = likelihood[:m], likelihood[m:]
        membership = membership_after_training(drawn_before, membership_rng, m)
        if drawn_before is None:
            shown, other = present_pair(membership, trained_likelihood, fresh_likelihood)
        else:
            shown, other = trained_likelihood, fresh_likelihood
        # How much likelier the shown suffix is than the other one.
        return shown - other, membership, None

    say(f"training {implementation.info.name} on {request.num_records} of {m} token canaries ({device})")
    return audit_through_contract(
        implementation, config, [(request, score)], m=m, clock=clock, say=say, device=request.device, returns=SequenceModel
    )  # type: ignore[arg-type]  # the shared steps read only what both configs have
