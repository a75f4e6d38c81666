"""A worker of a parallel run knows its index, and own_core confines it to a core of its own."""

import importlib.util
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
#: may use, then those after ``call``.
CORES_BEFORE_AND_AFTER = """
import json
import os
try:
    os.sched_setaffinity(0, range(os.cpu_count()))
except OSError:
    pass
before = sorted(os.sched_getaffinity(0))
import dpverify.workers
dpverify.workers.{call}
print(json.dumps([before, sorted(os.sched_getaffinity(0))]))
"""


def cores_before_and_after(call, job):
    """The cores of a fresh process of worker index ``job`` (``None``: no worker) before and after ``call``;
    skips where a process gets one core."""
    env = {k: v for k, v in os.environ.items() if k not in (JOB_VARIABLE, "PYTEST_XDIST_WORKER")}
    if job is not None:
        env[JOB_VARIABLE] = str(job)
    code = CORES_BEFORE_AND_AFTER.format(call=call)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    before, after = json.loads(out.stdout)
    if len(before) < 2:
        pytest.skip("this machine gives a process one core: nothing to confine")
    return before, after


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
@pytest.mark.parametrize("job", [None, 0, 1, 2])
def test_each_worker_gets_its_own_core_and_a_process_outside_a_run_keeps_them_all(job):
    before, after = cores_before_and_after("own_core()", job)
    assert after == (before if job is None else [before[job % len(before)]])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
@pytest.mark.parametrize("executor", ["inprocess", "pool", "ray"])
def test_a_jax_worker_is_confined_only_where_its_audits_train_in_it(executor):
    """A pool's or Ray's workers would inherit the one core: a worker whose runs train elsewhere keeps its cores,
    and so does a worker where JAX is not installed."""
    before, after = cores_before_and_after(f"confine_jax_worker({executor!r})", 1)
    confined = executor == "inprocess" and importlib.util.find_spec("jax") is not None
    assert after == ([before[1 % len(before)]] if confined else before)
