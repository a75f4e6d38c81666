"""One session over several Python environments (``dpverify audit --env``), and what a pytest run says of
the families it cannot audit here.

The other environment is this same interpreter behind a wrapper that adds a directory holding the module
``family_marker``: implementations that require it run only there, as JAX-Privacy's run only in
``.venvs/jax``. The implementations are numpy test doubles, so no JAX is needed and each run takes seconds.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpverify.cli import FORWARDED_OPTIONS, _parser, main
from dpverify.session import AuditSession

REPO = Path(__file__).resolve().parents[1]

REGISTRATIONS = f"""
import os
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import Memoriser, Oblivious

FAMILY = dict(library="numpy", requires=("family_marker",), extra="family")


class Segfaults(Oblivious):
    def train(self, request):
        os._exit(3)  # the whole process dies, as a segfaulting library would


register_implementation(Oblivious(info=ImplementationInfo(name="home-oblivious", library="numpy")))
register_implementation(Oblivious(info=ImplementationInfo(name="family-oblivious", **FAMILY)))
register_implementation(
    Memoriser(info=ImplementationInfo(name="family-memoriser", expected="violation", breaks="no noise", detectability="D1", **FAMILY))
)
register_implementation(Segfaults(info=ImplementationInfo(name="family-segfaults", **FAMILY)))
"""


@pytest.fixture
def setup(tmp_path):
    """(registration file, the family's environment directory)."""
    registrations = tmp_path / "registrations.py"
    registrations.write_text(REGISTRATIONS)
    site = tmp_path / "family-site"
    site.mkdir()
    (site / "family_marker.py").write_text("")
    environment = tmp_path / "family-env"
    (environment / "bin").mkdir(parents=True)
    python = environment / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return registrations, environment


def audit(*args):
    """``dpverify audit ARGS`` in a process of its own (the other environment's runs are processes too)."""
    return subprocess.run(
        [sys.executable, "-m", "dpverify", "audit", "--worlds", "none", "--every-update", "off", "--seed", "7", "--m", "400", *map(str, args)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_one_report_one_table_and_one_level_over_both_environments(setup, tmp_path):
    registrations, environment = setup
    report = tmp_path / "report.json"
    run = audit("home-oblivious", "family-oblivious", "family-memoriser", "--import", registrations, "--env", environment, "--report", report)
    assert run.returncode == 0, run.stderr
    data = json.loads(report.read_text())
    # Two audits of implementations expected private, one here and one there: each at 1 - 0.05/2.
    assert data["planned_audits"] == 2 and data["complete"]
    assert data["per_audit_confidence"] == pytest.approx(0.975)
    by_name = {entry["implementation"]: entry for entry in data["audits"]}
    assert sorted(by_name) == ["family-memoriser", "family-oblivious", "home-oblivious"]
    assert [entry["confidence"] for entry in data["audits"]] == [pytest.approx(0.975)] * 3
    # The same seeds as one process would draw: the session's seed and each audit's key.
    assert {name: entry["seed"] for name, entry in by_name.items()} == {
        name: AuditSession(enabled=True, profile="quick", confidence=0.95, seed=7, device="cpu", epsilon=2.0,
                           implementations=(), report_path=None, plots_dir=None).audit_seed(name)
        for name in by_name
    }  # fmt: skip
    assert by_name["family-memoriser"]["verdict"] == "violation"
    assert [by_name[name].get("environment") for name in sorted(by_name)] == [str(environment)] * 2 + [None]
    table = run.stdout
    assert all(name in table for name in by_name) and "over 2 planned audit(s)" in table
    assert f"2 audit(s) of family-memoriser, family-oblivious run in {environment}" in run.stderr


def test_an_environment_that_dies_leaves_its_owed_audits_as_errors(setup, tmp_path):
    registrations, environment = setup
    report = tmp_path / "report.json"
    run = audit("family-oblivious", "family-segfaults", "--import", registrations, "--env", environment, "--report", report)
    assert run.returncode == 1
    entries = {entry["implementation"]: entry for entry in json.loads(report.read_text())["audits"]}
    assert entries["family-oblivious"]["verdict"] != "error"  # it ran before the other one died: kept
    assert entries["family-segfaults"]["verdict"] == "error" and entries["family-segfaults"]["counted"] is True
    assert f"the run in {environment} ended without this audit (exit status 3" in entries["family-segfaults"]["error"]
    assert "1 audit(s) marked as errors" in run.stderr
    assert "unexpected: family-segfaults error" in run.stdout


def test_an_env_without_python_or_dpverify_is_a_usage_error_naming_the_fix(setup, tmp_path, capsys):
    assert main(["audit", "--all", "--env", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert f"--env {tmp_path / 'nowhere'}: no Python at" in error and "bash scripts/setup.sh" in error
    bare = tmp_path / "bare" / "bin"
    bare.mkdir(parents=True)
    (bare / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')  # no site-packages: no dpverify
    (bare / "python").chmod(0o755)
    assert main(["audit", "--all", "--env", str(bare.parent)]) == 2
    error = capsys.readouterr().err
    assert "No module named dpverify" in error and "bash scripts/setup.sh" in error


def test_plan_says_what_would_run_here_without_training(setup, capsys):
    registrations, _ = setup
    from dpverify.registry import unregister_implementation

    try:
        assert main(["audit", "home-oblivious", "family-oblivious", "--worlds", "none", "--every-update", "off", "--import", str(registrations), "--plan"]) == 0
    finally:
        for name in ("home-oblivious", "family-oblivious", "family-memoriser", "family-segfaults"):
            unregister_implementation(name)
    plan = json.loads(capsys.readouterr().out)
    assert plan["planned_audits"] == 2
    assert [(e["implementation"], e["available"], e["counted"]) for e in plan["audits"]] == [
        ("family-oblivious", False, True), ("home-oblivious", True, True)
    ]  # fmt: skip
    assert "pip install 'dpverify[family]'" in plan["audits"][0]["unavailable_reason"]


def test_planned_audits_cannot_be_fewer_than_the_run_counts(capsys):
    assert main(["audit", "reference-dpsgd", "--worlds", "none", "--every-update", "off", "--planned-audits", "0", "--plan"]) == 2
    assert "--planned-audits must be at least this run's 1 counted audit(s), got 0" in capsys.readouterr().err


def test_every_audit_option_is_forwarded_or_this_runs_own():
    """A new option must be forwarded to the other environments' runs, or said to be this run's own (--jobs:
    each environment is given its share of the run's processes)."""
    own = {"help", "names", "all", "report", "compare", "compare_fail", "envs", "plan", "planned_audits", "jobs"}
    audit = _parser()._subparsers._group_actions[0].choices["audit"]
    assert {action.dest for action in audit._actions} == own | {dest for dest, _ in FORWARDED_OPTIONS}


CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import Oblivious

for name in ("family-test-a", "family-test-b"):  # not the bundled jax-privacy-* names
    register_implementation(
        Oblivious(info=ImplementationInfo(name=name, library="jax-privacy", requires=("no_such_jax_module",), extra="jax-privacy"))
    )
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_pytest_says_which_families_it_did_not_audit_and_where_they_run(pytester, workers):
    if workers:
        pytest.importorskip("xdist")
    pytester.makeconftest(CONFTEST)
    # no Hypothesis tests here: without its plugin no process (xdist's controller and two workers) imports it
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--dp-audit", "--dp-audit-implementations=family-test-*", "-rs", *workers
    )
    result.assert_outcomes(skipped=12)  # each one-run, every-update and four two-world audits: 2 implementations
    hint = "run `.venvs/jax/bin/pytest --dp-audit` (made by `bash scripts/setup.sh`)"
    result.stdout.fnmatch_lines([
        "*dp-audit summary*",
        f"not audited here: jax-privacy (2 implementations) needs no_such_jax_module: {hint}*",
        f"SKIPPED*family-test-a needs no_such_jax_module, which is not installed here: {hint}*",
    ])  # fmt: skip
