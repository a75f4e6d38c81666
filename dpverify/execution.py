"""Where an audit's independent training runs execute: in this process, in a local process pool, or on a
Ray cluster; the same scores by seed whichever.

An audit cuts its runs into a few tasks (:func:`chunks`: a small model's run takes milliseconds, so one task
per run would spend its time on messages) and gets their results back in task order from
:meth:`Executor.map`. What a task needs travels as a :class:`Parcel`: the object itself in this process,
or pickled once here and unpickled in the worker, so an object that cannot travel (a class defined in a
conftest) fails with a message that says what to do instead of a pickle traceback.

Worker processes change nothing in the numbers: each task first takes this process's torch thread count
(Ray starts its workers with ``OMP_NUM_THREADS=1``, a pool's spawned workers torch's default, and a
thread count can change a reduction's order). Only the standard library is imported here; Ray only when
the ``ray`` executor is chosen, torch only when a pool or Ray maps and torch is installed.
"""

from __future__ import annotations

import abc
import importlib.util
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Protocol

from dpverify._validation import check_choice, check_int

__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorSpec",
    "InProcessExecutor",
    "Parcel",
    "ProcessPoolExecutor",
    "RayExecutor",
    "UnportableObject",
    "chunks",
]

EXECUTORS = ("inprocess", "pool", "ray")
#: Tasks per unit of parallelism: enough to keep every worker busy to the end, few enough that a task's
#: message costs nothing next to its runs; and at least this many tasks, so progress comes in tenths.
TASKS_PER_WORKER = 4
MIN_TASKS = 10


class UnportableObject(ValueError):
    """An object a task needs cannot reach a worker process (it does not pickle, or the worker cannot
    import its class)."""


class Parcel(Protocol):
    """What a task needs, as it travels to the worker: :meth:`open` there gives the object."""

    def open(self) -> Any: ...


@dataclass(frozen=True)
class _Held:
    """The object itself: a task that runs in this process needs no pickling."""

    value: Any

    def open(self) -> Any:
        return self.value


@dataclass(frozen=True)
class _Pickled:
    """The object pickled once in this process; :meth:`open` unpickles it in the worker."""

    data: bytes
    what: str

    def open(self) -> Any:
        try:
            return pickle.loads(self.data)
        except Exception as exc:
            raise UnportableObject(_unportable(self.what, exc, where="a worker process could not unpickle it")) from None


def _unportable(what: str, exc: Exception, *, where: str) -> str:
    return (
        f"{what} cannot run in worker processes: {where} ({type(exc).__name__}: {exc}). Define its class at the "
        "top level of a module the workers can import and register it there (an entry point in the group "
        "dpverify.implementations, or register_implementation in that module, imported by your conftest), or "
        "run the audit in-process (the default; drop --dp-audit-executor / --dp-audit-workers)"
    )


def chunks(count: int, *, parallelism: int) -> list[range]:
    """``range(count)`` cut into contiguous, near-equal tasks: ``TASKS_PER_WORKER`` per unit of
    ``parallelism`` and at least ``MIN_TASKS``, never more than ``count``."""
    count = check_int("count", count, low=0)
    tasks = min(count, max(MIN_TASKS, TASKS_PER_WORKER * check_int("parallelism", parallelism, low=1)))
    bounds = [round(i * count / tasks) for i in range(tasks + 1)] if tasks else [0]
    return [range(low, high) for low, high in zip(bounds, bounds[1:])]


def _torch_threads() -> int | None:
    """This process's torch thread count, for the workers to take (importing torch when installed: the
    trainers under audit import it anyway); ``None`` without torch."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.get_num_threads()


@dataclass(frozen=True)
class _Pinned:
    """``function`` run with torch's thread count set to ``torch_threads`` first (``None``: left alone)."""

    function: Callable[[Any], Any]
    torch_threads: int | None

    def __call__(self, task: Any) -> Any:
        if self.torch_threads is not None:
            import torch

            if torch.get_num_threads() != self.torch_threads:
                torch.set_num_threads(self.torch_threads)
        return self.function(task)


