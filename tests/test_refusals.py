"""Issue 20: do what the user asked, or refuse at the door on every path (pytester, numpy doubles): bad
settings, audits that could only end undecided, unwritable report paths, interrupted and stopped runs,
which tests a run selects."""

import json

import pytest

from dpverify._validation import check_writable
from dpverify.audits import undecidable
from dpverify.config import PROFILE_NAMES, profile_config, two_world_config
from dpverify.canaries.worlds import world_names
from tests.doubles import Oblivious
from tests.test_plugin import SMALL, run, project  # noqa: F401  (project is a fixture)

#: A trainer that must not be reached: an audit refused before training never calls it.
NEVER_TRAINED = """
from tests.doubles import Oblivious

class NeverTrained(Oblivious):
    def train(self, request):
        raise AssertionError("trained although the audit could decide nothing")
"""


def test_a_bad_dp_audit_set_value_is_a_usage_error_naming_it(project):
    result = run(project, "--dp-audit", "--dp-audit-set", "m=abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --dp-audit-set: m must be an integer, got 'abc'"])
    bad_runs = run(project, "--dp-audit", "--dp-audit-worlds=dataset_size", "--dp-audit-set", "runs=many")
    assert bad_runs.ret == pytest.ExitCode.USAGE_ERROR
    bad_runs.stderr.fnmatch_lines(["ERROR: --dp-audit-set: runs must be an integer, got 'many'"])


def test_a_bad_marker_value_errors_its_test_once_without_a_traceback(project):
    project.makepyfile(
        """
        import pytest

        @pytest.mark.dp_audit(m="abc")
        def test_abc(dp_audit):
            dp_audit("third-party-private")

        @pytest.mark.dp_audit(colour="red")
        def test_colour(dp_audit):
            pass
        """
    )
    result = run(project, "--dp-audit", "--dp-audit-implementations=none")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["test_*::test_abc: dp_audit marker: m must be an integer, got 'abc'"])
    text = result.stdout.str()
    assert "Traceback" not in text and "TypeError" not in text and "During handling" not in text
    result.stdout.fnmatch_lines(["test_*::test_colour: unknown dp_audit marker keyword(s) colour; known: *"])


def test_an_audit_that_can_only_end_undecided_is_skipped_before_training_from_a_marker_or_a_call(project, tmp_path):
    project.makepyfile(
        NEVER_TRAINED
        + """
import pytest

@pytest.mark.dp_audit(m=20, dimension=20, num_classes=5)
def test_marker(dp_audit):
    dp_audit(NeverTrained())

def test_call(dp_audit):
    dp_audit(NeverTrained(), m=20, dimension=20, num_classes=5)
"""
    )
    report = tmp_path / "r.json"
    result = run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        ["*test-oblivious: not run: m = 20 canaries can show at most ε_O = *, not above the target ε = 2, *; use m=* or more*"]
    )
    assert json.loads(report.read_text())["audits"] == []
    strict = run(project, "--dp-audit", "--dp-audit-implementations=none", "--dp-audit-strict")
    strict.assert_outcomes(failed=2)
    assert "trained although" not in strict.stdout.str()


def test_a_ready_made_two_world_audit_with_too_few_runs_is_skipped_naming_runs(project, tmp_path):
    report = tmp_path / "r.json"
    result = run(
        project, "--dp-audit", "--dp-audit-implementations=third-party-private", "--dp-audit-worlds=dataset_size",
        "--dp-audit-set", "runs=10", f"--dp-audit-report={report}", "-k", "two-world", "-rs",
    )
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*not run: 10 runs per world can refute at most ε = 0.000*; use runs=* or more (*"])
    assert "--m" not in result.stdout.str() and json.loads(report.read_text())["audits"] == []


def test_the_refusal_names_the_smallest_value_that_decides():
    config = profile_config("quick", m=20, dimension=20, num_classes=5, confidence=0.99)
    refusal = undecidable(Oblivious(), config)
    assert refusal.setting == "m" and refusal.value == 20
    assert undecidable(Oblivious(), config.with_overrides(m=refusal.needed, dimension=refusal.needed)) is None
    assert undecidable(Oblivious(), config.with_overrides(m=refusal.needed - 1, dimension=refusal.needed - 1)) is not None
    world = two_world_config("quick", "dataset_size", runs=10).with_overrides(confidence=0.99)
    refusal = undecidable(Oblivious(), world)
    assert refusal.setting == "runs" and undecidable(Oblivious(), world.with_overrides(runs=refusal.needed)) is None


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_no_profile_or_gate_world_is_refused_as_designed(profile):
    """The designed audits decide (at a 20-audit session's level): the refusal only stops settings that cannot."""
    confidence = 1 - 0.05 / 20
    assert undecidable(Oblivious(), profile_config(profile, confidence=confidence)) is None
    for world in world_names():
        assert undecidable(Oblivious(), two_world_config(profile, world).with_overrides(confidence=confidence)) is None, world


def test_a_report_path_that_cannot_be_written_is_a_usage_error_at_start(project, tmp_path):
    too_long = tmp_path / ("r" * 300 + ".json")
    result = run(project, "--dp-audit", SMALL, f"--dp-audit-report={too_long}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --dp-audit-report=*: cannot write *: File name too long; give a writable path"])
    assert list(tmp_path.iterdir()) == []


