"""Which worker of a parallel run this process is, and one core for each worker that needs it.

A run in parallel processes (``dpverify audit --jobs N``, ``pytest -n N``) gives each of them one thread
(``OMP_NUM_THREADS=1`` in scripts/audit.sh and scripts/test.sh): the designated models are small, and
threads of several workers only contend for the same cores. XLA on CPU takes no such setting: it sizes its
thread pool by the cores the process may run on and hands each op's work to it, so a JAX worker of a
2-core CPU kept both cores busy and took longer than on one (:func:`own_core`). Only the standard library is
imported here.
"""

from __future__ import annotations

import importlib.util
import os
import re

__all__ = ["JOB_VARIABLE", "worker_index", "own_core", "confine_jax_worker"]

#: Set to each process's index among the processes of a ``dpverify audit --jobs N`` run (0 for the one that
#: deals the audits), as pytest-xdist sets ``PYTEST_XDIST_WORKER`` (``gw0``, ``gw1``, ...) in its workers.
JOB_VARIABLE = "DPVERIFY_JOB"


def worker_index() -> int | None:
    """This process's index among the workers of its run (``--jobs``' or pytest-xdist's); ``None`` outside one."""
    job = os.environ.get(JOB_VARIABLE, "")
    if job.isdigit():
        return int(job)
    xdist = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(xdist.group(1)) if xdist else None


def own_core() -> int | None:
    """Confine this process to one of the cores it may use, worker i to the i-th (modulo their number), when
    it is a worker of a parallel run on more than one core; the core, or ``None`` when nothing changed.

    Call it before a library sizes its thread pool by the cores it sees (JAX: before its first op). Measured
    on the 2-core CPU, jax-privacy-core's two gate audits (one-run and every-update) took 99.9 s of CPU in
    62.1 s unconfined and 45.5 s in 45.6 s on one core, with the same results
    (benchmarks/results/worker-cores.md): XLA's pool spent the rest handing the small ops around, and beside
    the other workers it takes the cores they need."""
    index = worker_index()
    if index is None or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def confine_jax_worker(executor: str) -> int | None:
    """:func:`own_core` for a worker whose audits train in this process (``executor`` is the session's
    :attr:`~dpverify.execution.ExecutorSpec.kind`: ``"inprocess"``) where JAX is installed; called at the
    worker's start (pytest's configure, the command line's audit), before anything can start XLA. Nothing
    elsewhere: a torch worker's one thread needs no confining, and a confined process's subprocesses (a
    pool's or Ray's workers, a test's inner pytest -n 2) inherit its one core."""
    if executor != "inprocess" or importlib.util.find_spec("jax") is None:
        return None
    return own_core()
