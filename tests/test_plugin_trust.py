"""Every path a user can take keeps the session's level and says what happened (pytester, numpy doubles)."""

import json
import signal
import sys

import pytest

from tests.test_plugin import CONFTEST, SMALL, project, run  # noqa: F401  (project is a fixture)

MARK = "@pytest.mark.dp_audit(m=100, dimension=100, num_classes=5)"


def test_an_audit_through_getfixturevalue_is_not_run_at_a_level_nobody_planned(project):
    project.makepyfile(
        f"""
        import pytest

        {MARK}
        def test_counted(dp_audit):
            dp_audit("third-party-private")

        def test_sneaky(request):
            request.getfixturevalue("dp_audit")("third-party-private")
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_sneaky ran audit 1, but the session's plan did not count it*"])


def test_a_caught_violation_does_not_lift_the_budget(project):
    project.makepyfile(
        f"""
        import pytest
        from dpverify.results import DPViolation

        {MARK}
        def test_catches(dp_audit):
            with pytest.raises(DPViolation):
                dp_audit("leaky")
            dp_audit("third-party-private")
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ran audit 2, but the session's plan counted 1 audit(s) for it*"])


def test_the_plan_counts_only_what_runs_after_deselection(project, tmp_path):
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", SMALL, "-k", "third", f"--dp-audit-report={report}")
    result.assert_outcomes(passed=1, deselected=1)
    data = json.loads(report.read_text())
    assert data["planned_audits"] == 1 and data["per_audit_confidence"] == pytest.approx(0.95)


def test_the_ready_made_audits_are_collected_marked_and_counted_like_tests(project, tmp_path):
    project.makepyfile("def test_plain():\n    pass\n")
    collected = run(project, "--dp-audit", SMALL, "--collect-only", "-q")
    collected.stdout.fnmatch_lines(["dp-audit::dp-audit[[]leaky[]]", "*3 tests collected*"])
    marked = run(project, "--dp-audit", SMALL, "-m", "dp_audit", f"--junitxml={tmp_path / 'j.xml'}")
    marked.assert_outcomes(passed=1, failed=1, deselected=1)
    xml = (tmp_path / "j.xml").read_text()
    assert 'classname="dp-audit" name="dp-audit[leaky]"' in xml
    assert '<property name="dp_audit_verdict" value="violation"' in xml


def test_an_unknown_implementation_name_is_a_usage_error_listing_the_names(project):
    result = run(project, "--dp-audit", "--dp-audit-implementations=leaky,thrid-party-*")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*thrid-party-* matches no registered implementation; registered: *leaky*"])


def test_dp_implementation_follows_the_selection_and_each_expectation(project):
    project.makeconftest(
        CONFTEST
        + """
register_implementation(Memoriser(info=ImplementationInfo(
    name="caught-d1", library="numpy", expected="violation", breaks="adds no noise", detectability="D1")))
"""
    )
    project.makepyfile(
        """
        def test_every_registered(dp_implementation, dp_audit):
            dp_audit(dp_implementation)
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=third-party-*,caught-*", "-v")
    # The private one passes; the buggy variant's violation is its expected outcome, not a failure (two
    # ready-made audits and two parametrized tests).
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_every_registered[[]caught-d1[]] PASSED*"])
    assert "leaky" not in result.stdout.str()


def test_the_claims_delta_is_the_delta_tested(project):
    project.makepyfile(
        f"""
        import dataclasses
        import pytest
        from tests.doubles import GaussianMechanism

        class AtLooseDelta(GaussianMechanism):
            def train(self, request):
                trained = super().train(request)
                return dataclasses.replace(trained, claim=dataclasses.replace(trained.claim, delta=1e-3))

        {MARK}
        def test_delta(dp_audit):
            result = dp_audit(AtLooseDelta(claimed_epsilon=1.0))
            assert result.delta == 1e-3
        """
    )
    run(project, "--dp-audit", "--dp-audit-implementations=none").assert_outcomes(passed=1)


def test_a_hypothesis_test_with_a_failing_trainer_fails_cleanly_and_keeps_its_budget(project):
    project.makepyfile(
        """
        from hypothesis import given, settings, strategies as st
        from dpverify.strategies import audit_settings
        from tests.doubles import Broken

        @settings(audit_settings, max_examples=3, database=None)
        @given(m=st.integers(40, 60))  # enough canaries to decide, so each example trains
        def test_drawn(dp_audit, m):
            dp_audit(Broken(mode="raise"), m=m, dimension=m, num_classes=5)
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "AuditError" in text and "optimizer exploded" in text
    assert "Flaky" not in text and "AuditBudgetExceeded" not in text


def test_a_hypothesis_example_is_seeded_from_itself(project, tmp_path):
    project.makepyfile(
        """
        from hypothesis import given, settings, strategies as st
        from dpverify.strategies import audit_settings

        @settings(audit_settings, max_examples=4, database=None, derandomize=True)
        @given(m=st.sampled_from([300, 400]))
        def test_drawn(dp_audit, m):
            dp_audit("third-party-private", m=m, dimension=m, num_classes=5)
        """
    )
    report = tmp_path / "r.json"
    run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}").assert_outcomes(passed=1)
    seeds = {}
    for audit in json.loads(report.read_text())["audits"]:
        seeds.setdefault(audit["m"], set()).add(audit["seed"])
    assert all(len(s) == 1 for s in seeds.values()) and len({next(iter(s)) for s in seeds.values()}) == len(seeds)


def test_the_reproduce_command_reruns_the_audit_at_its_own_level(project, tmp_path):
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={first}")
    command = next(line for line in result.stdout.lines if line.startswith("Reproduce with: "))
    args = [a.strip('"') for a in command.split()[3:]]
    again_result = run(project, *args, f"--dp-audit-report={again}")
    again_result.assert_outcomes(failed=1)
    (rerun,) = json.loads(again.read_text())["audits"]
    original = next(a for a in json.loads(first.read_text())["audits"] if a["implementation"] == "leaky")
    for key in ("seed", "confidence", "epsilon_lower_bound", "claimed_epsilon", "verdict"):
        assert rerun[key] == original[key], key


def test_dp_audit_set_changes_every_audit_and_a_marker_wins(project, tmp_path):
    project.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(m=60, dimension=60, num_classes=5)
        def test_set(dp_audit):
            assert dp_audit("third-party-private").config["hyperparameters"]["max_grad_norm"] == 0.25

        @pytest.mark.dp_audit(m=60, dimension=60, num_classes=5, max_grad_norm=4.0)
        def test_marker_wins(dp_audit):
            assert dp_audit("third-party-private").config["hyperparameters"]["max_grad_norm"] == 4.0
        """
    )
    run(project, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-set", "max_grad_norm=0.25").assert_outcomes(passed=2)
    bad = run(project, "--dp-audit", "--dp-audit-set", "colour=red")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--dp-audit-set: unknown audit setting(s) colour*"])


def test_an_implementation_whose_library_is_missing_is_skipped_from_the_fixture_too(project):
    project.makepyfile(
        f"""
        import pytest
        from dpverify.contract import ImplementationInfo
        from tests.doubles import Oblivious

        {MARK}
        def test_missing(dp_audit):
            dp_audit(Oblivious(info=ImplementationInfo(name="needs-lib", library="x", requires=("no_such_module",), extra="x")))
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs-lib needs no_such_module*pip install 'dpverify[[]x[]]'*"])


def test_a_training_run_past_its_time_limit_ends_as_an_error_naming_the_limit(project):
    project.makepyfile(
        """
        import time
        import pytest
        from dpverify.results import AuditError
        from tests.doubles import Oblivious

        class Hangs(Oblivious):
            def train(self, request):
                time.sleep(30)

        @pytest.mark.dp_audit(m=40, dimension=40, num_classes=5, timeout=0.5)
        def test_hangs(dp_audit):
            with pytest.raises(AuditError, match="time limit of 0.5 s"):
                dp_audit(Hangs())
        """
    )
    run(project, "--dp-audit", "--dp-audit-implementations=none").assert_outcomes(passed=1)


def test_bad_paths_and_devices_fail_at_once(project, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(project, "--dp-audit", f"--dp-audit-plots={blocker / 'plots'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dp-audit-plots=*: cannot write *plots: Not a directory; give a writable path"])
    result = run(project, "--dp-audit", f"--dp-audit-report={tmp_path}")
    result.stderr.fnmatch_lines(["*--dp-audit-report=*: cannot write *: Is a directory; give a writable path"])
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        result = run(project, "--dp-audit", "--dp-audit-device=cuda")
        result.stderr.fnmatch_lines(["*--dp-audit-device: device 'cuda' was asked for, but torch sees no CUDA GPU*"])


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM semantics")
def test_the_report_keeps_the_audits_that_ran_when_the_session_is_killed(project, tmp_path):
    project.makepyfile(
        f"""
        import os
        import signal
        import pytest

        {MARK}
        def test_1_audit(dp_audit):
            dp_audit("third-party-private")

        def test_2_killed():
            os.kill(os.getpid(), signal.{signal.SIGTERM.name})
        """
    )
    report = tmp_path / "r.json"
    run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}", subprocess=True)
    (audit,) = json.loads(report.read_text())["audits"]
    assert audit["implementation"] == "third-party-private" and audit["nodeid"].endswith("test_1_audit")


