"""Audits that run in another Python environment and join this session: families of DP libraries that
cannot share one environment (TF-Privacy 0.9 needs numpy < 2, JAX-Privacy 2.0 numpy 2) still make one
report, one table and one level.

The session's promise (:mod:`dpverify.session`) is a union bound over every counted audit, so before any
training each other environment is asked for its plan (``dpverify audit ... --plan``) and the audits of
the implementations it can run and this one cannot are counted into this session's level; then that
environment runs them (``--planned-audits N``: the same per-audit confidence, the same seed, hence the
same per-audit seeds) and its report's entries are folded into this session's results. An audit it owed
and did not report is an ``error`` entry, never silently missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from dpverify.results import audit_result
from dpverify.session import AuditSession
from dpverify.workers import JOB_VARIABLE

#: How the environments of this repository are made (scripts/setup.sh runs noxfile.py's sessions).
SETUP_HINT = "make the environments with `bash scripts/setup.sh`"


@dataclass(frozen=True)
class Environment:
    """Another Python environment: ``given`` as the user named it, ``python`` its interpreter."""

    given: str
    python: Path

    @classmethod
    def at(cls, given: str) -> Environment:
        """A virtual environment's directory (its ``bin/python``, ``Scripts/python.exe`` on Windows) or an
        interpreter's path; a path with neither is a ``ValueError`` naming it and the fix."""
        path = Path(given)
        candidates = [path] if not path.is_dir() else [path / "bin" / "python", path / "Scripts" / "python.exe"]
        python = next((candidate for candidate in candidates if candidate.is_file()), None)
        if python is None:
            raise ValueError(f"--env {given}: no Python at {' or '.join(map(str, candidates))}; {SETUP_HINT}")
        return cls(given=given, python=python)

    def dpverify(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``python -m dpverify ARGV`` there (its own packages, this working directory)."""
        return subprocess.run([str(self.python), "-m", "dpverify", *argv], **kwargs)


def this_environment() -> Environment:
    """This process's own Python: where the audits a run shares among its processes (``--jobs``) run."""
    return Environment(given="this environment", python=Path(sys.executable))


def share_jobs(jobs: int, audits: Sequence[int]) -> list[int]:
    """``jobs`` processes shared among environments in proportion to their planned ``audits`` (largest
    remainders), each at least one: the processes of a session share the machine's cores, so an environment
    with a fifth of the audits is given a fifth of them; each more process makes again what a process caches
    (traced steps, power simulations, accountant values). On the 2-core CPU the main job's 93 + 20 audits took
    684 s of CPU in 3 + 3 processes against 623 s in 2 + 2, and 2 + 1 ran within the machine's variation of
    2 + 2 (benchmarks/results/main-job-families.md)."""
    total = sum(audits)
    if total == 0 or jobs <= len(audits):
        return [1] * len(audits)
    quotas = [jobs * count / total for count in audits]
    shares = [max(1, int(quota)) for quota in quotas]
    while sum(shares) > jobs:  # the ones raised to one are paid for by the largest
        shares[shares.index(max(shares))] -= 1
    by_remainder = sorted(range(len(audits)), key=lambda i: (-(quotas[i] - int(quotas[i])), i))
    for index in by_remainder[: max(0, jobs - sum(shares))]:
        shares[index] += 1
    return shares


def families(names: Sequence[str]) -> dict[str, str]:
    """Each name's family: the shortest of ``names`` that it is or extends with ``-`` (a variant is named
    after its implementation: ``jax-privacy-bandmf-one-participation`` is of ``jax-privacy-bandmf``'s)."""
    return {name: min((head for head in names if name == head or name.startswith(f"{head}-")), key=len) for name in names}


def deal(
    names: Sequence[str], jobs: int, *, audits: Mapping[str, int] | None = None, together: Mapping[str, str | None] | None = None
) -> list[tuple[str, ...]]:
    """``names`` dealt into ``jobs`` hands, the empty ones dropped, each hand in the names' order, a family
    (:func:`families`) in one hand: an implementation and its variants share what a process makes once (a
    traced step, the privacy curves of the claim a variant keeps, an imported library path), so that one
    process makes it for all of them. Names with the same ``together`` key (their sampler: a world run once
    per sampler is planned by each process over its own hand) go to one hand too. With ``audits`` (each
    name's count of planned audits) the groups with the most audits go first, each to the hand with the
    fewest audits so far (the longest-first rule), so that no process is left running alone at the end;
    without, in turn. Ties go in the names' order."""
    weight = audits or {}
    group_of = {name: name for name in names}

    def root(name: str) -> str:
        while group_of[name] != name:
            name = group_of[name]
        return name

    first_with: dict[str, str] = {}
    for name, head in families(names).items():
        group_of[root(name)] = root(head)
        key = (together or {}).get(name)
        if key is not None:
            group_of[root(name)] = root(first_with.setdefault(key, name))
    members: dict[str, list[str]] = {}
    for name in names:
        members.setdefault(root(name), []).append(name)
    hands: list[list[str]] = [[] for _ in range(jobs)]
    loads = [0] * jobs
    ranked = sorted(enumerate(members.values()), key=lambda item: (-sum(weight.get(name, 1) for name in item[1]), item[0]))
    for rank, group in ranked:
        hand = min(range(jobs), key=lambda h: (loads[h], len(hands[h]))) if audits else rank % jobs
        hands[hand].extend(group)
        loads[hand] += sum(weight.get(name, 1) for name in group)
    order = {name: rank for rank, name in enumerate(names)}
    return [tuple(sorted(hand, key=order.__getitem__)) for hand in hands if hand]


@dataclass(frozen=True)
class Delegation:
    """The audits one environment runs for this session: ``planned`` are the entries of its ``--plan``
    for the implementations it runs (``names``)."""

    environment: Environment
    names: tuple[str, ...]
    planned: tuple[dict[str, Any], ...]

    @property
    def counted(self) -> int:
        """Its audits that take a share of the session's level."""
        return sum(entry["counted"] for entry in self.planned)


def plan_of(environment: Environment, argv: Sequence[str]) -> list[dict[str, Any]]:
    """The audits ``dpverify audit ARGV`` would make in ``environment``, from its ``--plan``; a run that
    cannot answer (no dpverify there, a setting it refuses) is a ``ValueError`` with its own words."""
    answer = environment.dpverify(["audit", *argv, "--plan"], capture_output=True, text=True)
    if answer.returncode != 0:
        said = answer.stderr.strip().splitlines()[-1:] or [f"exit status {answer.returncode}"]
        fix = SETUP_HINT if "No module named" in answer.stderr else "fix the setting it names"
        raise ValueError(f"--env {environment.given}: {environment.python} could not plan the audits: {said[0]}; {fix}")
    return json.loads(answer.stdout)["audits"]


def delegate(
    environments: Sequence[Environment], argv: Sequence[str], *, runnable_here: set[str]
) -> list[Delegation]:
    """For each environment in turn, the implementations it can run that neither this environment nor an
    earlier one can, with their planned audits."""
    taken = set(runnable_here)
    delegations = []
    for environment in environments:
        planned = plan_of(environment, argv)
        names = tuple(dict.fromkeys(e["implementation"] for e in planned if e["available"] and e["implementation"] not in taken))
        taken.update(names)
        if names:
            entries = tuple(entry for entry in planned if entry["implementation"] in names)
            delegations.append(Delegation(environment=environment, names=names, planned=entries))
    return delegations


@dataclass
class RunningDelegation:
    """A delegation whose environment is auditing now, alongside this one: its process, the report it
    writes and the log its progress goes to."""

    delegation: Delegation
    process: subprocess.Popen
    directory: tempfile.TemporaryDirectory

    @property
    def report(self) -> Path:
        return Path(self.directory.name) / "report.json"

    @property
    def log(self) -> Path:
        return Path(self.directory.name) / "progress.log"


def start_delegation(
    delegation: Delegation, argv: Sequence[str], *, session: AuditSession, job: int | None = None
) -> RunningDelegation:
    """Start the delegated audits in their environment, alongside this process's own: the families share
    the machine's cores instead of waiting for each other. Its progress goes to a log, shown when it ends.
    ``job``: its index among the processes of a ``--jobs`` run of this environment
    (:data:`~dpverify.workers.JOB_VARIABLE`)."""
    environment = delegation.environment
    print(
        f"dpverify: {len(delegation.planned)} audit(s) of {', '.join(delegation.names)} run in {environment.given} "
        f"({environment.python}) alongside; their progress follows when they end",
        file=sys.stderr,
    )
    directory = tempfile.TemporaryDirectory(prefix="dpverify-env-")
    report = Path(directory.name) / "report.json"
    command = [*delegation.names, *argv, "--planned-audits", str(session.planned_audits), "--report", str(report)]
    with open(Path(directory.name) / "progress.log", "wb") as log:
        process = subprocess.Popen(
            [str(environment.python), "-m", "dpverify", "audit", *command],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=None if job is None else {**os.environ, JOB_VARIABLE: str(job)},
        )
    return RunningDelegation(delegation=delegation, process=process, directory=directory)


def finish_delegation(running: RunningDelegation, *, session: AuditSession) -> None:
    """Wait for a started delegation, show its progress log, and add its report's entries to
    ``session.results`` (each naming the ``environment`` that ran it), an ``error`` entry for each audit it
    owed and did not report. A Ctrl-C reaches both processes: the other one finishes its report, which is
    folded in, then the interrupt goes on."""
    delegation, process = running.delegation, running.process
    environment = delegation.environment
    interrupted = False
    try:
        status = process.wait()
    except KeyboardInterrupt:
        interrupted = True
        status = process.wait()
    try:
        sys.stderr.write(running.log.read_text(encoding="utf-8", errors="replace"))
        entries, problem = _reported(running.report, status)
    finally:
        running.directory.cleanup()
    reported = {entry.get("nodeid") for entry in entries}
    missing = [planned for planned in delegation.planned if planned["nodeid"] not in reported]
    if missing and not interrupted:
        cause = f"the run in {environment.given} ended without this audit ({problem or f'exit status {status}'})"
        print(f"dpverify: error: {cause}; {len(missing)} audit(s) marked as errors", file=sys.stderr)
        entries += [errored_entry(planned, cause=cause, confidence=session.per_audit_confidence) for planned in missing]
    session.results.extend({**entry, "environment": environment.given} for entry in entries)
    if interrupted:
        raise KeyboardInterrupt


def _reported(report: Path, status: int) -> tuple[list[dict[str, Any]], str | None]:
    """The entries of the other run's report, and what went wrong when it has none."""
    try:
        return json.loads(report.read_text(encoding="utf-8"))["audits"], None
    except (OSError, ValueError, KeyError) as exc:
        return [], f"exit status {status}, no report: {type(exc).__name__}: {exc}"


def plan_entry(audit: Any, implementation: Any, config: Any, *, nodeid: str) -> dict[str, Any]:
    """One audit of a ``--plan``: what a session needs to count it, delegate it, and report it as an
    error should it never run (the fields every outcome of the audit shares)."""
    from dpverify.audits.verdict import result_fields

    reason = implementation.unavailable_reason()
    return {
        "nodeid": nodeid,
        "implementation": audit.implementation_name,
        "world": audit.world,
        "every_update": audit.every_update,
        "layer": audit.layer,
        "counted": audit.counted,
        "available": reason is None,
        "unavailable_reason": reason,
        "library": implementation.info.library,
        "library_version": implementation.library_version(),
        "fields": result_fields(implementation, config, config.audit_size),
    }


def errored_entry(planned: dict[str, Any], *, cause: str, confidence: float) -> dict[str, Any]:
    """A report entry with verdict ``error`` for a planned audit that did not run, at this session's level."""
    fields = {**planned["fields"], "confidence": confidence}
    result = audit_result(fields, verdict="error", error=f"{planned['implementation']}: {cause}", device="-", seconds=0.0)
    return {
        "nodeid": planned["nodeid"],
        **result.to_dict(),
        "counted": planned["counted"],
        "library": planned["library"],
        "library_version": planned["library_version"],
    }
