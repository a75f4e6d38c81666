"""The pytest face, driven through pytester with numpy-only implementations registered from a conftest."""

import json
import os
from pathlib import Path

import pytest

from dpverify.audits.planning import resolve_device

REPO = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import Broken, GaussianMechanism, Memoriser

register_implementation(
    GaussianMechanism(claimed_epsilon=1.0, info=ImplementationInfo(name="third-party-private", library="numpy"))
)
register_implementation(Memoriser(claimed_epsilon=1.0, info=ImplementationInfo(name="leaky", library="numpy")))
"""

SMALL = "--dp-audit-implementations=third-party-*,leaky"


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    # The ready-made two-world and every-update audits have tests of their own (test_gate.py,
    # test_every_update.py); here only the one-run ones.
    pytester.makeini("[pytest]\ndp_audit_seed = 11\ndp_audit_worlds = none\ndp_audit_every_update = false\n")
    return pytester


def run(pytester, *args, subprocess=False):
    runner = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    return runner("-p", "no:cacheprovider", *args)


def test_help_lists_every_option_with_its_ini_and_env_twin(pytester):
    result = run(pytester, "--help")
    for name in ("profile", "confidence", "seed", "device", "epsilon", "implementations", "report", "plots"):
        result.stdout.fnmatch_lines([f"*--dp-audit-{name}*"])
    text = result.stdout.str()
    assert "ini: dp_audit_confidence, env: DPVERIFY_CONFIDENCE" in " ".join(text.split())
    assert "--dp-audit " in text


def test_the_plugin_offers_every_profile_device_and_world():
    """The plugin spells the choices out (its start-up imports nothing heavy); they must stay the config's.
    World names come from the registry when given."""
    from dpverify.canaries.worlds import world_names
    from dpverify.config import DEVICES, PROFILE_NAMES
    from dpverify.gate import WORLD_CHOICE_WORDS
    from dpverify.pytest.options import DEVICE_CHOICES, PROFILE_CHOICES, WORLD_WORDS, _worlds

    assert PROFILE_CHOICES == PROFILE_NAMES and DEVICE_CHOICES == DEVICES
    assert WORLD_WORDS == WORLD_CHOICE_WORDS
    assert _worlds(",".join(world_names())) == world_names()
    with pytest.raises(ValueError, match="names among dataset_size"):
        _worlds("dataset_size,no_such_world")


def test_without_dp_audit_audits_are_skipped_with_a_reason(project):
    project.makepyfile("def test_mine(dp_audit):\n    dp_audit('leaky')\n")
    result = run(project, "-rs")
    result.assert_outcomes(skipped=1)  # ready-made audits are collected only with --dp-audit
    result.stdout.fnmatch_lines(["*DP audits are off; run pytest with --dp-audit*"])


def test_third_party_implementation_is_audited_and_a_leak_fails_with_an_actionable_message(project, tmp_path):
    report = tmp_path / "report.json"
    result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={report}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            f"*dpverify: DP audits on (profile quick, seed 11, device {resolve_device('auto')}*",
            "*leaky: verdict VIOLATION (inclusion design, add_remove relation, adversary saw: final model)*",
            "*Reproduce with: pytest --dp-audit --dp-audit-seed 11 --dp-audit-profile quick --dp-audit-epsilon 2 "
            '--dp-audit-device auto --dp-audit-confidence-per-audit 0.975 --dp-audit-implementations leaky "dp-audit::dp-audit[[]leaky[]]"*',
            "*dp-audit summary*",
            "*leaky*violation !*",
            "*third-party-private*pass*",
        ]
    )
    data = json.loads(report.read_text())
    assert data["confidence"] == 0.95 and data["seed"] == 11 and data["planned_audits"] == 2
    assert {a["implementation"] for a in data["audits"]} == {"third-party-private", "leaky"}
    required = {
        "implementation", "expected", "design", "relation", "claimed_epsilon", "delta", "epsilon_lower_bound",
        "optimal_epsilon", "m", "guesses", "correct", "device", "seconds", "verdict", "detectability",
    }
    for audit in data["audits"]:
        assert required <= set(audit)
        assert audit["confidence"] == pytest.approx(1 - 0.05 / 2)


def test_precedence_is_cli_over_env_over_ini(project, monkeypatch):
    project.makepyfile("def test_nothing():\n    pass\n")
    no_audits = "--dp-audit-implementations=none"  # the header states the seed; no audit need run for it
    run(project, "--dp-audit", no_audits).stdout.fnmatch_lines(["*seed 11*"])
    monkeypatch.setenv("DPVERIFY_SEED", "12")
    run(project, "--dp-audit", no_audits).stdout.fnmatch_lines(["*seed 12*"])
    run(project, "--dp-audit", no_audits, "--dp-audit-seed=13").stdout.fnmatch_lines(["*seed 13*"])


def test_bad_values_name_their_source(project, monkeypatch):
    project.makepyfile("def test_nothing():\n    pass\n")
    result = run(project, "--dp-audit-confidence=1.5")
    result.stderr.fnmatch_lines(["*command-line option --dp-audit-confidence='1.5' is invalid: confidence must be in (0, 1)*"])
    monkeypatch.setenv("DPVERIFY_PROFILE", "huge")
    result = run(project)
    result.stderr.fnmatch_lines(["*environment variable DPVERIFY_PROFILE='huge' is invalid*quick, standard, gpu, mlp, paper*"])


def test_marker_settings_reach_the_audit_and_are_validated(project):
    project.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.dp_audit(m=300, dimension=300, num_classes=5, epsilon=1.0, design="pair")
        def test_marked(dp_audit):
            result = dp_audit("third-party-private")
            assert (result.m, result.design, result.relation) == (300, "pair", "replace_one")
        """,
        test_bad="""
        import pytest

        @pytest.mark.dp_audit(colour="red")
        def test_bad_marker(dp_audit):
            pass
        """,
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    # A bad marker fails its own test only, at setup, naming the keyword and the known ones.
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_bad_marker: unknown dp_audit marker keyword(s) colour; known: *"])
    # Without --dp-audit nothing is validated: the suite runs as it would without dpverify.
    run(project).assert_outcomes(skipped=2)


