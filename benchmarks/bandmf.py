"""``jax-privacy-bandmf`` and its variants through the default gate's one-run and every-update audits, over
seeds: verdicts, ρ, curve ε_L, p and CPU seconds, as a markdown table.

Each (implementation, seed) is one ``dpverify audit NAME --profile quick --seed S --worlds none`` (the one-run
audit and the every-update audit the gate gives these); its JSON report is written to ``--reports`` and a run
whose report is there already is read, not repeated. ``--every-update-only NAME`` runs the gate's own call of the
every-update audit alone (``run_audit(impl, every_update_config("quick", {}))`` at each seed), half the cost,
into ``NAME-SEED.every-update.json``; the table reads both.

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


def every_update_only(name: str, seed: int, reports: Path) -> None:
    """The gate's every-update audit of ``name`` at ``seed`` alone, its numbers and CPU seconds as JSON."""
    import dataclasses

    import dpverify_jaxprivacy
    from dpverify.audits import run_audit
    from dpverify.config import every_update_config

    implementation = next(i for i in dpverify_jaxprivacy.implementations() if i.info.name == name)
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = run_audit(implementation, dataclasses.replace(every_update_config("quick", {}), seed=seed))
    after = resource.getrusage(resource.RUSAGE_SELF)
    row = dict(
        verdict=result.verdict, expected=implementation.info.expected, claimed=result.curve_claimed_epsilon,
        curve=result.curve_epsilon_lower_bound, p=result.curve_p_value,
        rho=None if result.power is None else result.power.signal_fraction,
        cpu=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    )  # fmt: skip
    (reports / f"{name}-{seed}.every-update.json").write_text(json.dumps(row))


def rows(name: str, seed: int, reports: Path, *, read_only: bool) -> list[str]:
    """The table's rows of ``name`` at ``seed``: from its CLI report, its every-update audit from the
    every-update-only record where the report has none (a run stopped after its one-run audit)."""
    alone = reports / f"{name}-{seed}.every-update.json"
    out = []
    if alone.exists():
        r = json.loads(alone.read_text())
        out.append(_row(name, "every update", seed, r["expected"], r["verdict"], r["claimed"], r["curve"], r["p"], r["rho"], r["cpu"]))
    if not (reports / f"{name}-{seed}.json").exists() and (read_only or alone.exists()):
        return out
    data, cpu = report(name, seed, reports)
    if out and any(audit["observed"] == "every update" for audit in data["audits"]):
        out = []
    for audit in data["audits"]:
        if audit["design"] == "two_world":
            continue
        kind = "every update" if audit["observed"] == "every update" else "one run"
        rho = (audit.get("power") or {}).get("signal_fraction")
        out.append(_row(name, kind, seed, audit["expected"], audit["verdict"], audit["claimed_epsilon"],
                        audit["curve_epsilon_lower_bound"], audit["curve_p_value"], rho, cpu))  # fmt: skip
    return out


def _row(name, kind, seed, expected, verdict, claimed, curve, p, rho, cpu) -> str:
    return (
        f"| {name} | {kind} | {seed} | {expected} | {verdict} | {claimed:.3f} | {curve:.3f} | "
        f"{'-' if p is None else f'{p:.2g}'} | {'-' if rho is None else f'{rho:.2f}'} | {'-' if cpu is None else f'{cpu:.0f}'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--reports", type=Path, default=Path("/tmp/bandmf-reports"))
    parser.add_argument("--read-only", action="store_true", help="tabulate the reports there, run nothing")
    parser.add_argument("--every-update-only", metavar="NAME", help="run NAME's every-update audit alone at each seed")
    args = parser.parse_args()
    args.reports.mkdir(parents=True, exist_ok=True)
    if args.every_update_only:
        for seed in args.seeds:
            every_update_only(args.every_update_only, seed, args.reports)
        return
    print("| implementation | audit | seed | expected | verdict | claimed ε | curve ε_L | curve p | ρ | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in NAMES:
        for seed in args.seeds:
            for line in rows(name, seed, args.reports, read_only=args.read_only):
                print(line)


if __name__ == "__main__":
    main()
