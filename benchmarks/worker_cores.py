"""A JAX worker on one core against the same worker free to use every core (dpverify.workers.own_core).

Each row runs one of the JAX family's gate audits in a fresh process of .venvs/jax, alone on the machine,
once as a worker (``DPVERIFY_JOB=0``: confined to one core before JAX starts) and once not, and states the
process's CPU seconds (user + sys, from its rusage), its wall seconds and what the audit concluded, which
must be the same both ways (the seeds and the arithmetic do not depend on the core count).

    KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/worker_cores.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The audits: the every-update audit and two one-run audits (core and Keras paths).
AUDITS = (
    ("jax-privacy-core", ["--worlds", "none", "--layers", "none"]),
    ("jax-privacy-keras", ["--worlds", "none", "--layers", "none", "--every-update", "off"]),
)


def measured(name: str, options: list[str], *, confined: bool) -> tuple[float, float, list[dict]]:
    """CPU and wall seconds of ``dpverify audit NAME OPTIONS --profile quick --seed 0`` and its report's audits."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "jax", "PYTHONPATH": f"{ROOT}:{ROOT / 'plugins'}"}
    env.pop("DPVERIFY_JOB", None)
    if confined:
        env["DPVERIFY_JOB"] = "0"
    with tempfile.TemporaryDirectory() as directory:
        report = Path(directory) / "report.json"
        before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "dpverify", "audit", name, *options, "--profile", "quick", "--seed", "0", "--report", str(report)],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        wall, after = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_CHILDREN)
        audits = json.loads(report.read_text())["audits"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, audits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "worker-cores.md"))
    args = parser.parse_args()
    rows = []
    for name, options in AUDITS:
        for confined in (False, True):
            cpu, wall, audits = measured(name, options, confined=confined)
            outcome = "; ".join(
                f"{a['nodeid'].removeprefix('dpverify audit ')}: {a['verdict']}, curve ε_L {a['curve_epsilon_lower_bound']:.3f}"
                for a in audits
            )
            row = f"| {name} | {'one core' if confined else 'every core'} | {cpu:.1f} | {wall:.1f} | {outcome} |"
            print(row, flush=True)
            rows.append(row)
    lines = [
        "# A JAX worker on one core",
        "",
        f"- date: {datetime.date.today()}; device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU), "
        "nothing else running",
        "- command: `KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/worker_cores.py`",
        "- each row: `dpverify audit NAME --profile quick --seed 0` in a fresh process, `OMP_NUM_THREADS=1`; "
        "'one core' sets `DPVERIFY_JOB=0`, as a `--jobs` or pytest-xdist worker has it (dpverify/workers.py)",
        "",
        "| audit | cores | CPU s | wall s | outcome |",
        "|---|---|---:|---:|---|",
        *rows,
        "",
    ]
    Path(args.output).write_text("\n".join(lines))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