def test_more_audits_than_declared_is_an_error(project):
    project.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(m=100, dimension=100, num_classes=5)
        def test_two(dp_audit):
            dp_audit("third-party-private")
            dp_audit("third-party-private")
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ran audit 2, but the session's plan counted 1 audit(s) for it*audits=N*"])


def test_vacuous_and_error_verdicts_are_said_out_loud(project):
    project.makepyfile(
        """
        import pytest
        from dpverify.results import AuditError
        from tests.doubles import Broken, Oblivious

        @pytest.mark.dp_audit(m=50, dimension=50, num_classes=5)
        def test_vacuous(dp_audit):
            dp_audit(Oblivious(claimed_epsilon=6.0))  # beyond what 50 canaries can refute: skips, never a pass

        @pytest.mark.dp_audit(m=50, dimension=50, num_classes=5)
        def test_error(dp_audit):
            with pytest.raises(AuditError, match="test-broken: training raised RuntimeError"):
                dp_audit(Broken(mode="raise"))
        """
    )
    report = project.path / "r.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    audits = json.loads(report.read_text())["audits"]
    assert sorted(a["verdict"] for a in audits) == ["error", "undecided"]
    result.stdout.fnmatch_lines(["*test-broken*error !*", "*test-oblivious*undecided*", "*SKIPPED*test-oblivious: verdict UNDECIDED*--dp-audit-strict*"])
    strict = run(project, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-strict")
    strict.assert_outcomes(passed=1, failed=1)


def test_xdist_gives_the_same_report(project):
    pytest.importorskip("xdist")
    reports = []
    # Without xdist in-process (the audits' code is loaded already); with it, a session of its own, which
    # leaves out the Hypothesis plugin: this project has no Hypothesis tests, and each of the controller and
    # its two workers would import Hypothesis afresh.
    for extra in ([], ["-n", "2", "-p", "no:hypothesispytest"]):
        path = project.path / f"report{len(reports)}.json"
        result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={path}", *extra, subprocess=bool(extra))
        result.assert_outcomes(passed=1, failed=1)
        data = json.loads(path.read_text())
        assert data["planned_audits"] == 2 and data["per_audit_confidence"] == pytest.approx(0.975)
        audits = data["audits"]
        reports.append(sorted((a["implementation"], a["epsilon_lower_bound"], a["verdict"], a["seed"]) for a in audits))
    assert reports[0] == reports[1]
    result.stdout.fnmatch_lines(["*dp-audit summary*"])


def test_dp_implementation_is_parametrized_over_the_registry(project):
    project.makepyfile("def test_each(dp_implementation):\n    assert dp_implementation.info.name\n")
    result = run(project, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_each[[]leaky[]]*", "*test_each[[]third-party-private[]]*"])
    assert os.environ.get("DPVERIFY_SEED") is None


def test_buggy_variants_must_be_caught_by_class(project):
    project.makeconftest(
        CONFTEST
        + """
def variant(name, cls):
    return ImplementationInfo(name=name, library="numpy", expected="violation", breaks="adds no noise", detectability=cls)

register_implementation(Memoriser(info=variant("caught-d1", "D1")))
register_implementation(GaussianMechanism(info=variant("missed-d2", "D2")))
register_implementation(GaussianMechanism(info=variant("missed-d3", "D3")))
"""
    )
    report = project.path / "r.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=caught-*,missed-*", f"--dp-audit-report={report}", "-rxf")
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(["*buggy variant missed-d2 (D2: adds no noise) was not caught*"])
    result.stdout.fnmatch_lines(["*caught-d1*violation  *", "*missed-d2*pass !*", "*missed-d3*pass ~*"])
    data = json.loads(report.read_text())
    assert data["planned_audits"] == 0  # variants take no share of the level
    assert {a["implementation"]: a["detectability"] for a in data["audits"]} == {
        "caught-d1": "D1", "missed-d2": "D2", "missed-d3": "D3",
    }


@pytest.mark.slow
def test_a_marker_selects_the_data_dependent_design_and_the_report_carries_test_accuracy(project, tmp_path):
    """The UniAud++ design through the marker, trained by the real opacus-ghost on a small setting (the
    plumbing, not power)."""
    pytest.importorskip("opacus")
    pytest.importorskip("sklearn")
    project.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(design="multitask", m=60, trigger_dimension=60, hidden_width=32, epochs=3, epsilon=1.0)
        def test_multitask(dp_audit):
            dp_audit("opacus-ghost")
        """
    )
    report = tmp_path / "report.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}")
    # 60 canaries cannot see a 10× noise deficit: the pass is undecided, a skip; never refuted.
    result.assert_outcomes(skipped=1)
    (audit,) = json.loads(report.read_text())["audits"]
    assert audit["design"] == "multitask" and audit["relation"] == "replace_one"
    assert 0.0 < audit["test_accuracy"] <= 1.0 and audit["verdict"] == "undecided" and audit["power"]["blind"]
