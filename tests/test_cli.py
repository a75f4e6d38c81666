import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

import dpverify
from dpverify.cli import main

REPO = Path(__file__).resolve().parents[1]
#: Two audits of a few seconds each on a busy 2-core CPU.
SMALL = ["--m", "200", "--epochs", "5"]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m dpverify ARGS`` in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "dpverify", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def test_bound_prints_the_bound_and_the_optimum(capsys):
    assert main(["bound", "--m", "1000", "--guesses", "100", "--correct", "100"]) == 0
    out = capsys.readouterr().out
    assert "epsilon_lower_bound = " in out and "optimal for m=1000: 5.78" in out


def test_bound_help_explains_every_option_and_its_default(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bound", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    assert "correct guesses, in [0, guesses]" in text and "(default 1e-05)" in text and "(default 0.95)" in text


def test_bound_rejects_impossible_counts(capsys):
    assert main(["bound", "--m", "10", "--guesses", "5", "--correct", "6"]) == 2
    assert "correct" in capsys.readouterr().err


def test_python_dash_m_and_version():
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"dpverify {dpverify.__version__}"
    # `python -m dpverify.cli` runs main() only once every helper is defined (it raised NameError).
    module = subprocess.run(
        [sys.executable, "-m", "dpverify.cli", "audit", "opacus-ghost", "--m", "1", "--set", "pooled_runs=1"], capture_output=True, text=True, cwd=REPO
    )
    assert module.returncode == 2 and "NameError" not in module.stderr and "refusing" in module.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (["--epsilon", "-1"], "--epsilon must be > 0 (or inf), got -1"),
        (["--epsilon", "nan"], "--epsilon must be > 0 (or inf), got nan"),
        (["--m", "0"], "--m must be >= 1, got 0"),
        (["--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["--confidence", "1"], "--confidence must be in (0, 1), got 1"),
        (["--seed", "-3"], "--seed must be >= 0, got -3"),
    ],
)
def test_options_are_checked_at_the_door_and_named_as_typed(options, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "opacus-ghost", *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "target_epsilon" not in err


@pytest.mark.parametrize("pooled_runs", [1, 2])
def test_an_audit_that_could_only_end_undecided_is_refused_before_training(pooled_runs, capsys):
    """Eight canaries cannot refute even a fully private curve, pooled as one run or tested as two."""
    assert main(["audit", "reference-dpsgd", "--m", "8", "--set", f"pooled_runs={pooled_runs}", "--epsilon", "50"]) == 2
    assert "m = 8 canaries can show at most" in capsys.readouterr().err


def test_a_bad_set_value_is_a_usage_error_naming_it(capsys):
    """Issue 20: `--set m=abc` was a TypeError traceback."""
    assert main(["audit", "reference-dpsgd", "--set", "m=abc"]) == 2
    assert "dpverify: error: reference-dpsgd: m must be an integer, got 'abc'" in capsys.readouterr().err
    assert main(["audit", "reference-dpsgd", "--set", "guesses=0.5"]) == 2
    assert "guesses must be a count (an integer >= 1) or a tuple of fractions of m, got 0.5" in capsys.readouterr().err


def test_a_two_world_audit_with_too_few_runs_is_refused_naming_runs(capsys):
    """Issue 20: runs=10 trained anyway, ended undecided and named --m."""
    assert main(["audit", "reference-dpsgd", "--worlds", "dataset_size", "--set", "runs=10"]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "two-world dataset_size" in line]
    assert "10 runs per world can refute at most ε = 0.000" in line and "use --set runs=" in line and "--m" not in line
    assert "training" not in err


def test_all_with_names_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--all", "opacus-ghost"])
    assert exit_info.value.code == 2 and "give names (opacus-ghost) or --all, not both" in capsys.readouterr().err


def test_two_privacy_targets_are_an_error(capsys):
    assert main(["audit", "opacus-ghost", "--epsilon", "1", "--set", "noise_multiplier=1.0"]) == 2
    assert "give one privacy target, got --epsilon and --set noise_multiplier" in capsys.readouterr().err


def test_audit_needs_a_name_or_all_and_a_known_name(capsys):
    assert main(["audit"]) == 2
    assert "name at least one implementation" in capsys.readouterr().err
    assert main(["audit", "no-such-thing"]) == 2
    assert "no registered implementation matches no-such-thing" in capsys.readouterr().err


def test_an_audit_that_can_decide_nothing_is_refused_before_training(capsys):
    from dpverify.audits import undecidable
    from dpverify.config import profile_config
    from dpverify.registry import get_implementation

    one_run = ["--worlds", "none", "--every-update", "off", "--layers", "none"]
    assert main(["audit", "opacus-ghost", "reference-dpsgd", "--m", "1", "--set", "pooled_runs=1", *one_run]) == 2
    err = capsys.readouterr().err
    assert "training" not in err  # refused before the first audit started
    for name in ("opacus-ghost", "reference-dpsgd"):
        assert f"{name}: m = 1 canaries can show at most ε_O = 0.000" in err and "target ε = 2," in err
    needed = int(re.search(r"use --m (\d+) or more", err).group(1))
    # The smallest m that decides: one canary fewer is refused too (two audits share the level).
    for m, refused in ((needed, False), (needed - 1, True)):
        config = profile_config("quick", m=m, pooled_runs=1, confidence=1 - 0.05 / 2)
        assert (undecidable(get_implementation("reference-dpsgd"), config) is not None) == refused, m


def test_a_design_a_language_model_cannot_take_is_refused_before_any_audit(capsys):
    assert main(["audit", "opacus-ghost", "opacus-lm", "--design", "mislabeled"]) == 2
    err = capsys.readouterr().err
    assert "opacus-lm: a language model takes the designs inclusion, pair, not --design mislabeled" in err
    assert "training" not in err  # opacus-ghost, first in order, did not run either


@pytest.mark.parametrize("option", ["--report", "--plots"])
def test_an_unwritable_output_fails_before_any_audit(option, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["audit", "opacus-ghost", *SMALL, option, str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{option}: cannot write {blocker / 'out'}: Not a directory" in err and "training" not in err


def test_list_is_a_table_with_a_header_and_json(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["name", "task", "library", "version"]
    # Every row's status and expected cells start under their headers.
    for header in ("status", "expected"):
        column = lines[0].index(header)
        assert all(line[column - 2 : column] == "  " and line[column] != " " for line in lines[1:]), header
    assert main(["list", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert {"reference-dpsgd", "opacus-ghost", "opacus-no-noise", "tf-privacy-keras"} <= set(rows)
    assert rows["opacus-no-noise"]["expected"] == "violation" and rows["opacus-no-noise"]["detectability"] == "D1"


SLEEPER = '''
import time
from dpverify.contract import Implementation, ImplementationInfo
from dpverify.registry import register_implementation

class WaitsForInterrupt(Implementation):
    """Trains until interrupted: the audit running when Ctrl-C comes."""
    info = ImplementationInfo(name="waits-for-interrupt", library="dpverify")

    def train(self, request):
        time.sleep(600)

register_implementation(WaitsForInterrupt())
'''


def test_import_registers_from_a_module(tmp_path, monkeypatch, capsys):
    from dpverify.registry import unregister_implementation

    (tmp_path / "my_conftest_module.py").write_text(textwrap.dedent(SLEEPER))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert main(["list", "--json", "--import", "my_conftest_module"]) == 0
        assert "waits-for-interrupt" in {row["name"] for row in json.loads(capsys.readouterr().out)}
    finally:
        unregister_implementation("waits-for-interrupt")
        sys.modules.pop("my_conftest_module", None)
    assert main(["list", "--import", "no_such_module_here"]) == 2
    assert "--import no_such_module_here failed: ModuleNotFoundError" in capsys.readouterr().err


def test_an_interrupted_run_keeps_the_finished_audits_in_its_report(tmp_path):
    """Ctrl-C while the second audit trains: exit 130, the table and the report hold the first one."""
    helper = tmp_path / "conftest.py"
    helper.write_text(textwrap.dedent(SLEEPER))
    report = tmp_path / "report.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "dpverify", "audit", "reference-dpsgd", "waits-for-interrupt", "--import", str(helper),
         *SMALL, "--worlds", "none", "--every-update", "off", "--report", str(report)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
        # A pytest-xdist worker ignores SIGINT, and a child would inherit that: restore Ctrl-C's default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        # The report is rewritten (atomically) after each audit, so it is always whole JSON.
        while not (report.exists() and json.loads(report.read_text())["audits"]):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    data = json.loads(report.read_text())
    assert data["complete"] is False and [a["implementation"] for a in data["audits"]] == ["reference-dpsgd"]
    assert "interrupted; 1 of 2 audit(s) finished" in err
    assert "reference-dpsgd" in out and "(incomplete: interrupted)" in out


def test_audit_runs_reports_and_shows_progress(tmp_path):
    pytest.importorskip("opacus")
    report = tmp_path / "r.json"
    run = run_cli("audit", "opacus-no-noise", *SMALL, "--report", str(report))
    assert run.returncode == 0, run.stderr
    data = json.loads(report.read_text())
    (audit,) = data["audits"]
    # Without noise the 200 canaries are memorised outright: ε_L sits at the audit's ceiling, far above 2.
    assert audit["implementation"] == "opacus-no-noise" and audit["verdict"] == "violation", audit["error"]
    assert audit["nodeid"] == "dpverify audit opacus-no-noise" and "dpverify audit opacus-no-noise" in run.stdout
    assert data["dpverify_version"] == dpverify.__version__ and data["libraries"]["opacus"] == audit["library_version"]
    assert data["command"] == f"dpverify audit opacus-no-noise {' '.join(SMALL)} --report {report}"
    assert data["complete"] is True and datetime.fromisoformat(data["written_at"].replace("Z", "+00:00"))
    # stderr is a pipe here: a log gets the audit's first stage and its outcome (a line per 30 s between).
    first, last = [line for line in run.stderr.splitlines() if line.startswith("[1/1] opacus-no-noise")]
    assert "training opacus-no-noise on 200 canaries" in first and "violation by " in last and "\r" not in run.stderr


def test_a_terminal_without_utf8_gets_ascii_and_a_report(tmp_path):
    report = tmp_path / "r.json"
    # the one-run audit alone: its ε = ∞ row is what the ASCII table and the report must carry
    run = run_cli(
        "audit", "opacus-ghost", *SMALL, "--worlds", "none", "--every-update", "off", "--layers", "none", "--epsilon", "inf",
        "--report", str(report), env={"PYTHONIOENCODING": "cp1252"},
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(report.read_text())["audits"][0]["infinite"] == ["claimed_epsilon", "library_epsilon", "curve_claimed_epsilon"]
    header, rule, row = run.stdout.splitlines()[:3]
    assert "claimed eps" in header and "eps_L" in header and " inf " in row
    assert [m.start() for m in re.finditer("  -", rule)] == [m.start() for m in re.finditer(r"  \S", header)]
    assert "eps_L" in run.stderr
    listing = run_cli("list", env={"PYTHONIOENCODING": "cp1252"})
    assert listing.returncode == 0 and "sigma" in listing.stdout


def test_worlds_names_the_two_world_audits_and_a_bad_one_is_a_usage_error(capsys):
    assert main(["audit", "reference-dpsgd", "--worlds", "shuffle"]) == 2
    assert "unknown world(s) shuffle; known: dataset_size" in capsys.readouterr().err
    assert main(["list", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed["reference-dpsgd"]["two_world_worlds"] == ["dataset_size", "fixed_batch", "realised_batch", "worst_case_record"]
    # the default gate of them all runs a sampler's world once: on the first Opacus path expected private
    assert listed["opacus-hooks"]["sampler"] == listed["opacus-ghost"]["sampler"] == "opacus.DPDataLoader"
    assert "fixed_batch" in listed["opacus-ghost"]["two_world_worlds"]
    assert "fixed_batch" not in listed["opacus-hooks"]["two_world_worlds"]
    assert listed["opacus-dataloader"]["issue"] == "https://github.com/pytorch/opacus/issues/571"


def test_set_routes_each_setting_to_the_audit_that_knows_it(capsys):
    from dpverify.cli import _config_for
    from dpverify.config import parse_settings
    from dpverify.registry import get_implementation

    overrides = {"m": 300, **parse_settings(["prefix_length = 6", "num_tags=50", "trigger_mode=gaussian"])}
    assert overrides["prefix_length"] == 6 and overrides["trigger_mode"] == "gaussian"
    language = _config_for(get_implementation("opacus-lm"), "quick", overrides)
    assert (language.canaries.m, language.canaries.prefix_length) == (300, 6)
    classifier = _config_for(get_implementation("opacus-ghost"), "quick", {**overrides, "design": "multitask"})
    assert (classifier.data.m, classifier.data.num_tags, classifier.data.trigger_mode) == (300, 50, "gaussian")
    with pytest.raises(ValueError, match="unknown audit setting.*prefix_lenght"):
        _config_for(get_implementation("opacus-ghost"), "quick", {"prefix_lenght": 6})
    assert main(["audit", "reference-dpsgd", "--set", "m", "--plan"]) == 2
    assert "--set: a setting takes NAME=VALUE, got 'm'" in capsys.readouterr().err
