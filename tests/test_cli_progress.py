"""Progress: the contract's step callback (every audit kind hands it to the trainer, and the bundled
Opacus, TF-Privacy and reference trainers call it once per DP step, as ``progress(step, steps)``), the
stages an audit says, and the line that joins them on a terminal, in a CLI log and under pytest."""

import io
import sys
from pathlib import Path

import pytest

from dpverify.audits import run_audit
from dpverify.audits.language import LanguageAuditConfig
from dpverify.cli import main
from dpverify.config import profile_config
from dpverify.contract import ImplementationInfo
from dpverify.progress import LOG_INTERVAL, ProgressLine, StreamDisplay
from dpverify.registry import get_implementation, register_implementation, unregister_implementation
from tests.doubles import NumpyDPSGD

REPO = Path(__file__).resolve().parents[1]

SMALL = dict(m=100, dimension=100, hidden_width=50, epochs=3, device="cpu", pooled_runs=1)


@pytest.mark.parametrize(
    "name, config",
    [
        ("reference-dpsgd", profile_config("quick", **SMALL)),
        ("opacus-ghost", profile_config("quick", **SMALL, sampling_rate=0.5)),
        ("opacus-hooks", profile_config("quick", **SMALL, design="pair")),
        ("reference-dpsgd", profile_config("quick", design="in_distribution", m=50, epochs=2, device="cpu")),
        ("opacus-lm", LanguageAuditConfig().with_overrides(m=50, epochs=2, device="cpu", pooled_runs=1)),
        ("tf-privacy-keras", profile_config("quick", **SMALL, sampling_rate=0.5)),
        ("tf-privacy-fast-clipping", profile_config("quick", **SMALL)),
    ],
    ids=["reference", "opacus-subsampled", "opacus-pair", "data-design", "language", "tf-privacy", "tf-fast-clipping"],
)
def test_trainers_report_every_step(name, config):
    pytest.importorskip("torch")
    implementation = get_implementation(name)
    if implementation.unavailable_reason():
        pytest.skip(implementation.unavailable_reason())
    if config.design == "in_distribution":
        pytest.importorskip("sklearn")
    calls = []
    result = run_audit(implementation, config, step_progress=lambda step, steps: calls.append((step, steps)))
    assert result.verdict != "error", result.error
    steps = config.hyperparameters.steps
    assert calls == [(step, steps) for step in range(1, steps + 1)]


# --- the progress line: its stage label, and how much of it a terminal, a log and pytest get -------------


class _Recorder:
    """A display that keeps every line it is shown (the stage and step text, without label and seconds)."""

    def __init__(self, *, in_place: bool) -> None:
        self.in_place = in_place
        self.lines: list[str] = []

    def show(self, line: str) -> None:
        self.lines.append(line.split("s ", 1)[1])

    def end(self) -> None:
        self.lines.append("<end>")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_pooled_run_shows_its_own_steps_and_the_end_tests_the_claim():
    """After run 1 the steps shown are run 2's (they were labelled "querying the black box")."""
    recorder = _Recorder(in_place=True)
    line = ProgressLine("x", recorder, interval=0.0)
    config = profile_config("quick", m=200, pooled_runs=2, epochs=3, device="cpu")
    assert run_audit(NumpyDPSGD(), config, progress=line.stage, step_progress=line.step).verdict == "pass"
    runs = [
        [f"training run {run} of 2", *(f"training run {run} of 2: step {step} of 3" for step in (1, 2, 3)), "querying the black box"]
        for run in (1, 2)
    ]
    assert recorder.lines == ["training test-numpy-dpsgd on 200 canaries in 2 runs (cpu)", *runs[0], *runs[1], "testing the claim"]


def test_a_terminal_line_is_redrawn_at_most_every_interval():
    clock, terminal = _Clock(), _Terminal()
    line = ProgressLine("[1/1] x", StreamDisplay(terminal), interval=0.1, clock=clock)
    line.stage("training")
    for step in range(1, 101):
        clock.now = step * 0.002  # 100 steps in 0.2 s: drawn at 0 (the stage), 0.1 and 0.2
        line.step(step, 100)
    line.finish("pass")
    text = terminal.getvalue()
    assert text.count("\r") == 4 and text.count("\n") == 1 and text.endswith("\n")
    assert "training: step 50 of 100" in text and "training: step 100 of 100" in text and "step 49 " not in text
    assert text.rsplit("\r", 1)[1].split() == ["[1/1]", "x", "0.2s", "pass"]


