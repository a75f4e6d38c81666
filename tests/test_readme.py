"""The README's examples run as written: its Python blocks as a user's conftest and test file (with a
``mylib`` whose DP code is the bundled reference DP-SGD), and its `dpverify` command lines."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
COMMANDS = [line.strip() for line in README.splitlines() if line.strip().startswith("dpverify audit ")]
#: Each Python block by the file it names on its first line ("# conftest.py").
FILES = {re.match(r"# (\S+?\.py)", block).group(1): block for block in PYTHON_BLOCKS}

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


def test_the_readme_has_the_examples_this_file_runs():
    assert list(FILES) == ["conftest.py", "test_mine.py", "my_dpsgd.py", "test_contract.py", "test_drawn.py"]
    assert len(FILES) == len(PYTHON_BLOCKS) and COMMANDS


@pytest.mark.slow
def test_the_conftest_and_test_examples_run_as_written(pytester):
    """The user's conftest and tests, the hand-written DP-SGD through conformance and an audit, and a drawn
    configuration's audit, as one user's project."""
    pytest.importorskip("torch")
    pytester.makepyfile(mylib=MYLIB, **{name.removesuffix(".py"): block for name, block in FILES.items()})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dp-audit", "--dp-audit-seed=0", "-v")
    # test_mine's two tests, test_contract's two, my-dpsgd's one-run audit, its every-update audit and three
    # two-world audits pass; the drawn test passes or, when a drawn configuration could not see, skips as
    # undecided (draws vary outside CI)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == outcomes.get("errors", 0) == 0 and outcomes["passed"] >= 9
    assert outcomes["passed"] + outcomes.get("skipped", 0) == 10
    result.stdout.fnmatch_lines(["*test_every_registered[[]my-dpsgd[]] PASSED*", "*dp-audit[[]my-dpsgd[]] PASSED*"])
    result.stdout.fnmatch_lines(["*every-update[[]my-dpsgd[]] PASSED*"])
    result.stdout.fnmatch_lines(["*test_an_audit_of_an_unregistered_trainer PASSED*"])
    assert "test_my_dpsgd_keeps_its_claim PASSED" in result.stdout.str() or "could not see" in result.stdout.str()
    for world in ("dataset_size", "realised_batch", "worst_case_record"):
        result.stdout.fnmatch_lines([f"*two-world[[]my-dpsgd-{world}[]] PASSED*"])
    assert "UserWarning" not in result.stdout.str()


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_the_command_lines_run_as_written(command, tmp_path):
    """Each `dpverify audit` line, in a project laid out as the README's (its conftest in tests/)."""
    pytest.importorskip("opacus")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(FILES["conftest.py"])
    (tmp_path / "mylib.py").write_text(MYLIB)
    argv = shlex.split(command, comments=True)
    done = subprocess.run(
        [sys.executable, "-m", "dpverify", *argv[1:]], capture_output=True, text=True, timeout=1800, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