def test_checking_a_path_leaves_nothing_behind_and_an_existing_file_as_it_was(tmp_path):
    check_writable(tmp_path / "new" / "deeper" / "r.json")
    check_writable(tmp_path / "plots" / "here", directory=True)
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "r.json"
    existing.write_text("kept")
    check_writable(existing)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"] and existing.read_text() == "kept"
    with pytest.raises(ValueError, match=r"cannot write .*r.json/x: Not a directory"):
        check_writable(existing / "x")


@pytest.mark.parametrize(
    "stopper, stopped",
    [("raise KeyboardInterrupt", "interrupted"), ("assert False, 'stops the run'", "stopping after 1 failures")],
)
def test_a_run_stopped_early_leaves_an_incomplete_report(project, tmp_path, stopper, stopped):
    project.makepyfile(
        f"""
        import pytest

        @pytest.mark.dp_audit(m=60, dimension=60, num_classes=5)
        def test_1_audit(dp_audit):
            dp_audit("third-party-private")

        def test_2_stops():
            {stopper}

        @pytest.mark.dp_audit(m=60, dimension=60, num_classes=5)
        def test_3_never_reached(dp_audit):
            dp_audit("third-party-private")
        """
    )
    report = tmp_path / "r.json"
    # Ctrl-C in an inner session run in-process would stop this one too: it runs in a process of its own.
    result = run(
        project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}", "-x",
        subprocess=stopped == "interrupted",
    )
    data = json.loads(report.read_text())
    assert data["complete"] is False and len(data["audits"]) == 1 and data["planned_audits"] == 2
    assert data["stopped"] == stopped
    result.stdout.fnmatch_lines([f"dp-audit JSON report: {report} (incomplete: {stopped})"])


def test_a_run_that_ends_is_complete(project, tmp_path):
    project.makepyfile("def test_plain():\n    pass\n")
    report = tmp_path / "r.json"
    run(project, "--dp-audit", "--dp-audit-implementations=none", f"--dp-audit-report={report}").assert_outcomes(passed=1)
    data = json.loads(report.read_text())
    assert data["complete"] is True and data["stopped"] is None


def test_naming_a_test_file_collects_it_without_the_ready_made_audits(project):
    project.makepyfile(test_plain="def test_plain():\n    pass\n")
    named = run(project, "--dp-audit", SMALL, "test_plain.py", "--collect-only", "-q")
    named.stdout.fnmatch_lines(["test_plain.py::test_plain", "1 test collected*"])
    # The whole suite, by no path or the root directory, includes them; -m dp_audit selects them.
    for path in ((), (str(project.path),)):
        run(project, "--dp-audit", SMALL, *path, "--collect-only", "-q").stdout.fnmatch_lines(["3 tests collected*"])
    marked = run(project, "--dp-audit", SMALL, "-m", "dp_audit", "--collect-only", "-q")
    marked.stdout.fnmatch_lines(["dp-audit::dp-audit[[]leaky[]]", "2/3 tests collected (1 deselected)*"])


def test_a_ready_made_audit_is_chosen_by_its_node_id(project):
    project.makepyfile(test_plain="def test_plain():\n    pass\n")
    chosen = run(project, "--dp-audit", SMALL, "test_plain.py", "dp-audit::dp-audit[leaky]", "--collect-only", "-q")
    chosen.stdout.fnmatch_lines(["test_plain.py::test_plain", "dp-audit::dp-audit[[]leaky[]]", "2 tests collected*"])
    unknown = run(project, "--dp-audit", SMALL, "dp-audit::dp-audit[leaky-typo]")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines(["*dp-audit::dp-audit[[]leaky-typo[]] names no ready-made audit of this session; its audits: *"])


def test_dp_audit_only_and_skip_select_the_audits_or_the_rest(project):
    project.makepyfile(
        test_mixed="""
        import pytest

        def test_plain():
            pass

        @pytest.mark.dp_audit(m=60, dimension=60, num_classes=5)
        def test_marked():
            pass

        def test_fixture(dp_audit):
            pass
        """
    )
    only = run(project, SMALL, "--dp-audit-only", "--collect-only", "-q")
    only.stdout.fnmatch_lines(["test_mixed.py::test_marked", "test_mixed.py::test_fixture", "dp-audit::dp-audit[[]leaky[]]"])
    only.stdout.fnmatch_lines(["4/5 tests collected (1 deselected)*"])
    assert "test_plain" not in only.stdout.str()
    skip = run(project, "--dp-audit", SMALL, "--dp-audit-skip", "--collect-only", "-q")
    skip.stdout.fnmatch_lines(["test_mixed.py::test_plain", "1/3 tests collected (2 deselected)*"])
    assert "dp-audit::" not in skip.stdout.str()
    both = run(project, "--dp-audit-only", "--dp-audit-skip")
    assert both.ret == pytest.ExitCode.USAGE_ERROR
    both.stderr.fnmatch_lines(["*--dp-audit-only runs only the DP audits and --dp-audit-skip deselects them; give one*"])