def test_a_log_gets_the_first_stage_a_line_per_interval_and_the_outcome():
    clock, recorder = _Clock(), _Recorder(in_place=False)
    line = ProgressLine("x", recorder, interval=0.1, clock=clock)  # a log's interval is LOG_INTERVAL
    for second in range(100):  # a 100 s audit: a stage and a step every second
        clock.now = second
        line.stage(f"training run {second // 10 + 1} of 10")
        line.step(second % 10 + 1, 10)
    line.finish("pass")
    assert LOG_INTERVAL == 30
    assert recorder.lines == ["training run 1 of 10", "training run 4 of 10", "training run 7 of 10", "training run 10 of 10", "pass", "<end>"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def numpy_dpsgd():
    register_implementation(NumpyDPSGD(info=ImplementationInfo(name="numpy-dpsgd", library="numpy")))
    yield
    unregister_implementation("numpy-dpsgd")


def test_the_cli_log_has_a_handful_of_lines_per_short_audit(numpy_dpsgd, capsys):
    assert main(["audit", "numpy-dpsgd", "--m", "200", "--worlds", "none", "--every-update", "off"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[1/1] numpy-dpsgd")]
    assert len(lines) == 2 and "training numpy-dpsgd on 200 canaries in 4 runs" in lines[0] and "ε_L = " in lines[1]


PYTEST_CONFTEST = f"""
import sys
import pytest
sys.path.insert(0, {str(REPO)!r})
from dpverify.contract import ImplementationInfo
from dpverify.registry import register_implementation
from tests.doubles import NumpyDPSGD

register_implementation(NumpyDPSGD(info=ImplementationInfo(name="numpy-dpsgd", library="numpy")))

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if config.getoption("--as-terminal"):  # pytester's output is no terminal: say it is one
        config.pluginmanager.get_plugin("terminalreporter").isatty = lambda: True

def pytest_addoption(parser):
    parser.addoption("--as-terminal", action="store_true")
"""


@pytest.fixture
def audited(pytester):
    pytester.makeconftest(PYTEST_CONFTEST)
    pytester.makeini("[pytest]\ndp_audit_seed = 3\ndp_audit_worlds = none\ndp_audit_every_update = false\ndp_audit_implementations = numpy-dpsgd\n")

    def run(*args):
        # Without Hypothesis' plugin, which pytester would import anew in every run (seconds each).
        return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--dp-audit", "--dp-audit-set", "m=200", *args)

    return run


LINE = "dp-audit numpy-dpsgd "


def test_pytest_shows_each_audits_progress_on_a_terminal_and_nothing_with_q(audited):
    shown = audited("--as-terminal")
    shown.assert_outcomes(passed=1)
    text = shown.stdout.str()
    lines = shown.stdout.lines  # pytester reads the redraws' carriage returns as line ends
    drawn = [index for index, line in enumerate(lines) if line.startswith(LINE)]
    assert "training numpy-dpsgd on 200 canaries in 4 runs" in lines[drawn[0]] and "ε_L = " in lines[drawn[-1]], text
    assert lines[drawn[-1] + 1].startswith(".")  # the test's outcome on a line of its own
    quiet = audited("--as-terminal", "-q")
    quiet.assert_outcomes(passed=1)
    assert LINE not in quiet.stdout.str()


def test_pytest_progress_always_never_and_a_bad_value(audited):
    logged = audited("--dp-audit-progress=always", "-q")  # not a terminal: a log's lines, even with -q
    lines = [line for line in logged.stdout.lines if line.startswith(LINE)]
    assert len(lines) == 2 and "ε_L = " in lines[1]
    assert LINE not in audited("--as-terminal", "--dp-audit-progress=never").stdout.str()
    bad = audited("--dp-audit-progress=sometimes")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--dp-audit-progress='sometimes' is invalid" in bad.stderr.str()
