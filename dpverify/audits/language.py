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
:func:`dpverify.audits.claims.claim_in_relation`. The inclusion design is the default because a
replace-one claim is about twice the add/remove one, which the same m canaries can refute far less often.
The data-dependent designs do not apply: they audit real classification records. One sequence is the
privacy unit.

The m canaries may be split over ``pooled_runs`` independent runs (each with its own canaries over its own
vocabulary), pooled into one audit as in the classification audit. Dirac token canaries (the default)
compare with one base token shared by a run's canaries, so each run's scores are centred on their mean
before pooling: a post-processing of that run's model, which moves the run's shared offset, not a
canary's rank within its run. A Dirac canary whose suffix is exactly as likely after its own prefix as after
a token no sequence contains (its prefix's embedding row untouched, impossible where every row gets noise)
is ranked last: what shows an embedding left without noise.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dpverify._validation import check_choice, check_int, check_probability
from dpverify.audits.membership import (
    audit_streams,
    membership_after_training,
    membership_before_training,
    present_pair,
)
from dpverify.audits.planning import Progress, resolve_device
from dpverify.audits.training import AuditClock, each_pooled_run, query_black_box
from dpverify.audits.verdict import audit_through_contract
from dpverify.canaries.tokens import (
    EXCHANGEABLE_MODES,
    TokenCanaryConfig,
    check_dirac_token_room,
    make_token_canaries,
    suffix_log_likelihood,
)
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

    The default is the quick profile: 10 000 Dirac token canaries (:mod:`dpverify.canaries.tokens`) of
    1 + 1 tokens, pooled over 10 independent runs of 1000 (each over 100 + 2000 tokens), in a one-block
    transformer of width 16 whose token embedding and LM head start at zero; full-batch DP-SGD (q = 1: the
    claimed run is then exactly μ-GDP) calibrated to ε = 2, 10 steps, clipping C = 0.5 at learning rate 1/C.
    A canary's gradient (norm ≈ the hidden state's, 4, far above C) is clipped, and lies almost all on its
    own head row, so its score carries 0.97–1.06 of the claimed μ (benchmarks/results/language-separation.md);
    pooling runs keeps the head (V = 100 + 2m) small, whose per-sample gradients cost hooks mode m² a run.
    :data:`REPEATED_TOKEN_BASELINE` is UniAud's repeated-token setting. ``design`` is ``inclusion``
    (add/remove ε, the default) or, for the drawn canary modes only, ``pair`` (replace-one ε).
    """

    canaries: TokenCanaryConfig = field(
        default_factory=lambda: TokenCanaryConfig(
            m=10_000, prefix_length=1, suffix_length=1, base_vocab_size=100, new_tokens=2000, mode="dirac"
        )
    )
    architecture: TransformerArchitecture = field(
        default_factory=lambda: TransformerArchitecture(width=16, heads=2, init="dirac")
    )
    hyperparameters: DPHyperparameters = field(
        default_factory=lambda: DPHyperparameters(
            target_epsilon=2.0, sampling_rate=1.0, epochs=10, max_grad_norm=0.5, learning_rate=2.0
        )
    )
    design: str = "inclusion"
    guess_rule: GuessRule = field(default_factory=GuessRule)
    confidence: float = 0.95
    seed: int = 0
    device: str = "auto"
    timeout: float | None = 1800
    pooled_runs: int = 10

    def __post_init__(self) -> None:
        check_timeout(self.timeout)
        check_choice("design", self.design, LANGUAGE_DESIGNS)
        check_probability("confidence", self.confidence)
        check_int("seed", self.seed, low=0)
        check_choice("device", self.device, DEVICES)
        check_int("pooled_runs", self.pooled_runs, low=1)
        if self.canaries.m < self.pooled_runs:
            raise ValueError(
                f"each pooled run needs a canary, so m must be >= pooled_runs, got m={self.canaries.m}, "
                f"pooled_runs={self.pooled_runs}"
            )
        if self.design == "pair" and self.canaries.mode not in EXCHANGEABLE_MODES:
            raise ValueError(
                f"the pair design needs a fresh suffix exchangeable with the trained one (mode "
                f"{' or '.join(EXCHANGEABLE_MODES)}), got mode={self.canaries.mode!r}; use design='inclusion'"
            )
        if self.canaries.mode == "dirac":
            check_dirac_token_room(m=max(self.canaries_per_run), new_tokens=self.canaries.new_tokens)
        if self.canaries.sequence_length > self.architecture.max_sequence_length:
            raise ValueError(
                f"canaries of {self.canaries.sequence_length} tokens do not fit "
                f"architecture.max_sequence_length = {self.architecture.max_sequence_length}"
            )

    @property
    def relation(self) -> str:
        return DESIGN_RELATION[self.design]

    @property
    def canaries_per_run(self) -> tuple[int, ...]:
        """The m canaries split over ``pooled_runs`` runs as evenly as they go."""
        share, extra = divmod(self.canaries.m, self.pooled_runs)
        return tuple(share + (run < extra) for run in range(self.pooled_runs))

    @property
    def audit_size(self) -> int:
        """m, the number of canaries the bound counts (what :func:`dpverify.audits.planning.audit_ceiling` reads)."""
        return self.canaries.m

    def with_overrides(self, **overrides: Any) -> LanguageAuditConfig:
        """A copy with flat overrides: the canaries' and the architecture's field names, the classification
        audit's hyperparameter names (``epsilon``, ``noise_multiplier``, ``learning_rate``, ...),
        ``guesses``/``sides``, ``confidence``, ``seed``, ``device`` and ``pooled_runs``; unknown names are a
        ``ValueError``. Dirac canaries own two new tokens each, so unless ``new_tokens`` is given it follows
        the canaries of the largest run."""
        canary_names = {f.name for f in dataclasses.fields(TokenCanaryConfig)}
        architecture_names = {f.name for f in dataclasses.fields(TransformerArchitecture)}
        unknown = sorted(set(overrides) - set(LANGUAGE_SETTINGS))
        if unknown:
            raise ValueError(
                f"unknown language audit setting(s) {', '.join(unknown)}; known: {', '.join(LANGUAGE_SETTINGS)}"
            )
        canary_fields = {k: v for k, v in overrides.items() if k in canary_names}
        if canary_fields.get("mode", self.canaries.mode) == "dirac" and "new_tokens" not in canary_fields:
            m, runs = canary_fields.get("m", self.canaries.m), overrides.get("pooled_runs", self.pooled_runs)
            canary_fields["new_tokens"] = 2 * -(-m // runs)
        return dataclasses.replace(
            self,
            canaries=dataclasses.replace(self.canaries, **canary_fields),
            architecture=dataclasses.replace(
                self.architecture, **{k: v for k, v in overrides.items() if k in architecture_names}
            ),
            hyperparameters=override_hyperparameters(self.hyperparameters, overrides),
            guess_rule=override_guess_rule(self.guess_rule, overrides),
            **{k: v for k, v in overrides.items() if k in TOP_NAMES},
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: UniAud's language-model setting (section 6), the measured baseline: one run of 1000 repeated-token
#: canaries of 4 + 4 tokens over 100 + 1000 tokens, a randomly initialised one-block transformer of width
#: 64, q = 1, 30 steps at learning rate 20 (lr 50 diverged on most seeds). Without noise it reaches ε_L
#: 2.4–3.6, with noise at claimed ε ≤ 8 about 0 (benchmarks/results/language.md).
REPEATED_TOKEN_BASELINE = LanguageAuditConfig(
    canaries=TokenCanaryConfig(),
    architecture=TransformerArchitecture(),
    hyperparameters=DPHyperparameters(target_epsilon=2.0, sampling_rate=1.0, epochs=30, learning_rate=20.0),
    pooled_runs=1,
)

#: Settings of the audit itself rather than of its canaries, model or training.
TOP_NAMES = ("design", "confidence", "seed", "device", "timeout", "pooled_runs")
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
    """Audit a language-model ``implementation`` on ``config.canaries.m`` token canaries, split over
    ``config.pooled_runs`` independent training runs and pooled into one audit; never raises for its
    failures.

    One :class:`numpy.random.SeedSequence` from ``config.seed`` (and the run's index) spawns each run's
    canaries', membership bits' and trainer's streams. In the pair design the bits are drawn after
    training, so training cannot depend on them; in the inclusion design they pick the canaries trained on
    and never reach the trainer.
    """
    say = progress or (lambda message: None)
    clock = AuditClock(time.perf_counter())
    device = resolve_device(config.device)
    pooled = f" in {config.pooled_runs} runs" if config.pooled_runs > 1 else ""
    say(f"training {implementation.info.name} on {config.audit_size} token canaries{pooled} ({device})")

    runs = each_pooled_run(config, _one_run, device=device, clock=clock, step_progress=step_progress, say=say)
    return audit_through_contract(
        implementation, config, runs, m=config.audit_size, clock=clock, say=say, device=device, returns=SequenceModel
    )  # type: ignore[arg-type]  # the shared steps read only what both configs have


def _one_run(
    config: LanguageAuditConfig, run: int, *, device: str, step_progress: StepProgress | None
) -> tuple[SequenceRequest, Callable[[SequenceModel], tuple[np.ndarray, np.ndarray, None]]]:
    """Run ``run``'s request (its own canaries, over its own vocabulary, and secret bits) and the scorer
    of its black box."""
    canary_rng, membership_rng, training_seed = audit_streams(config.seed, run=run)
    canary_config = dataclasses.replace(config.canaries, m=config.canaries_per_run[run])
    canaries = make_token_canaries(canary_config, rng=canary_rng)
    m = canaries.m
    drawn_before, trained_on = membership_before_training(config.relation, membership_rng, m)
    trained_sequences = canaries.sequences(canaries.suffixes)
    request = SequenceRequest(
        sequences=trained_sequences[trained_on],
        loss_mask=canaries.loss_mask()[trained_on],
        vocab_size=canary_config.vocab_size,
        architecture=config.architecture,
        hyperparameters=config.hyperparameters,
        seed=training_seed,
        device=device,
        progress=step_progress,
    )

    dirac = canary_config.mode == "dirac"
    queries = [trained_sequences, canaries.sequences(canaries.comparison_suffixes)]
    if dirac:  # each suffix after a prefix of the comparison token, which no sequence contains
        unseen_prefix = np.broadcast_to(canaries.comparison_suffixes[:, :1], canaries.prefixes.shape)
        queries.append(np.concatenate([unseen_prefix, canaries.suffixes], axis=1))

    def score(trained: SequenceModel) -> tuple[np.ndarray, np.ndarray, None]:
        log_probs = query_black_box(
            trained,
            np.concatenate(queries),
            expected_shape=(len(queries) * m, canary_config.sequence_length - 1),
            head="token_log_probs",
        )
        likelihood = suffix_log_likelihood(log_probs, prefix_length=canary_config.prefix_length)
        trained_likelihood, fresh_likelihood = likelihood[:m], likelihood[m : 2 * m]
        membership = membership_after_training(drawn_before, membership_rng, m)
        if drawn_before is None:
            shown, other = present_pair(membership, trained_likelihood, fresh_likelihood)
        else:
            shown, other = trained_likelihood, fresh_likelihood
        # How much likelier the shown suffix is than the other one.
        scores = shown - other
        if dirac:
            # The run's shared offset (its comparison token's noise, its init) set apart from its canaries'
            # own rows before runs are pooled. The mean, not the median: a run's members and non-members may
            # split into two clusters (no noise), between which a median jumps with the members' count.
            scores = scores - scores.mean()
            scores = _untouched_last(scores, trained_likelihood, likelihood[2 * m :])
        return scores, membership, None

    return request, score


def _untouched_last(scores: np.ndarray, after_own_prefix: np.ndarray, after_unseen_prefix: np.ndarray) -> np.ndarray:
    """``scores`` with every canary whose prefix the run left untouched ranked below all others.

    A canary's prefix row is untouched when its suffix is exactly as likely, to the last bit, after its own
    prefix as after a token that no sequence contains: both embedding rows are then where they started. Noise
    on every row makes that an event of probability 0, so in a run that keeps its claim this changes no score;
    but where the embedding gets no noise, a non-member's prefix row never moves and a member's does
    (benchmarks/results/language-embedding-leak.md), and this ranking is what sees it."""
    untouched = after_own_prefix == after_unseen_prefix
    if not untouched.any():
        return scores
    ranked = scores.copy()
    ranked[untouched] = scores[~untouched].min(initial=0.0) - 1.0
    return ranked
