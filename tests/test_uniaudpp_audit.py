"""UniAud++ and its baselines end to end on digits with real DP libraries (a few seconds each)."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("torch")
pytest.importorskip("opacus")

from dpverify.audits import run_audit  # noqa: E402
from dpverify.stats.bounds import epsilon_lower_bound  # noqa: E402
from dpverify.cli import main  # noqa: E402
from dpverify.config import profile_config  # noqa: E402
from dpverify.registry import get_implementation  # noqa: E402
from tests.doubles import Memoriser  # noqa: E402

M = 300


def multitask_config(**overrides):
    return profile_config("quick", design="multitask", m=M, trigger_dimension=M, device="cpu", **overrides)


def test_non_private_uniaudpp_reaches_the_two_sided_ceiling():
    # At ε = ∞ the tag head memorises every trigger's tag, so every score has the sign of S_i. The
    # two-sided guess rule at r = m guesses m/2 each way while Binomial(m, ½) records are members, so
    # about √m/2 guesses are forced wrong there; the best attainable row is r = m/2 with every guess
    # right (3.37 for m = 300 against ε_O = 4.07). The tolerance allows one wrong guess at r = m/2.
    # lr 20: full-batch DP-SGD averages each record's clipped gradient over n = 1348 records, so 20 steps
    # at lr 5 leave ~7 % of the 300 tags unlearnt (measured: 21 wrong signs; 1 at lr 20).
    result = run_audit(get_implementation("opacus-ghost"), multitask_config(epsilon=float("inf"), learning_rate=20.0))
    half = M // 2
    ceiling = epsilon_lower_bound(
        M, half, half - 1, delta=1e-5, confidence=1 - 0.05 / len(result.config["guess_rule"]["fractions"])
    )
    assert result.verdict == "undecided" and result.relation == "replace_one"
    assert result.epsilon_lower_bound >= ceiling
    assert result.epsilon_lower_bound <= result.optimal_epsilon
    assert 0.9 <= result.test_accuracy <= 1.0  # the main task keeps its utility (chance: 0.1)


def test_missing_noise_is_caught_through_uniaudpp_while_opacus_is_not_refuted():
    # Claimed add/remove ε = 1 is replace-one ε ≈ 2.0 for this run (q = 1, 20 steps). Without noise the
    # tags are memorised: ε_L ≈ 3 (measured 3.0–3.4), caught with a margin of 1. Opacus itself is refuted
    # with probability at most 1 − confidence = 1 % (Theorem 1 at the Bonferroni-corrected level).
    config = multitask_config(epsilon=1.0, confidence=0.99)
    buggy = run_audit(get_implementation("opacus-no-noise"), config)
    correct = run_audit(get_implementation("opacus-ghost"), config)
    assert buggy.verdict == "violation", buggy.summary()
    # Never refuted; with 300 tags a pass could not see a 10× noise deficit (ρ ≈ 0.3), so it is undecided.
    assert correct.verdict in ("pass", "undecided"), correct.summary()
    assert buggy.claimed_epsilon == pytest.approx(correct.claimed_epsilon)


@pytest.mark.parametrize("design", ["in_distribution", "mislabeled"])
def test_baselines_run_on_the_same_data_and_report_test_accuracy(design):
    config = profile_config("quick", design=design, m=200, epsilon=4.0, hidden_width=200, device="cpu")
    result = run_audit(get_implementation("opacus-ghost"), config)
    assert result.verdict in ("pass", "undecided"), result.summary()
    assert result.relation == "add_remove" and result.m == 200
    assert 0.5 < result.test_accuracy <= 1.0  # ten classes: chance is 0.1
    assert result.to_dict()["test_accuracy"] == pytest.approx(result.test_accuracy, abs=1e-6)
    assert "Test accuracy" in result.summary()


def test_an_implementation_without_a_tag_head_is_an_error_never_a_pass():
    result = run_audit(Memoriser(), multitask_config(epsilon=1.0))
    assert result.verdict == "error"
    assert "returned no predict_tag_log_proba" in result.error


def test_reference_dpsgd_trains_the_tag_head():
    # Non-private: the reference's tag head must memorise the triggers' tags as Opacus' does (ε_L ≥ 2 is
    # far above what an untrained tag head gives: its scores are independent of S, so ε_L > 0 has
    # probability at most 5 %).
    result = run_audit(get_implementation("reference-dpsgd"), multitask_config(epsilon=float("inf"), learning_rate=20.0))
    assert result.epsilon_lower_bound >= 2.0, result.summary()


def test_cli_runs_a_data_dependent_design(capsys):
    code = main(["audit", "opacus-ghost", "--design", "mislabeled", "--m", "100", "--epochs", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 0
    assert "test accuracy" in err
