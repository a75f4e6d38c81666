"""A worker of a parallel run knows its index, and own_core confines it to a core of its own."""

import json
import os
import subprocess
import sys

import pytest

from dpverify.workers import JOB_VARIABLE, worker_index


@pytest.mark.parametrize(
    ("environment", "index"),
    [({JOB_VARIABLE: "2"}, 2), ({"PYTEST_XDIST_WORKER": "gw3"}, 3), ({JOB_VARIABLE: "1", "PYTEST_XDIST_WORKER": "gw0"}, 1),
     ({}, None), ({"PYTEST_XDIST_WORKER": "master"}, None), ({JOB_VARIABLE: "x"}, None)],
)  # fmt: skip
def test_a_worker_knows_its_index(monkeypatch, environment, index):
    for name in (JOB_VARIABLE, "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert worker_index() == index


#: In a fresh process given every core of the machine (this one may be a confined worker itself): the cores it
#: may use, then those after own_core().
CORES_BEFORE_AND_AFTER = """
import json
import os
try:
    os.sched_setaffinity(0, range(os.cpu_count()))
except OSError:
    pass
before = sorted(os.sched_getaffinity(0))
from dpverify.workers import own_core
own_core()
print(json.dumps([before, sorted(os.sched_getaffinity(0))]))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
@pytest.mark.parametrize("job", [None, 0, 1, 2])
def test_each_worker_gets_its_own_core_and_a_process_outside_a_run_keeps_them_all(job):
    env = {k: v for k, v in os.environ.items() if k not in (JOB_VARIABLE, "PYTEST_XDIST_WORKER")}
    if job is not None:
        env[JOB_VARIABLE] = str(job)
    out = subprocess.run([sys.executable, "-c", CORES_BEFORE_AND_AFTER], env=env, capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout)
    if len(before) < 2:
        pytest.skip("this machine gives a process one core: nothing to confine")
    assert after == (before if job is None else [before[job % len(before)]])

