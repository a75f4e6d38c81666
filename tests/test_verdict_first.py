"""The verdict first (design rule 15): power, the claim check, the verdict's text, plots and the report are
computed after the verdict, and a failure in any of them is reported beside it, in run_audit, under pytest
and from the command line; one audit's own crash never ends a session. Each auxiliary step is made to fail
(monkeypatched to raise), and the verdict must come through."""

import dataclasses
import json
import sys
import textwrap

import pytest

import dpverify.audits
import dpverify.audits.verdict
import dpverify.audits.two_world
import dpverify.plots  # noqa: F401  (patched below: imported here so the runs inside see the patch)
from dpverify.audits import run_audit
from dpverify.cli import main
from dpverify.config import profile_config, two_world_config
from dpverify.contract import PrivacyClaim
from dpverify.results import AuditResult, DPViolation
from tests.doubles import GaussianMechanism, Memoriser
from tests.test_plugin import SMALL, project, run  # noqa: F401  (project is a fixture)

CONFIG = profile_config("quick", m=200, dimension=200, num_classes=5, epsilon=1.0, seed=3)


def _raise(*args, **kwargs):
    raise RuntimeError("injected failure")


class ClaimsAnOverflowingRun(GaussianMechanism):
    """Claims ε = 1 for σ 0.3, q 0.1, 100 steps (whose own optimistic ε is about 106): the issue's claim
    whose k* search overflowed math.expm1 and lost the violation its own numbers give."""

    def train(self, request):
        trained = super().train(request)
        claim = PrivacyClaim(epsilon=1.0, delta=1e-5, accountant="test", noise_multiplier=0.3, sampling_rate=0.1, steps=100)
        return dataclasses.replace(trained, claim=claim)


def test_a_claim_whose_power_cannot_be_computed_keeps_its_violation():
    result = run_audit(ClaimsAnOverflowingRun(), CONFIG)
    assert result.verdict == "violation" and not result.claim_consistent


@pytest.mark.parametrize(
    "module, name, what",
    [(dpverify.audits.verdict, "measure_power", "power"), (dpverify.audits.verdict, "claim_inconsistency", "claim check")],
)
def test_a_one_run_audit_keeps_its_violation_when_an_auxiliary_step_fails(monkeypatch, module, name, what):
    monkeypatch.setattr(module, name, _raise)
    result = run_audit(Memoriser(), CONFIG)
    assert result.verdict == "violation"
    assert result.auxiliary_failures == ((what, "RuntimeError: injected failure"),)
    assert "Failed beside the verdict, which stands: " in result.summary()
    assert result.to_dict()["auxiliary_failures"] == [{"what": what, "error": "RuntimeError: injected failure"}]


def test_a_pass_whose_power_fails_is_undecided_never_green(monkeypatch):
    monkeypatch.setattr(dpverify.audits.verdict, "measure_power", _raise)
    # The claimed mechanism itself: refuted on at most 5 % of seeds (the audit's level), so this one seed
    # passes its tests with probability >= 0.95; here it does, on every run (the seed decides everything).
    result = run_audit(GaussianMechanism(claimed_epsilon=1.0), CONFIG)
    assert result.verdict == "undecided" and result.power is None and result.power_failed
    assert "Its power could not be measured" in result.summary()


def test_a_two_world_audit_keeps_its_violation_when_power_fails(monkeypatch):
    monkeypatch.setattr(dpverify.audits.two_world, "measure_power", _raise)
    # 30 runs a world: one look (the first two would count under MIN_LOOK_RUNS), so the power is measured.
    config = two_world_config("quick", "worst_case_record", runs=30).with_overrides(seed=1)
    result = run_audit(Memoriser(), config)
    assert result.verdict == "violation" and result.auxiliary_failures[0][0] == "power"


@pytest.mark.parametrize("part", ["power_sentence", "to_dict"])
def test_the_verdicts_text_failing_leaves_the_verdict_in_a_bare_sentence(monkeypatch, part):
    result = run_audit(Memoriser(), CONFIG)
    monkeypatch.setattr(AuditResult, part, _raise)
    for text in (result.summary(), str(DPViolation(result))):
        assert "verdict VIOLATION" in text and "could not be written: RuntimeError: injected failure" in text
    assert "violation" in result.headline().lower()


