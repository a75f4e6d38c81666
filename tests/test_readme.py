"""The README's and docs/'s examples run as written. A page holds fenced ``python`` and ``bash`` blocks only,
so none goes untested:

- every Python block names its file on its first line (``# conftest.py``); together they are one user's
  project (with a ``mylib`` whose DP code is the bundled reference DP-SGD), run under each ``pytest`` line;
- every line of a bash block is a command: ``dpverify`` lines run in that project, ``pytest`` lines run it,
  a ``pip install`` line names extras dpverify has, and a ``bash scripts/...`` line names a script of this
  repository with arguments the script takes (the scripts themselves are the main job and the suite, which CI
  runs);
- the README's CI step is the pytest step of the workflow a library copies (``docs/ci/dp-audit.yml``), and
  that workflow's steps run on the README's conftest alone: every audit of a correct DP-SGD is decided and
  passes, and the same trainer with its noise divided by 2 fails the step.
"""

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
#: (page, language, body) of each fenced block.
BLOCKS = [
    (page, language, body)
    for page, text in PAGES.items()
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
]
PYTHON_BLOCKS = [body for _, language, body in BLOCKS if language == "python"]
#: Each bash block's command lines, once each, in the order the pages give them.
COMMANDS = list(
    dict.fromkeys(
        line.strip() for _, language, body in BLOCKS if language == "bash" for line in body.splitlines() if line.strip()
    )
)
DPVERIFY_COMMANDS = [command for command in COMMANDS if command.startswith("dpverify ")]
PYTEST_COMMANDS = [command for command in COMMANDS if command.startswith("pytest ")]
SCRIPT_COMMANDS = [command for command in COMMANDS if command.startswith("bash scripts/")]
PIP_COMMANDS = [command for command in COMMANDS if command.startswith("pip install ")]
#: The README's pytest lines: its CI step alone, which the workflow's tests run on the README's conftest.
CI_STEPS = [
    line.strip()
    for page, language, body in BLOCKS
    if page == "README.md" and language == "bash"
    for line in body.splitlines()
    if line.strip().startswith("pytest ")
]
#: The GitHub Actions workflow a library copies; its ``run`` steps are the commands below run or check.
WORKFLOW = ROOT / "docs" / "ci" / "dp-audit.yml"


def _file_name(block):
    named = re.match(r"# (\S+?\.py)\b", block)
    return named and named.group(1)


#: Each Python block by the file it names on its first line.
FILES = {_file_name(block): block for block in PYTHON_BLOCKS}

MYLIB = '''
"""mylib: a small DP-SGD library in plain torch, the trainer the README's conftest registers (the reference's
per-example clipping and accountant)."""
import torch

from dpverify_reference import accounting
from dpverify_reference.dpsgd import clipped_gradient_sum


class DPSGD:
    def __init__(self, model, *, noise_multiplier, target_epsilon, delta, max_grad_norm, sampling_rate, steps,
                 normaliser, learning_rate, seed):
        if noise_multiplier is None:
            noise_multiplier = accounting.calibrate_noise_multiplier(target_epsilon, sampling_rate, steps, delta)
        self.model, self.noise_multiplier, self.delta = model, noise_multiplier, delta
        self.max_grad_norm, self.sampling_rate = max_grad_norm, sampling_rate
        self.normaliser, self.learning_rate = normaliser, learning_rate
        self.sampler = torch.Generator().manual_seed(seed)
        self.noise = torch.Generator().manual_seed(seed + 1)
        self.steps_taken = 0

    def step(self, features, labels):
        features, labels = torch.from_numpy(features), torch.from_numpy(labels)
        batch = torch.rand(len(features), generator=self.sampler) < self.sampling_rate  # Poisson sampling
        clipped_sum, _ = clipped_gradient_sum(self.model, features[batch], labels[batch], self.max_grad_norm)
        std = self.noise_multiplier * self.max_grad_norm
        with torch.no_grad():
            for param, grad in zip(self.model.parameters(), clipped_sum):
                noisy_sum = grad + std * torch.randn(param.shape, generator=self.noise)
                param.sub_(self.learning_rate * noisy_sum / self.normaliser)
        self.steps_taken += 1

    def epsilon(self):
        return accounting.rdp_epsilon(self.noise_multiplier, self.sampling_rate, self.steps_taken, self.delta)
'''
#: mylib's noise line, and the same line with the noise divided by 2: the bug the CI step must catch.
NOISE = "std = self.noise_multiplier * self.max_grad_norm\n"
HALF_NOISE = "std = self.noise_multiplier * self.max_grad_norm / 2\n"


def _workflow_run_steps():
    """Each ``run`` step of the workflow, as the shell would split it."""
    yaml = pytest.importorskip("yaml")
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return [shlex.split(step["run"]) for job in jobs.values() for step in job["steps"] if "run" in step]


