"""Language-model canaries, the sequence contract and the audit's bookkeeping (no torch needed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpverify.audits.language import REPEATED_TOKEN_BASELINE, LanguageAuditConfig, run_language_audit
from dpverify.canaries.tokens import TokenCanaryConfig, make_token_canaries, suffix_log_likelihood
from dpverify.contract import (
    DPHyperparameters,
    ImplementationInfo,
    LanguageImplementation,
    PrivacyClaim,
    SequenceModel,
    SequenceRequest,
    TransformerArchitecture,
)

MODES = ("repeated", "new_token")


def canaries(mode: str, seed: int = 0, **overrides):
    config = TokenCanaryConfig(m=300, prefix_length=3, suffix_length=5, base_vocab_size=50, new_tokens=40, mode=mode, **overrides)
    return make_token_canaries(config, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("mode", MODES)
def test_same_seed_same_canaries_other_seed_other_canaries(mode):
    first, again, other = canaries(mode, 0), canaries(mode, 0), canaries(mode, 1)
    for name in ("prefixes", "suffixes", "comparison_suffixes"):
        assert np.array_equal(getattr(first, name), getattr(again, name))
    assert not np.array_equal(first.suffixes, other.suffixes)


@pytest.mark.parametrize("mode", MODES)
def test_shapes_and_token_ranges(mode):
    c = canaries(mode)
    base, vocab = c.config.base_vocab_size, c.config.vocab_size
    assert c.prefixes.shape == (300, 3) and c.suffixes.shape == c.comparison_suffixes.shape == (300, 5)
    assert c.sequences(c.suffixes).shape == (300, 8) and c.sequences(c.suffixes).dtype == np.int64
    for suffix in (c.suffixes, c.comparison_suffixes):  # suffixes are new tokens only
        assert suffix.min() >= base and suffix.max() < vocab
    if mode == "repeated":  # one new token repeated as prefix, another repeated as suffix
        assert c.prefixes.min() >= base and c.prefixes.max() < vocab
        for block in (c.prefixes, c.suffixes, c.comparison_suffixes):
            assert (block == block[:, :1]).all()
    else:  # random base-vocabulary prefix, one new token per suffix position
        assert c.prefixes.min() >= 0 and c.prefixes.max() < base
        assert not (c.suffixes == c.suffixes[:, :1]).all()


@pytest.mark.parametrize("mode", MODES)
def test_fresh_suffix_differs_from_the_trained_one_at_every_position(mode):
    c = canaries(mode)
    assert (c.comparison_suffixes != c.suffixes).all()


@pytest.mark.parametrize("mode", MODES)
def test_fresh_suffix_tokens_are_uniform_over_the_other_new_tokens(mode):
    """Exchangeability of (trained, fresh) needs the shift fresh − trained (mod |V_new|) uniform on
    1..|V_new|−1. A chi-square test at level 0.1 % on 300·(1 or 5) draws: fails a correct draw 1 time in 1000."""
    from scipy import stats

    c = canaries(mode)
    new = c.config.new_tokens
    shifts = ((c.comparison_suffixes - c.suffixes) % new)[:, 0 if mode == "repeated" else slice(None)].ravel()
    observed = np.bincount(shifts, minlength=new)[1:]
    assert stats.chisquare(observed).pvalue > 1e-3


def test_loss_mask_covers_the_suffix_only():
    c = canaries("repeated")
    mask = c.loss_mask()
    assert mask.shape == (300, 8) and mask.dtype == np.bool_
    assert not mask[:, :3].any() and mask[:, 3:].all()


def test_suffix_log_likelihood_sums_the_columns_that_predict_suffix_tokens():
    # column t − 1 of the black box's output predicts token t; with prefix_length 2 the suffix is 2..4
    log_probs = np.array([[-1.0, -2.0, -4.0, -8.0]])
    assert suffix_log_likelihood(log_probs, prefix_length=2) == -14.0


def request(**overrides):
    fields = dict(
        sequences=np.array([[1, 2, 3], [1, 4, 5]], dtype=np.int64),
        loss_mask=np.array([[False, False, True], [False, True, True]]),
        vocab_size=6,
        hyperparameters=DPHyperparameters(noise_multiplier=1.0),
    )
    return SequenceRequest(**{**fields, **overrides})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TokenCanaryConfig(mode="random"), "mode must be one of 'repeated', 'new_token', 'dirac', got 'random'"),
        (lambda: TransformerArchitecture(init="xavier"), "init must be one of 'random', 'dirac', got 'xavier'"),
        (lambda: LanguageAuditConfig(design="pair"), "the pair design needs a fresh suffix exchangeable with the trained one"),
        (lambda: LanguageAuditConfig(pooled_runs=0), "pooled_runs must be >= 1, got 0"),
        (
            lambda: LanguageAuditConfig(canaries=TokenCanaryConfig(m=10_000, new_tokens=1000, mode="dirac")),
            "new_tokens must be >= 2 × the canaries of a run, got new_tokens=1000, m=1000",
        ),
        (lambda: TokenCanaryConfig(new_tokens=1), "new_tokens must be >= 2, got 1"),
        (lambda: TokenCanaryConfig(prefix_length=0), "prefix_length must be >= 1, got 0"),
        (lambda: TransformerArchitecture(width=30, heads=4), "width must be a multiple of heads"),
        (
            lambda: LanguageAuditConfig(canaries=TokenCanaryConfig(prefix_length=20, suffix_length=20)),
            "canaries of 40 tokens do not fit architecture.max_sequence_length = 32",
        ),
        (lambda: LanguageAuditConfig(confidence=1.5), "confidence must be in (0, 1), got 1.5"),
        (lambda: request(sequences=np.array([[1, 2, 3], [1, 4, 6]])), "token ids must lie in [0, 5]"),
        (lambda: request(sequences=np.zeros((2, 3), dtype=np.int32)), "sequences must be a 2-D int64 array"),
        (lambda: request(loss_mask=np.ones((2, 3), dtype=bool)), "loss_mask must be False at position 0"),
        (lambda: request(loss_mask=np.zeros((2, 3), dtype=bool)), "at least one target position in every sequence"),
        (lambda: request(loss_mask=np.ones((2, 2), dtype=bool)), "loss_mask must be a bool array of shape (2, 3)"),
        (lambda: request(sequences=np.zeros((2, 40), dtype=np.int64), loss_mask=np.ones((2, 40), dtype=bool)), "sequence length must be in [2, 32]"),
    ],
)
def test_bad_input_is_refused_at_the_door(build, message):
    with pytest.raises(ValueError) as raised:
        build()
    assert message in str(raised.value)


class WrongShape(LanguageImplementation):
    """Trains nothing and returns a black box of the wrong shape: the audit must end as ``error``."""

    info = ImplementationInfo(name="wrong-shape", library="none", task="language")

    def train(self, request: SequenceRequest) -> SequenceModel:
        claim = PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="none", noise_multiplier=1.0, sampling_rate=1.0, steps=1, relation="replace_one")
        return SequenceModel(token_log_probs=lambda s: np.zeros(s.shape), claim=claim, device="cpu")  # one column too many


def test_a_black_box_of_the_wrong_shape_is_an_error_not_a_pass():
    config = dataclasses.replace(REPEATED_TOKEN_BASELINE, canaries=TokenCanaryConfig(m=10, new_tokens=10), device="cpu")
    result = run_language_audit(WrongShape(), config)
    assert result.verdict == "error" and "expected (20, 7)" in result.error
    assert result.design == "inclusion" and result.relation == "add_remove"  # the default design


def test_config_is_frozen_and_serialisable():
    config = LanguageAuditConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]
    assert config.to_dict()["canaries"]["mode"] == "dirac" and config.to_dict()["architecture"]["init"] == "dirac"


class Recorder(LanguageImplementation):
    """Remembers the request and returns a black box that prefers nothing (log p = log ½ everywhere)."""

    info = ImplementationInfo(name="recorder", library="none", task="language")

    def train(self, request: SequenceRequest) -> SequenceModel:
        self.request = request
        claim = PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="none", noise_multiplier=5.0, sampling_rate=1.0, steps=1)
        return SequenceModel(token_log_probs=lambda s: np.full((s.shape[0], s.shape[1] - 1), np.log(0.5)), claim=claim, device="cpu")


def test_inclusion_design_trains_exactly_the_canaries_whose_bit_is_plus_one():
    from dpverify.audits.membership import audit_streams

    """The secret bits select the training set and nothing else reaches the trainer; a black box that
    prefers nothing carries no signal, so its pass could not see: undecided, never green."""
    config = dataclasses.replace(REPEATED_TOKEN_BASELINE, canaries=TokenCanaryConfig(m=200, new_tokens=50), device="cpu", seed=3)
    recorder = Recorder()
    result = run_language_audit(recorder, config)
    drawn = make_token_canaries(config.canaries, rng=audit_streams(3)[0])
    members = result.membership == 1
    assert np.array_equal(recorder.request.sequences, drawn.sequences(drawn.suffixes)[members])
    assert 60 < members.sum() < 140  # Binomial(200, ½): outside this range with probability < 1e-7
    assert result.relation == "add_remove" and result.verdict == "undecided" and result.blind


def test_overrides_route_to_their_part_and_unknown_names_are_refused():
    config = REPEATED_TOKEN_BASELINE.with_overrides(m=50, width=32, epsilon=float("inf"), guesses=10, design="pair", seed=4)
    assert (config.canaries.m, config.architecture.width, config.seed, config.design) == (50, 32, 4, "pair")
    assert config.hyperparameters.noise_multiplier == 0.0 and config.hyperparameters.target_epsilon is None
    assert config.guess_rule.count == 10 and config.relation == "replace_one" and config.audit_size == 50
    with pytest.raises(ValueError, match="unknown language audit setting.*hidden_width"):
        LanguageAuditConfig().with_overrides(hidden_width=10)


def test_a_classification_config_carries_its_privacy_target_level_seed_and_device():
    from dpverify.config import profile_config
    from dpverify.audits.language import language_config_like

    classification = profile_config("quick", epsilon=4.0, seed=9, confidence=0.99, device="cpu", guesses=20)
    config = language_config_like(classification)
    assert config.hyperparameters.target_epsilon == 4.0 and config.hyperparameters.delta == classification.hyperparameters.delta
    assert (config.seed, config.confidence, config.device, config.guess_rule) == (9, 0.99, "cpu", classification.guess_rule)
    assert config.canaries == LanguageAuditConfig().canaries  # the MLP's canaries do not apply
    non_private = language_config_like(profile_config("quick", epsilon=float("inf")))
    assert non_private.hyperparameters.noise_multiplier == 0.0


def test_run_audit_sends_a_language_implementation_to_the_language_audit():
    from dpverify.audits import run_audit
    from dpverify.config import profile_config

    result = run_audit(WrongShape(), profile_config("quick", device="cpu"))
    assert result.verdict == "error" and "token_log_probs returned shape" in result.error
    with pytest.raises(TypeError, match="trains a classifier"):
        from tests.doubles import Oblivious

        run_audit(Oblivious(claimed_epsilon=1.0, info=ImplementationInfo(name="x", library="numpy")), LanguageAuditConfig())


def dirac(m: int = 300, seed: int = 0, **overrides):
    config = TokenCanaryConfig(m=m, prefix_length=2, suffix_length=1, base_vocab_size=50, new_tokens=2 * m, mode="dirac", **overrides)
    return make_token_canaries(config, rng=np.random.default_rng(seed))


def test_each_dirac_canary_owns_its_prefix_and_suffix_token():
    """Canary i's prefix token is base + i and its suffix token base + m + i: 2m new tokens, each used by
    one canary only, none of them a base token."""
    c = dirac()
    assert c.prefixes.shape == (300, 2) and c.suffixes.shape == c.comparison_suffixes.shape == (300, 1)
    assert (c.prefixes == c.prefixes[:, :1]).all()
    owned = np.concatenate([c.prefixes[:, 0], c.suffixes[:, 0]])
    assert np.array_equal(np.sort(owned), np.arange(50, 50 + 600)) and c.config.vocab_size == 650


def test_dirac_canaries_share_one_base_token_as_their_comparison():
    c, other = dirac(seed=0), dirac(seed=5)
    assert (c.comparison_suffixes == c.comparison_suffixes[0, 0]).all() and 0 <= c.comparison_suffixes[0, 0] < 50
    assert np.array_equal(c.prefixes, other.prefixes)  # ownership is fixed; only the comparison is drawn


def test_pooled_runs_split_the_canaries_and_dirac_vocabulary_follows_the_largest_run():
    config = LanguageAuditConfig().with_overrides(m=1001, pooled_runs=4)
    assert config.canaries_per_run == (251, 250, 250, 250) and config.audit_size == 1001
    assert config.canaries.new_tokens == 502


class RecordingEveryRun(Recorder):
    """A :class:`Recorder` that keeps every run's request."""

    def train(self, request: SequenceRequest) -> SequenceModel:
        self.requests = [*getattr(self, "requests", []), request]
        return super().train(request)


