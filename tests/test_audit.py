import math
import sys

import numpy as np
import pytest

from dpverify.audits import run_audit
from dpverify.audits.planning import audit_ceiling, canaries_needed
from dpverify.config import AuditConfig, profile_config
from dpverify.results import DPViolation
from tests.doubles import Broken, GaussianMechanism, Memoriser, Oblivious


def small_config(**overrides):
    defaults = dict(m=400, dimension=400, num_classes=10, epochs=1, sampling_rate=0.1, epsilon=1.0, device="cpu", pooled_runs=1)
    return profile_config("quick", **{**defaults, **overrides})


@pytest.mark.parametrize("design", ["inclusion", "pair"])
def test_memoriser_is_caught_and_the_message_is_actionable(design):
    result = run_audit(Memoriser(claimed_epsilon=1.0), small_config(design=design))
    assert result.verdict == "violation"
    assert result.relation == {"inclusion": "add_remove", "pair": "replace_one"}[design]
    assert result.epsilon_lower_bound > result.claimed_epsilon
    assert result.epsilon_lower_bound <= result.optimal_epsilon + 1e-9
    message = str(DPViolation(result, reproduce="pytest --dp-audit --dp-audit-seed 0"))
    for needle in ("VIOLATION", "ε_L", "Claimed ε", "guesses", "m = 400", "--dp-audit-seed 0", "clips"):
        assert needle in message


def test_inclusion_trains_only_on_members_and_never_sees_the_bits():
    memoriser = Memoriser()
    result = run_audit(memoriser, small_config())
    (request,) = memoriser.requests
    assert request.num_records == int(np.sum(result.membership == 1))
    assert not any("member" in name for name in vars(request))


def test_pair_design_trains_on_every_canary_and_converts_the_claim_to_replace_one():
    memoriser = Memoriser(claimed_epsilon=1.0)
    result = run_audit(memoriser, small_config(design="pair", epsilon=1.0))
    assert memoriser.requests[0].num_records == 400
    assert result.library_epsilon == 1.0
    assert result.claimed_epsilon >= 1.0 and "replace_one" in result.claim_derivation


def test_same_seed_repeats_the_audit():
    a, b = (run_audit(Memoriser(), small_config(seed=5)) for _ in range(2))
    assert (a.epsilon_lower_bound, a.correct, a.guesses) == (b.epsilon_lower_bound, b.correct, b.guesses)
    np.testing.assert_array_equal(a.scores, b.scores)


def test_claim_out_of_both_tests_reach_is_undecided():
    # Full batch: the claimed curve is exact GDP; at ε = 6 not even 100 correct guesses of 100 refute it.
    config = small_config(m=100, sampling_rate=1.0)
    result = run_audit(Memoriser(claimed_epsilon=6.0), config)
    assert result.verdict == "undecided" and not result.curve_refuted
    assert result.claimed_epsilon >= result.optimal_epsilon
    assert "cannot refute" in result.summary()


def test_a_claim_the_curve_test_can_reach_is_decided_even_above_the_ceiling():
    config = small_config(m=150, sampling_rate=1.0)  # at m = 100 even perfect guesses reach only curve p 0.006
    assert 4.0 > audit_ceiling(config)
    leak = GaussianMechanism(claimed_epsilon=4.0, signal=20.0)  # a softmax regression far past its claim
    assert run_audit(leak, config).verdict != "undecided"


def test_canaries_needed_is_the_m_whose_ceiling_passes_the_claim():
    config = small_config(m=100)
    ceiling = audit_ceiling(config)
    needed = canaries_needed(config, ceiling + 0.5)
    assert needed is not None and needed > 100
    assert audit_ceiling(config, needed) > ceiling + 0.5 >= audit_ceiling(config, int(needed * 0.9))
    assert canaries_needed(config, math.inf) is None