def _workflow_pytest_step():
    (pytest_step,) = [argv for argv in _workflow_run_steps() if argv[0] == "pytest"]
    return pytest_step


def test_every_code_block_is_one_these_tests_run():
    kinds = {(page, language) for page, language, _ in BLOCKS if language not in ("python", "bash")}
    assert not kinds, f"fenced blocks these tests do not run (use python or bash): {sorted(kinds)}"
    for page, text in PAGES.items():
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        indented = re.findall(r"\n\n( {4}\S.*)", prose)
        assert not indented, f"{page}: an indented code block, which no test runs: {indented[0]!r}"


def test_the_pages_hold_the_examples_these_tests_run():
    assert None not in FILES, "a python block must name its file on its first line, e.g. `# test_mine.py`"
    assert len(FILES) == len(PYTHON_BLOCKS), "two python blocks name the same file"
    assert {"conftest.py", "test_mine.py", "my_dpsgd.py", "test_contract.py", "test_drawn.py"} <= set(FILES)
    assert DPVERIFY_COMMANDS and PYTEST_COMMANDS and SCRIPT_COMMANDS and PIP_COMMANDS
    checked = DPVERIFY_COMMANDS + PYTEST_COMMANDS + SCRIPT_COMMANDS + PIP_COMMANDS
    unchecked = [c for c in COMMANDS if c not in checked]
    assert not unchecked, f"commands no test checks (add a check here): {unchecked}"


def _check_pip_install(argv):
    """A ``pip install`` names dpverify (or the project, ``-e .``) with extras that dpverify has."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert argv[:2] == ["pip", "install"]
    for requirement in argv[2:]:
        named = re.fullmatch(r"(dpverify|\.)(?:\[([\w,-]+)\])?", requirement)
        assert requirement == "-e" or named, f"{argv}: {requirement!r} is neither dpverify nor the project"
        if named and named.group(1) == "dpverify":
            assert set((named.group(2) or "").split(",")) - {""} <= extras, f"{requirement}: dpverify's extras are {sorted(extras)}"


@pytest.mark.parametrize("command", PIP_COMMANDS)
def test_each_pip_install_names_extras_dpverify_has(command):
    _check_pip_install(shlex.split(command, comments=True))


def test_the_readme_ci_step_is_the_workflow_pytest_step_and_every_other_step_is_checked():
    readme_steps = [shlex.split(c, comments=True) for c in CI_STEPS]
    assert readme_steps == [_workflow_pytest_step()], "the README's CI step and docs/ci/dp-audit.yml's differ"
    assert "--dp-audit-strict" in _workflow_pytest_step(), "a release gate fails when nothing was decided"
    for argv in _workflow_run_steps():
        assert argv[0] in ("pip", "pytest"), f"a workflow step no test checks (add a check here): {argv}"
        if argv[0] == "pip":
            _check_pip_install(argv)


def test_the_readme_gives_the_two_commands_of_its_quick_start():
    readme = [shlex.split(c, comments=True) for c in SCRIPT_COMMANDS if c in PAGES["README.md"]]
    assert readme[:2] == [["bash", "scripts/audit.sh"], ["bash", "scripts/test.sh"]]


def test_every_relative_link_leads_to_a_file():
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path = (ROOT / page).parent / target.split("#")[0]
            assert path.exists(), f"{page} links to {target}, which does not exist"


@pytest.mark.parametrize("command", SCRIPT_COMMANDS)
def test_the_scripts_named_exist_and_take_their_arguments(command):
    _bash, script, *arguments = shlex.split(command, comments=True)
    path = ROOT / script
    assert path.is_file(), f"{command!r} names {script}, which does not exist"
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    for argument in arguments:
        assert argument in path.read_text(), f"{script} does not handle {argument}"


def _project(directory, conftest_in="."):
    """The user's project: mylib, the pages' modules at its root, their conftest in ``conftest_in``."""
    (directory / "mylib.py").write_text(MYLIB)
    for name, block in FILES.items():
        if name == "conftest.py":
            (directory / conftest_in).mkdir(exist_ok=True)
            (directory / conftest_in / name).write_text(block)
        elif not name.startswith("test_"):
            (directory / name).write_text(block)


@pytest.mark.slow
@pytest.mark.parametrize("command", [command for command in PYTEST_COMMANDS if command not in CI_STEPS])
def test_the_examples_run_as_written_under_each_pytest_line(command, pytester):
    """The user's conftest and tests, the hand-written DP-SGD through conformance and an audit, and a drawn
    configuration's audit, as one user's project, run by the pages' pytest line (with -v, to read it)."""
    pytest.importorskip("torch")
    _project(pytester.path)
    pytester.makepyfile(**{name.removesuffix(".py"): block for name, block in FILES.items() if name.startswith("test_")})
    argv = shlex.split(command, comments=True)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *argv[1:], "-v")
    # test_mine's two tests, test_contract's two, my-dpsgd's one-run audit, its every-update audit (it hands its
    # updates over) and four two-world audits pass; the drawn test passes or, when a drawn configuration could
    # not see, skips as undecided (draws vary outside CI)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == outcomes.get("errors", 0) == 0 and outcomes["passed"] >= 10
    assert outcomes["passed"] + outcomes.get("skipped", 0) == 11
    result.stdout.fnmatch_lines(["*test_every_registered[[]my-dpsgd[]] PASSED*", "*dp-audit[[]my-dpsgd[]] PASSED*"])
    result.stdout.fnmatch_lines(["*every-update[[]my-dpsgd[]] PASSED*"])
    result.stdout.fnmatch_lines(["*test_an_audit_of_an_unregistered_trainer PASSED*"])
    assert "test_my_dpsgd_keeps_its_claim PASSED" in result.stdout.str() or "could not see" in result.stdout.str()
    for world in ("dataset_size", "realised_batch", "worst_case_record"):
        result.stdout.fnmatch_lines([f"*two-world[[]my-dpsgd-{world}[]] PASSED*"])
    assert "UserWarning" not in result.stdout.str()
    for argument in argv:
        if argument.startswith("--dp-audit-report="):
            assert (pytester.path / argument.split("=", 1)[1]).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("command", DPVERIFY_COMMANDS)
