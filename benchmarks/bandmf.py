"""``jax-privacy-bandmf`` and its variants through the default gate's one-run and every-update audits, over
seeds: verdicts, ρ, curve ε_L, p and CPU seconds, as a markdown table.

Each (implementation, seed) is one ``dpverify audit NAME --profile quick --seed S --worlds none`` (the one-run
audit and the every-update audit the gate gives these); its JSON report is written to ``--reports`` and a run
whose report is there already is read, not repeated.

    PYTHONPATH=$PWD:$PWD/plugins KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/bandmf.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

NAMES = (
    "jax-privacy-bandmf",
    "jax-privacy-bandmf-one-participation",
    "jax-privacy-bandmf-poisson-everywhere",
    "jax-privacy-bandmf-unbanded-noise",
)


def report(name: str, seed: int, reports: Path) -> tuple[dict, float | None]:
    """The report of ``name`` at ``seed`` and the CPU seconds its run took (None when it was read)."""
    path = reports / f"{name}-{seed}.json"
    if path.exists():
        cpu = reports / f"{name}-{seed}.cpu"
        return json.loads(path.read_text()), float(cpu.read_text()) if cpu.exists() else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-m", "dpverify", "audit", name, "--profile", "quick", "--seed", str(seed), "--worlds", "none",
               "--report", str(path)]  # fmt: skip
    subprocess.run(command, check=False, env={**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": "jax"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    (reports / f"{name}-{seed}.cpu").write_text(f"{cpu:.1f}")
    return json.loads(path.read_text()), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--reports", type=Path, default=Path("/tmp/bandmf-reports"))
    parser.add_argument("--read-only", action="store_true", help="tabulate the reports there, run nothing")
    args = parser.parse_args()
    args.reports.mkdir(parents=True, exist_ok=True)
    print("| implementation | audit | seed | expected | verdict | claimed ε | curve ε_L | curve p | ρ | CPU s (both audits) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in NAMES:
        for seed in args.seeds:
            if args.read_only and not (args.reports / f"{name}-{seed}.json").exists():
                continue
            data, cpu = report(name, seed, args.reports)
            for audit in data["audits"]:
                if audit["design"] == "two_world":
                    continue
                kind = "every update" if audit["observed"] == "every update" else "one run"
                rho = (audit.get("power") or {}).get("signal_fraction")
                p = audit["curve_p_value"]
                print(
                    f"| {name} | {kind} | {seed} | {audit['expected']} | {audit['verdict']} | {audit['claimed_epsilon']:.3f} | "
                    f"{audit['curve_epsilon_lower_bound']:.3f} | {'-' if p is None else f'{p:.2g}'} | "
                    f"{'-' if rho is None else f'{rho:.2f}'} | {'-' if cpu is None else f'{cpu:.0f}'} |"
                )


if __name__ == "__main__":
    main()
