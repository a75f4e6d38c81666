"""opacus-dpcr's paths over seeds, as ``dpverify audit <name> --profile quick --seed <s>`` audits them by default:
each gate audit's verdict, curve p and ρ, and the CPU seconds of each command.

    PYTHONPATH=$PWD:$PWD/plugins OMP_NUM_THREADS=1 .venvs/torch/bin/python benchmarks/opacus_dpcr.py --seeds 5

``--worlds none`` leaves out the two-world audits of the expected-private ``opacus-dpcr-tree`` (the sampler's and
normaliser's worlds, which its Opacus sampler shares with ``opacus-ghost``; about 5 CPU-min per seed on the
2-core CPU). Writes ``benchmarks/results/opacus-dpcr.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _tables import write_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "opacus-dpcr.md"
NAMES = ("opacus-dpcr", "opacus-dpcr-tree", "opacus-dpcr-unscaled-noise", "opacus-dpcr-unrestarted-tree")


def audit(name: str, seed: int, worlds: str) -> tuple[list[dict], float]:
    """The report's audits of ``dpverify audit name --profile quick --seed seed`` and its CPU seconds."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "dpverify.cli", "audit", name, "--profile", "quick", "--seed", str(seed),
                   "--worlds", worlds, "--report", str(report)]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(command, cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return json.loads(report.read_text())["audits"], cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--names", nargs="*", default=list(NAMES))
    parser.add_argument("--worlds", default="applicable")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for name in args.names:
        for seed in range(args.seeds):
            audits, cpu = audit(name, seed, args.worlds)
            for entry in audits:
                rho = (entry.get("power") or {}).get("signal_fraction")
                rows.append(
                    f"| {name} | {seed} | {entry.get('nodeid')} | {entry.get('expected')} | {entry.get('verdict')} "
                    f"| {entry.get('curve_p_value', float('nan')):.3g} | {'-' if rho is None else f'{rho:.2f}'} "
                    f"| {entry.get('claimed_epsilon', float('nan')):.3g} | {cpu:.0f} |"
                )
                print(rows[-1], flush=True)
    lines = [
        "# opacus-dpcr 1.0.0 audited by default",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `PYTHONPATH=$PWD:$PWD/plugins OMP_NUM_THREADS=1 .venvs/torch/bin/python benchmarks/opacus_dpcr.py "
        f"--seeds {args.seeds} --names {' '.join(args.names)}{'' if args.worlds == 'applicable' else ' --worlds ' + args.worlds}`: "
        "per name and seed, "
        "`dpverify audit <name> --profile quick --seed <s>`",
        "- device: 2-core CPU (shared with other jobs); CPU s: the whole command's user + system seconds",
        "",
        "| implementation | seed | audit | expected | verdict | curve p | ρ | claimed ε | CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    write_table(args.output, lines, started=started)


if __name__ == "__main__":
    main()