PRIVATE_AND_LEAKY = textwrap.dedent(
    """
    from dpverify.contract import ImplementationInfo
    from dpverify.registry import register_implementation
    from tests.doubles import GaussianMechanism, Memoriser

    register_implementation(GaussianMechanism(claimed_epsilon=1.0, info=ImplementationInfo(name="cli-private", library="numpy")))
    register_implementation(Memoriser(claimed_epsilon=1.0, info=ImplementationInfo(name="cli-leaky", library="numpy")))
    """
)


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """The two implementations above, registered by ``--import`` of a module (removed afterwards)."""
    from dpverify.registry import unregister_implementation

    (tmp_path / "verdict_first_module.py").write_text(PRIVATE_AND_LEAKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield ["--import", "verdict_first_module", "--worlds", "none", "--every-update", "off", "--layers", "none", "--m", "200", "--set", "dimension=200", "--set", "num_classes=5"]
    for name in ("cli-private", "cli-leaky"):
        unregister_implementation(name)
    sys.modules.pop("verdict_first_module", None)


def _cli(args, report, capsys):
    code = main(["audit", "cli-private", "cli-leaky", *args, "--epsilon", "1", "--report", str(report)])
    return code, capsys.readouterr(), {a["implementation"]: a for a in json.loads(report.read_text())["audits"]}


def test_the_command_line_keeps_each_verdict_when_plots_and_report_entries_fail(registered, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dpverify.plots, "save_audit_plots", _raise)
    monkeypatch.setattr(AuditResult, "to_dict", _raise)
    code, out, audits = _cli([*registered, "--plots", str(tmp_path / "plots")], tmp_path / "r.json", capsys)
    assert code == 1, out.err  # both are declared private: the leaky one's violation is unexpected
    assert audits["cli-private"]["verdict"] == "pass" and audits["cli-leaky"]["verdict"] == "violation"
    for audit in audits.values():
        assert {f["what"] for f in audit["auxiliary_failures"]} == {"plots", "report entry"}
    assert "failed beside the verdict: plots: RuntimeError: injected failure" in out.out


def test_one_audits_crash_does_not_end_the_command_lines_session(registered, tmp_path, monkeypatch, capsys):
    real = dpverify.audits.run_audit

    def crashes_on_the_private_one(implementation, config, **kwargs):
        if implementation.info.name == "cli-private":
            raise OverflowError("math range error")
        return real(implementation, config, **kwargs)

    monkeypatch.setattr(dpverify.audits, "run_audit", crashes_on_the_private_one)
    code, out, audits = _cli(registered, tmp_path / "r.json", capsys)
    assert code == 1  # an error is never a pass
    assert audits["cli-private"]["verdict"] == "error" and "the audit itself failed (OverflowError" in audits["cli-private"]["error"]
    assert audits["cli-leaky"]["verdict"] == "violation"


def test_under_pytest_every_verdict_survives_failing_power_plots_and_report_entries(project, tmp_path, monkeypatch):
    monkeypatch.setattr(dpverify.audits.verdict, "measure_power", _raise)
    monkeypatch.setattr(dpverify.plots, "save_audit_plots", _raise)
    monkeypatch.setattr(AuditResult, "to_dict", _raise)
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={report}", f"--dp-audit-plots={tmp_path / 'plots'}", "-rs")
    # The private one cannot state its power, so it is undecided (a skip); the leaky one still fails as a
    # violation. (The private one's tests refute it on at most 2.5 % of seeds; the session seed is fixed.)
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*leaky: verdict VIOLATION*"])
    audits = {a["implementation"]: a for a in json.loads(report.read_text())["audits"]}
    assert audits["leaky"]["verdict"] == "violation" and audits["third-party-private"]["verdict"] == "undecided"
    assert {f["what"] for f in audits["leaky"]["auxiliary_failures"]} == {"power", "plots", "report entry"}


def test_under_pytest_an_audits_own_crash_is_an_error_with_its_report_entry(project, tmp_path, monkeypatch):
    monkeypatch.setattr(dpverify.audits.verdict, "decide_verdict", _raise)
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={report}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*the audit itself failed (RuntimeError: injected failure)*"])
    assert [a["verdict"] for a in json.loads(report.read_text())["audits"]] == ["error", "error"]


def test_a_report_entry_keeps_its_verdict_when_the_librarys_version_cannot_be_read(monkeypatch):
    from dpverify.session import audit_entry

    implementation = Memoriser()
    monkeypatch.setattr(type(implementation), "library_version", _raise)
    entry = audit_entry(run_audit(implementation, CONFIG), implementation, counted=False)
    assert entry["verdict"] == "violation" and entry["library_version"] is None
    assert entry["auxiliary_failures"] == [{"what": "report entry", "error": "RuntimeError: injected failure"}]