def test_each_pooled_run_trains_its_own_canaries_over_its_own_vocabulary():
    config = LanguageAuditConfig(device="cpu").with_overrides(m=40, pooled_runs=4, seed=2)
    recorder = RecordingEveryRun()
    result = run_language_audit(recorder, config)
    assert len(recorder.requests) == 4 and result.scores.shape == (40,)
    for request in recorder.requests:
        assert request.vocab_size == 100 + 2 * 10 and request.architecture.init == "dirac"
        assert request.sequences.shape[1] == 2 and len(set(request.sequences[:, 0])) == request.num_records
    assert sum(r.num_records for r in recorder.requests) == (result.membership == 1).sum()


def test_a_pass_of_the_dirac_design_states_the_signal_it_promises():
    """Rule 13: the Dirac token design at full batch has a measured signal floor; the repeated-token
    baseline has none, so its passes are not held to one."""
    from dpverify.audits.verdict import DIRAC_SIGNAL_FLOOR, expected_signal

    assert expected_signal(LanguageAuditConfig()) == DIRAC_SIGNAL_FLOOR
    assert expected_signal(REPEATED_TOKEN_BASELINE) is None
    assert expected_signal(LanguageAuditConfig().with_overrides(sampling_rate=0.5)) is None


def test_a_canary_with_an_untouched_prefix_ranks_below_every_other_and_nothing_else_moves():
    from dpverify.audits.language import _untouched_last

    scores = np.array([0.3, -2.0, 1.5, 0.1])
    own, unseen = np.array([-1.0, -2.0, -3.0, -4.0]), np.array([-1.0, -2.5, -3.0, -4.5])
    ranked = _untouched_last(scores, own, unseen)
    assert ranked[[0, 2]].max() < ranked[[1, 3]].min() and np.array_equal(ranked[[1, 3]], scores[[1, 3]])
    assert np.array_equal(_untouched_last(scores, own, unseen - 1e-12), scores)  # a bit apart: untouched no more
