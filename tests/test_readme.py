"""The README's and docs/'s examples run as written. A page holds fenced ``python`` and ``bash`` blocks only,
so none goes untested:

- every Python block names its file on its first line (``# conftest.py``); together they are one user's
  project (with a ``mylib`` whose DP code is the bundled reference DP-SGD), run under each ``pytest`` line;
- every line of a bash block is a command: ``dpverify`` lines run in that project, ``pytest`` lines run it,
  and a ``bash scripts/...`` line names a script of this repository with arguments the script takes (the
  scripts themselves are the main job and the suite, which CI runs).
"""

import re
import shlex
import subprocess
import sys
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


def _file_name(block):
    named = re.match(r"# (\S+?\.py)\b", block)
    return named and named.group(1)


#: Each Python block by the file it names on its first line.
FILES = {_file_name(block): block for block in PYTHON_BLOCKS}

MYLIB = '''
from types import SimpleNamespace

from dpverify_reference.dpsgd import train_reference

_epsilons = {}


def my_train(request):
    trained = train_reference(request, name="my-dpsgd")
    _epsilons[trained.claim.noise_multiplier] = trained.claim.epsilon
    return SimpleNamespace(log_proba=trained.predict_log_proba), trained.claim.noise_multiplier


def my_accountant(sigma):
    return _epsilons[sigma]
'''


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
    assert DPVERIFY_COMMANDS and PYTEST_COMMANDS and SCRIPT_COMMANDS
    unchecked = [c for c in COMMANDS if c not in DPVERIFY_COMMANDS + PYTEST_COMMANDS + SCRIPT_COMMANDS]
    assert not unchecked, f"commands no test checks (add a check here): {unchecked}"


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
@pytest.mark.parametrize("command", PYTEST_COMMANDS)
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