@pytest.mark.parametrize(
    "mode, cause",
    [
        ("raise", "training raised RuntimeError: optimizer exploded"),
        ("return", "must return a dpverify.contract.TrainedModel"),
        ("nan", "NaN or infinite values in 400 of 400 rows"),
        ("shape", r"shape \(400, 11\), expected \(400, 10\)"),
    ],
)
def test_a_broken_implementation_ends_as_error_never_a_pass(mode, cause):
    result = run_audit(Broken(mode=mode), small_config())
    assert result.verdict == "error"
    assert result.error.startswith("test-broken: ")
    assert __import__("re").search(cause, result.error)


def test_null_implementation_passes_at_the_stated_rate():
    """An implementation that ignores its data is private whatever it claims (here ε = 0.05).

    Each audit is at 95 % confidence, so at most 5 % of them may refute the claim. With 40 audits, 7 or
    more violations has probability < 1e-3 under a 5 % rate (binomial tail), the error rate of this test.
    """
    violations = sum(
        run_audit(Oblivious(claimed_epsilon=0.05), small_config(seed=seed, m=200)).verdict == "violation"
        for seed in range(40)
    )
    assert violations <= 6


def fresh_python(code):
    """What ``code`` prints in a new interpreter, where no test has imported anything yet."""
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_engine_imports_no_deep_learning_framework():
    code = "import dpverify.audits.verdict, dpverify.stats.bounds, dpverify.stats.accounting, dpverify.pytest.plugin, dpverify.audits.language, " \
           "dpverify.audits.data_dependent, dpverify.canaries.tagged, sys; " \
           "print(sorted(m for m in ('torch', 'tensorflow', 'opacus', 'jax') if m in sys.modules))"
    assert fresh_python(code) == "[]"


def test_config_overrides_are_routed_and_unknown_ones_rejected():
    config = profile_config("quick", m=123, hidden_width=7, epochs=3, design="pair", guesses=10, epsilon=float("inf"))
    assert (config.canaries.m, config.architecture.hidden_width, config.hyperparameters.epochs) == (123, 7, 3)
    assert config.hyperparameters.noise_multiplier == 0.0 and config.hyperparameters.target_epsilon is None
    assert config.guess_rule.count == 10 and config.relation == "replace_one"
    with pytest.raises(ValueError, match="unknown audit setting.*colour"):
        profile_config("quick", colour="red")
    with pytest.raises(ValueError, match="profile must be one of"):
        profile_config("huge")
    with pytest.raises(ValueError, match=r"sampling_rate must be in \(0, 1\], got 1.5"):
        profile_config("quick", sampling_rate=1.5)
    with pytest.raises(ValueError, match="design must be one of"):
        AuditConfig(design="triple")


def test_a_designated_normaliser_is_a_setting_checked_at_the_door():
    config = profile_config("quick", expected_batch_size=50)
    assert config.hyperparameters.expected_batch_size == 50 and config.hyperparameters.normaliser(1000) == 50
    assert profile_config("quick").hyperparameters.normaliser(1000) == 1000  # q·N, q = 1
    with pytest.raises(ValueError, match=r"expected_batch_size must be in \(0, inf\], got -1"):
        profile_config("quick", expected_batch_size=-1)


def test_package_exports_load_lazily():
    code = (
        "import sys, dpverify; light = 'numpy' not in sys.modules; "
        "from dpverify import run_audit, DPViolation, register_implementation; print(light, callable(run_audit))"
    )
    assert fresh_python(code) == "True True"


def test_the_black_boxs_answering_time_is_not_the_auditors():
    """A black box that takes 0.5 s to answer: those seconds count in the audit, none in the auditor's share.
    An accounting identity (the auditor's time is measured inside the total), not a speed claim."""
    import dataclasses
    import time

    class Slow(Oblivious):
        def train(self, request):
            trained = super().train(request)

            def slow_predict(features):
                time.sleep(0.5)
                return trained.predict_log_proba(features)

            return dataclasses.replace(trained, predict_log_proba=slow_predict)

    result = run_audit(Slow(), profile_config("quick", m=200, dimension=200, device="cpu"))
    assert result.auditor_seconds <= result.seconds - 0.5
