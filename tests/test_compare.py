"""Release-to-release comparison (dpverify.compare): the rise test's level and power, matching audits with a
baseline, the baseline's checks at the door, and the option end to end under pytest and the CLI."""

import json
import math
from pathlib import Path

import hypothesis  # noqa: F401  (imported once here: each pytester run would import it again, 2-3 s)
import numpy as np
import pytest
from dpverify import __version__
from dpverify.compare import BaselineError, compare_reports, load_baseline, rise_p_value

REPO = Path(__file__).resolve().parents[1]
DRAWS = 4000


@pytest.mark.parametrize("guesses, rate", [(50, 0.5), (400, 0.7), (100, 0.95)])
def test_the_rise_test_keeps_its_level_when_nothing_changed(guesses, rate):
    # Null simulation: both runs guess at the same rate; the test may flag at most α of them (Fisher's test is
    # exact given the total, and discreteness only makes it more cautious). Tolerance: 4 standard errors.
    rng = np.random.default_rng(20)
    baseline, now = rng.binomial(guesses, rate, size=(2, DRAWS))
    p_values = rise_p_value(guesses=guesses, baseline_correct=baseline, correct=now)
    for level in (0.05, 0.01):
        assert np.mean(p_values <= level) <= level + 4 * math.sqrt(level * (1 - level) / DRAWS)


def test_the_rise_test_keeps_its_level_when_the_rate_fell():
    rng = np.random.default_rng(21)
    baseline, now = rng.binomial(200, 0.7, size=DRAWS), rng.binomial(200, 0.6, size=DRAWS)
    assert np.mean(rise_p_value(guesses=200, baseline_correct=baseline, correct=now) <= 0.05) <= 0.01


def test_the_rise_test_catches_a_clear_rise_at_a_bonferroni_level():
    # 300 guesses at 55 % right in the baseline and 75 % now, tested at 0.05 over 20 audits: about 0.998 power.
    rng = np.random.default_rng(22)
    baseline, now = rng.binomial(300, 0.55, size=DRAWS), rng.binomial(300, 0.75, size=DRAWS)
    assert np.mean(rise_p_value(guesses=300, baseline_correct=baseline, correct=now) <= 0.05 / 20) >= 0.95


def entry(correct, *, implementation="impl", nodeid="t.py::test", guesses=100, verdict="pass", seed=1, m=200, confidence=0.99):
    """A report entry as dpverify.session.audit_entry writes it, with what the comparison reads."""
    return {
        "implementation": implementation,
        "nodeid": nodeid,
        "design": "inclusion",
        "verdict": verdict,
        "config": {"canaries": {"m": m}, "seed": seed, "confidence": confidence, "device": "auto", "timeout": None},
        "guesses": guesses,
        "correct": correct,
        "bound_by_guesses": [[guesses // 2, correct // 2, 0.1], [guesses, correct, 0.4]],
        "epsilon_lower_bound": 0.4,
        "curve_epsilon_lower_bound": 0.6,
        "curve_p_value": 0.3,
        "seed": seed,
        "infinite": [],
    }


def report(*audits, version=__version__):
    return {"dpverify_version": version, "started_at": "2026-11-26T07:00:00Z", "audits": list(audits), "path": "base.json"}


def test_audits_match_by_implementation_test_and_configuration_and_a_clear_rise_is_flagged():
    baseline = report(entry(55, implementation="a"), entry(60, implementation="b"), entry(50, implementation="gone"))
    now = [
        entry(85, implementation="a", seed=7, confidence=0.995),  # another seed and level: still a match
        entry(62, implementation="b", seed=7),
        entry(50, implementation="b", m=400),  # another configuration: no match
        entry(50, implementation="new"),
    ]
    comparison = compare_reports(baseline, now, confidence=0.95)
    by_name = {c.implementation: c for c in comparison.compared}
    assert set(by_name) == {"a", "b"} and [c.implementation for c in comparison.risen] == ["a"]
    assert by_name["a"].level == pytest.approx(0.025) and by_name["a"].p_value < 1e-4
    assert (by_name["b"].guesses, by_name["b"].baseline_correct, by_name["b"].correct) == (100, 60, 62)
    assert comparison.unmatched == ("b t.py::test", "new t.py::test") and comparison.not_rerun == ("gone t.py::test",)
    text = "\n".join(comparison.lines())
    assert "ROSE significantly (p = " in text and "55 → 85 of 100" in text and "0.300 → 0.300" not in text
    assert "no baseline match: new t.py::test" in text and "in the baseline, not run now: gone t.py::test" in text
    assert json.loads(json.dumps(comparison.to_dict()))["risen"] == 1


def test_errors_and_other_guess_counts_are_matched_but_not_compared():
    baseline = report(entry(55, implementation="a"), entry(55, implementation="b"), entry(55, implementation="c"))
    now = [entry(99, implementation="a", verdict="error"), entry(99, implementation="b", guesses=80), entry(50, implementation="c")]
    comparison = compare_reports(baseline, now, confidence=0.95)
    notes = {c.implementation: c.note for c in comparison.compared}
    assert notes["a"] == "an audit ended in error" and "made no 100 guesses" in notes["b"] and notes["c"] == ""
    assert not comparison.risen and comparison.compared[2].level == pytest.approx(0.05)  # one comparable audit


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a dpverify report"),
        (json.dumps({"dpverify_version": "9.0.0", "audits": []}), "written by dpverify 9.0.0, incompatible"),
        (json.dumps({"dpverify_version": __version__, "audits": [{"implementation": "x"}]}), "audit 0 lacks design"),
    ],
)
def test_a_baseline_that_cannot_be_compared_is_refused_naming_its_path(tmp_path, content, message):
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=message) as caught:
        load_baseline(path)
    assert str(path) in str(caught.value)


CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import GaussianMechanism

for name in ("steady", "drifted"):
    register_implementation(GaussianMechanism(claimed_epsilon=1.0, info=ImplementationInfo(name=name, library="numpy")))
"""


def lowered(path: Path, implementation: str) -> Path:
    """The report at ``path`` with ``implementation``'s correct guesses cut to a fifth: as if it had leaked
    less in the baseline, so this run's ordinary count is a significant rise."""
    data = json.loads(path.read_text())
    for audit in data["audits"]:
        if audit["implementation"] == implementation:
            audit["correct"] //= 5
            audit["bound_by_guesses"] = [[k, c // 5, b] for k, c, b in audit["bound_by_guesses"]]
    lowered_path = path.with_name("lowered.json")
    lowered_path.write_text(json.dumps(data))
    return lowered_path


def test_pytest_compares_with_a_baseline_and_fails_on_a_rise_only_when_asked(pytester):
    pytester.makeconftest(CONFTEST)
    # m = 2000, not the profile's 10⁴: a fifth of the correct guesses is a significant rise at any size
    common = ("-p", "no:cacheprovider", "--dp-audit", "--dp-audit-worlds=none", "--dp-audit-every-update=false", "--dp-audit-implementations=steady,drifted", "--dp-audit-set=m=2000")
    base = pytester.path / "base.json"
    pytester.runpytest(*common, "--dp-audit-seed=1", f"--dp-audit-report={base}").assert_outcomes(passed=2)
    baseline = lowered(base, "drifted")

    now = pytester.path / "now.json"
    result = pytester.runpytest(*common, "--dp-audit-seed=2", f"--dp-audit-compare={baseline}", f"--dp-audit-report={now}")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*dp-audit comparison with the baseline*", "*drifted*dp-audit*pass → pass*ROSE significantly (p = *", "*2 audit(s) matched*1 rose*"]
    )
    result.stdout.fnmatch_lines(["*steady*dp-audit*no significant rise (p = *"])
    assert json.loads(now.read_text())["comparison"]["risen"] == 1

    pytester.makeini("[pytest]\ndp_audit_compare_fail = true\n")  # the ini twin
    failing = pytester.runpytest(*common, "--dp-audit-seed=2", f"--dp-audit-compare={baseline}")
    failing.assert_outcomes(passed=2)
    assert failing.ret == 1
    failing.stdout.fnmatch_lines(["*1 significant rise(s): --dp-audit-compare-fail fails the session.*"])


def test_pytest_refuses_a_bad_baseline_at_start(pytester):
    missing = pytester.path / "missing.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--dp-audit", f"--dp-audit-compare={missing}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--dp-audit-compare: baseline {missing}: no such file*"])


def test_the_cli_compares_with_a_baseline(tmp_path, capsys):
    from dpverify.cli import main
    from dpverify.contract import ImplementationInfo
    from dpverify.registry import register_implementation, unregister_implementation
    from tests.doubles import GaussianMechanism

    register_implementation(GaussianMechanism(claimed_epsilon=1.0, info=ImplementationInfo(name="cli-drifted", library="numpy")))
    try:
        base, now = tmp_path / "base.json", tmp_path / "now.json"
        assert main(["audit", "cli-drifted", "--worlds", "none", "--every-update", "off", "--seed", "1", "--report", str(base)]) == 0
        baseline = lowered(base, "cli-drifted")
        capsys.readouterr()
        assert main(["audit", "cli-drifted", "--worlds", "none", "--every-update", "off", "--seed", "2", "--compare", str(baseline), "--report", str(now)]) == 0
        out = capsys.readouterr().out
        assert "comparison with the baseline:" in out and "ROSE significantly (p = " in out
        assert "A family of its own beside the audits' level: failing the session on a rise (compare-fail) can add up to 0.05" in out
        assert json.loads(now.read_text())["comparison"]["audits"][0]["rose"] is True
        assert main(["audit", "cli-drifted", "--worlds", "none", "--every-update", "off", "--seed", "2", "--compare", str(baseline), "--compare-fail"]) == 1
        assert main(["audit", "cli-drifted", "--compare", str(tmp_path / "missing.json")]) == 2
        assert f"--compare: baseline {tmp_path / 'missing.json'}: no such file" in capsys.readouterr().err
    finally:
        unregister_implementation("cli-drifted")
