"""The default gate's every-update audit of correlated noise over seeds, with the structure it scored by:
verdicts, curve p, ρ, the stated structure's fit on the untouched noise and CPU seconds, as a markdown table.

Each (implementation, seed) runs the gate's own call, ``run_audit(impl, every_update_config("quick", {},
correlated=info.correlated_noise))`` at that seed, in its own process (one at a time), and records one JSON per
audit in ``--reports`` (read, not repeated, when there). Each pooled run's
:func:`~dpverify.stats.correlated.structure_fit` p-value is recorded as the audit computes it: "estimated" counts
the runs whose untouched noise refuted the stated structure (p < ``STRUCTURE_FIT_LEVEL``), scored by the
structure it shows. Run each name in its family's environment:

    PYTHONPATH=$PWD:$PWD/plugins KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/structure_estimate.py \\
        --names jax-privacy-bandmf jax-privacy-bandmf-unbanded-noise --seeds 0 1 2 3 4
    PYTHONPATH=$PWD:$PWD/plugins OMP_NUM_THREADS=1 .venvs/torch/bin/python benchmarks/structure_estimate.py \\
        --names opacus-dpcr opacus-dpcr-tree opacus-dpcr-unrestarted-tree --seeds 0 1 2 3 4

``jax-privacy-dense-mf-short-noising`` (jax environment) is the dense path run past its noising matrix's rows,
the release's known issue.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path


def audit(name: str, seed: int, path: Path) -> None:
    """In this process: the gate's every-update audit of ``name`` at ``seed``, its numbers as JSON at ``path``."""
    from dpverify.audits import run_audit
    from dpverify.config import every_update_config
    from dpverify.registry import get_implementation
    from dpverify.stats import correlated

    fits: list[float] = []
    fit = correlated.structure_fit

    def recorded(*args, **kwargs):
        result = fit(*args, **kwargs)
        fits.append(result.p_value)
        return result

    correlated.structure_fit = recorded  # the audit's own call, recorded
    implementation = get_implementation(name)
    config = every_update_config("quick", {}, correlated=implementation.info.correlated_noise)
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = run_audit(implementation, dataclasses.replace(config, seed=seed))
    after = resource.getrusage(resource.RUSAGE_SELF)
    row = dict(
        expected=implementation.info.expected, verdict=result.verdict, p=result.curve_p_value,
        rho=None if result.power is None else result.power.signal_fraction, fits=fits,
        estimated=sum(p < correlated.STRUCTURE_FIT_LEVEL for p in fits), error=result.error,
        cpu=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    )  # fmt: skip
    path.write_text(json.dumps(row))


def row(name: str, seed: int, reports: Path) -> str:
    path = reports / f"{name}-{seed}.json"
    if not path.exists():
        # -P: not this folder first on the path, where benchmarks/opacus_dpcr.py would shadow the opacus_dpcr package
        command = [sys.executable, "-P", __file__, "--one", name, str(seed), "--reports", str(reports)]
        subprocess.run(command, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if not path.exists():
        return f"| {name} | {seed} | - | failed | - | - | - | - | - |"
    r = json.loads(path.read_text())
    if r["error"]:
        return f"| {name} | {seed} | {r['expected']} | {r['verdict']}: {r['error'].splitlines()[0]} | - | - | - | - | {r['cpu']:.0f} |"
    fits = r["fits"]
    rho = "-" if r["rho"] is None else f"{r['rho']:.2f}"
    return (
        f"| {name} | {seed} | {r['expected']} | {r['verdict']} | {r['p']:.2g} | {rho} | "
        f"{r['estimated']} of {len(fits)} | {min(fits):.2g} | {r['cpu']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", nargs="+", required=False, default=[])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--reports", type=Path, default=Path("/tmp/structure-estimate-reports"))
    parser.add_argument("--one", nargs=2, metavar=("NAME", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.reports.mkdir(parents=True, exist_ok=True)
    if args.one:
        name, seed = args.one
        audit(name, int(seed), args.reports / f"{name}-{seed}.json")
        return
    print("| implementation | seed | expected | verdict | curve p | ρ | runs scored by the estimate | least fit p | CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.names:
        for seed in args.seeds:
            print(row(name, seed, args.reports), flush=True)


if __name__ == "__main__":
    main()