def test_a_markers_noise_multiplier_is_audited_as_given_and_a_call_keyword_wins_over_it(project):
    """Issue 20: the session's target ε used to replace a marker's noise_multiplier silently."""
    project.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(noise_multiplier=3.0)
        def test_sigma(dp_audit):
            hp = dp_audit.config().hyperparameters
            assert (hp.noise_multiplier, hp.target_epsilon) == (3.0, None)
            hp = dp_audit.config(epsilon=1.0).hyperparameters
            assert (hp.noise_multiplier, hp.target_epsilon) == (None, 1.0)

        @pytest.mark.dp_audit(noise_multiplier=3.0, epsilon=1.0)
        def test_both(dp_audit):
            pass
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-set=epsilon=4.0")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*give one privacy target, epsilon or noise_multiplier, not both*"])


BLIND_THEN_LEAKING = """
from hypothesis import Phase, example, given, settings, strategies as st
from dpverify.strategies import audit_settings
from tests.doubles import GaussianMechanism, Oblivious

@settings(audit_settings, max_examples=4, database=None, phases=[Phase.explicit])
@example(kind={first!r}, m={first_m})
@example(kind={second!r}, m=500)
@example(kind={third!r}, m=510)
@example(kind={third!r}, m=520)
@given(kind=st.just("blind"), m=st.just(500))
def test_drawn(dp_audit, kind, m):
    # Blind: a trainer that ignores its canaries (and the designated model). Leaking: the claimed
    # mechanism with 3x its signal, refuted at m = 500 in 6 of 6 seeds tried; three leaking examples
    # all missing it would take three misses in a row.
    implementation = Oblivious(claimed_epsilon=2.0) if kind == "blind" else GaussianMechanism(claimed_epsilon=2.0, signal=3.0)
    dp_audit(implementation, m=m, dimension=m, num_classes=5, epsilon=2.0)
"""