def test_the_command_lines_run_as_written(command, tmp_path):
    """Each `dpverify` line, in a project laid out as the README's (its conftest in tests/)."""
    pytest.importorskip("opacus")
    _project(tmp_path, conftest_in="tests")
    argv = shlex.split(command, comments=True)
    done = subprocess.run(
        [sys.executable, "-m", "dpverify", *argv[1:]], capture_output=True, text=True, timeout=1800, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _run_the_workflow(pytester, mylib):
    """The workflow's pytest step in a project of the README's conftest and ``mylib`` alone, as a maintainer
    who copied both has it; its exit status and the report it wrote."""
    pytest.importorskip("torch")
    (pytester.path / "mylib.py").write_text(mylib)
    (pytester.path / "conftest.py").write_text(FILES["conftest.py"])
    _pytest, *arguments = _workflow_pytest_step()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *arguments, "-v")
    (report,) = [a.split("=", 1)[1] for a in arguments if a.startswith("--dp-audit-report=")]
    return result, json.loads((pytester.path / report).read_text())["audits"]


@pytest.mark.slow
def test_the_workflow_decides_and_passes_every_audit_of_a_correct_trainer(pytester):
    """Every ready-made audit of the README's conftest over a correct DP-SGD is decided (strict: an undecided one
    would fail) and passes: the one-run audit, the every-update audit (the hand-over) and the two-world worlds
    (the designated normaliser). A false alarm has probability at most 1 − confidence (5 %) for the session; the
    seed is the workflow's own."""
    result, audits = _run_the_workflow(pytester, MYLIB)
    assert result.ret == 0, result.stdout.str()[-3000:]
    names = sorted(audit["nodeid"] for audit in audits)
    assert {"dp-audit::dp-audit[my-dpsgd]", "dp-audit::every-update[my-dpsgd]"} <= set(names), names
    assert sum(name.startswith("dp-audit::two-world[my-dpsgd-") for name in names) >= 3, names
    assert [audit["verdict"] for audit in audits] == ["pass"] * len(audits), names
    assert result.parseoutcomes() == {"passed": len(audits)}


@pytest.mark.slow
def test_the_workflow_fails_on_the_same_trainer_with_its_noise_divided_by_2(pytester):
    """A 2× noise deficit is above the k* the quick profile's one-run audit states for this DP-SGD (it catches
    the stated k* with probability ≥ 0.8, README "What k* promises"), and the worst-case-record and
    every-update audits see it too: the step fails with a refuted claim, not with an error. Over seeds 0–4 each
    of the three refuted it on 5 of 5 and the correct trainer passed every audit on 5 of 5
    (benchmarks/ci_workflow.py, benchmarks/results/ci-workflow.md)."""
    assert MYLIB.count(NOISE) == 1
    result, audits = _run_the_workflow(pytester, MYLIB.replace(NOISE, HALF_NOISE))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    verdicts = [audit["verdict"] for audit in audits]
    assert set(verdicts) <= {"pass", "violation"} and "violation" in verdicts, verdicts
    assert result.parseoutcomes()["failed"] == verdicts.count("violation")