class Executor(abc.ABC):
    """Runs tasks, here or in other processes, and gives their results in task order."""

    #: How many tasks run at once: what :func:`chunks` sizes the tasks by.
    parallelism: int = 1

    @abc.abstractmethod
    def map(self, function: Callable[[Any], Any], tasks: Iterable[Any], *, gpu: bool = False) -> Generator[Any, None, None]:
        """``function(task)`` for every task, yielded in task order as each is ready; ``function`` and the
        tasks must pickle for an executor with workers. ``gpu``: each task wants a GPU of its own (Ray
        schedules one per task; a pool's workers share the machine's). Closing the iterator early
        cancels the tasks not started; a task's exception is raised as it is reached."""

    def parcel(self, value: Any, *, what: str) -> Parcel:
        """``value`` ready to travel to this executor's workers; ``what`` names it in the error when it
        cannot (:class:`UnportableObject`)."""
        try:
            return _Pickled(pickle.dumps(value), what)
        except Exception as exc:
            raise UnportableObject(_unportable(what, exc, where="it does not pickle")) from None

    def shutdown(self) -> None:
        """Stop the workers this executor started."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()


class InProcessExecutor(Executor):
    """Every task in this process, one after the other, when it is reached (the default)."""

    def map(self, function: Callable[[Any], Any], tasks: Iterable[Any], *, gpu: bool = False) -> Generator[Any, None, None]:
        return (function(task) for task in tasks)

    def parcel(self, value: Any, *, what: str) -> Parcel:
        return _Held(value)


class ProcessPoolExecutor(Executor):
    """``workers`` local processes (:class:`concurrent.futures.ProcessPoolExecutor`), started when the
    first task is submitted and kept for the session.

    The workers are *spawned*, not forked: a fork copies a parent whose torch, TensorFlow or CUDA threads
    and locks are already running into a child where those threads do not exist (a deadlock, or CUDA's
    "cannot re-initialize in forked subprocess"); a spawned worker starts a clean interpreter, the same
    on Linux, macOS and Windows. On a GPU machine the workers share its GPUs."""

    def __init__(self, workers: int) -> None:
        import concurrent.futures
        import multiprocessing

        self.parallelism = _check_workers(workers)
        self._pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

    def map(self, function: Callable[[Any], Any], tasks: Iterable[Any], *, gpu: bool = False) -> Generator[Any, None, None]:
        pinned = _Pinned(function, _torch_threads())
        futures = [self._pool.submit(pinned, task) for task in tasks]
        return _in_order(futures, get=lambda future: future.result(), cancel=lambda future: future.cancel())

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor(Executor):
    """Tasks on a Ray cluster: the one at ``address`` (``"auto"``: the one ``ray start`` runs on this
    machine; ``"ray://host:10001"``: a remote one through Ray Client), else a local one of ``num_cpus``
    CPUs (default: every core) started on the first :meth:`map`. A task takes one CPU, and one GPU when
    the audit trains on CUDA. A Ray already initialised in this process is used as it is, and left
    running at :meth:`shutdown`. Ray pickles with cloudpickle; the workers need dpverify and the audited
    implementations' packages installed."""

    def __init__(self, *, address: str | None = None, num_cpus: int | None = None) -> None:
        _check_ray()
        if num_cpus is not None:
            check_int("num_cpus", num_cpus, low=1)
        self._address, self._num_cpus = address, num_cpus
        self._remote: Any = None
        self._started = False
        self._cpus = 1

    def _ray(self) -> Any:
        """Ray, connected (and the remote task made) on first use."""
        import ray

        if self._remote is None:
            if not ray.is_initialized():
                ray.init(address=self._address, num_cpus=self._num_cpus, include_dashboard=False, log_to_driver=False)
                self._started = True
            self._cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self._remote = ray.remote(_call)
        return ray

    @property
    def parallelism(self) -> int:  # type: ignore[override]
        """The cluster's CPUs (connecting to it on first use)."""
        self._ray()
        return self._cpus

    def map(self, function: Callable[[Any], Any], tasks: Iterable[Any], *, gpu: bool = False) -> Generator[Any, None, None]:
        ray = self._ray()
        remote = self._remote.options(num_gpus=1) if gpu else self._remote
        pinned = ray.put(_Pinned(function, _torch_threads()))
        references = [remote.remote(pinned, task) for task in tasks]

        def get(reference: Any) -> Any:
            try:
                return ray.get(reference)
            except ray.exceptions.RayTaskError as exc:  # the task's own exception, not Ray's wrapper
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None

        return _in_order(references, get=get, cancel=lambda reference: ray.cancel(reference))

    def shutdown(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
        self._remote, self._started = None, False


def _check_workers(workers: object) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return workers


def _check_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        raise ValueError("the ray executor needs Ray: pip install 'dpverify[ray]'")


def _call(function: Callable[[Any], Any], task: Any) -> Any:
    """Ray's remote function: ``function(task)``."""
    return function(task)


def _in_order(handles: list[Any], *, get: Callable[[Any], Any], cancel: Callable[[Any], Any]) -> Generator[Any, None, None]:
    """The results behind ``handles`` in order; on an early close or an error, the rest are cancelled."""
    done = 0
    try:
        for handle in handles:
            yield get(handle)
            done += 1
    finally:
        for handle in handles[done + 1 :]:
            cancel(handle)


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    """Which executor a session runs its audits' runs on, checked here: ``executor`` ``"inprocess"``,
    ``"pool"`` or ``"ray"`` (``None``: a pool when ``workers`` is given, else in-process); ``workers``
    the pool's processes (default: every core) or the CPUs of a local Ray cluster; ``ray_address`` an
    existing Ray cluster. Results do not depend on it: only where the runs happen does."""

    executor: str | None = None
    workers: int | None = None
    ray_address: str | None = None
    kind: str = field(init=False)

    def __post_init__(self) -> None:
        if self.executor is not None:
            check_choice("executor", self.executor, EXECUTORS)
        if self.workers is not None:
            _check_workers(self.workers)
        kind = self.executor or ("pool" if self.workers is not None else "inprocess")
        object.__setattr__(self, "kind", kind)
        if kind == "inprocess" and self.workers is not None:
            raise ValueError(f"workers={self.workers} needs executor 'pool' or 'ray'; the inprocess executor has none")
        if self.ray_address is not None and kind != "ray":
            raise ValueError(f"ray_address={self.ray_address!r} needs executor 'ray', got {kind!r}")
        if kind == "ray" and self.ray_address is not None and self.workers is not None:
            raise ValueError("workers sizes a local Ray cluster; a cluster at ray_address has its own size")
        if kind == "ray":
            _check_ray()

    def start(self) -> Executor:
        """The executor this spec names (a pool's processes and Ray start only when the first task comes)."""
        if self.kind == "pool":
            import os

            return ProcessPoolExecutor(self.workers or os.cpu_count() or 1)
        if self.kind == "ray":
            return RayExecutor(address=self.ray_address, num_cpus=self.workers)
        return InProcessExecutor()