def test_a_blind_hypothesis_example_is_noted_and_the_next_ones_still_find_the_violation(project, tmp_path):
    project.makepyfile(BLIND_THEN_LEAKING.format(first="blind", first_m=500, second="leaking", third="leaking"))
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict VIOLATION*", "*test-gaussian-mechanism * violation ! * private * no *"])
    result.stdout.fnmatch_lines(["*UndecidedExample: *test_drawn: an undecided example: test-oblivious*"])
    audits = json.loads(report.read_text())["audits"]
    assert [(a["verdict"], a["counted"]) for a in audits[:2]] == [("undecided", True), ("violation", True)]
    assert all(a["verdict"] == "violation" and a["counted"] is False for a in audits[2:])  # after the failure


def test_a_hypothesis_example_refused_before_training_is_noted_and_the_test_goes_on(project):
    project.makepyfile(BLIND_THEN_LEAKING.format(first="leaking", first_m=20, second="leaking", third="leaking"))
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*verdict VIOLATION*"])
    result.stdout.fnmatch_lines(["*UndecidedExample: *test_drawn: an undecided example: test-gaussian-mechanism: not run: m = 20*"])


def test_a_hypothesis_test_is_undecided_only_when_every_example_was(project):
    project.makepyfile(BLIND_THEN_LEAKING.format(first="blind", first_m=500, second="blind", third="blind"))
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*every one of the 4 example(s) was undecided*"])
    strict = run(project, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-strict")
    strict.assert_outcomes(failed=1)


def test_the_table_and_report_say_which_audits_the_level_counts(project, tmp_path):
    """Counted: the audits of implementations expected private. Not: a buggy variant's, a known issue's."""
    project.makeconftest(
        CONFTEST
        + """
register_implementation(Memoriser(info=ImplementationInfo(
    name="known-leak", library="numpy", expected="known-issue", issue="https://example.org/issue/1")))
register_implementation(Memoriser(info=ImplementationInfo(
    name="caught-d1", library="numpy", expected="violation", breaks="adds no noise", detectability="D1")))
"""
    )
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=third-party-*,known-*,caught-*", f"--dp-audit-report={report}")
    result.assert_outcomes(passed=3)
    data = json.loads(report.read_text())
    assert {a["implementation"]: a["counted"] for a in data["audits"]} == {"third-party-private": True, "known-leak": False, "caught-d1": False}
    assert data["planned_audits"] == 1
    result.stdout.fnmatch_lines(["*counted*", "*caught-d1 * violation * no *", "*known-leak * violation K * no *", "*third-party-private * pass * yes *"])
