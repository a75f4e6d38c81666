"""Null simulations through the real audits (tests/null_simulations.py): how often each audit refutes a
mechanism that is exactly its claim, and one whose noise is 1.25 times smaller than claimed, at the null
tests' level 0.25 and at four times it (what a broken level would give).

    python benchmarks/null_simulations.py --audits 40                  # every audit type
    python benchmarks/null_simulations.py --audits 40 --only two_world # the five worlds only

Writes ``benchmarks/results/null-simulations.md`` (or ``--out``): per audit type and deficit, the refuted
count, its two-sided 95 % Clopper–Pearson interval and the seconds per audit; the tests' sizes and
thresholds in tests/test_null_simulations.py are derived from it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.null_simulations import (  # noqa: E402
    DEFICIT,
    LEVEL,
    SIMULATIONS,
    clopper_pearson,
    without_power_step,
)

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--audits", type=int, default=40, help="simulated audits per row")
    parser.add_argument("--only", default=None, help="a prefix of the simulations to run (e.g. two_world)")
    parser.add_argument("--levels", type=float, nargs="+", default=[LEVEL, 4 * LEVEL], help="levels to run at")
    parser.add_argument("--out", type=Path, default=RESULTS / "null-simulations.md")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = []
    with without_power_step():
        for name, simulate in SIMULATIONS.items():
            if args.only and not name.startswith(args.only):
                continue
            for level in args.levels:
                for deficit in (1.0, DEFICIT):
                    if level != LEVEL and deficit != 1.0:
                        continue  # a broken level matters at the truth; power is measured at the tests' level
                    clock = time.process_time()
                    refuted = sum(simulate(deficit=deficit, seed=seed, confidence=1 - min(level, 0.999)) for seed in range(args.audits))
                    seconds = (time.process_time() - clock) / args.audits
                    low, high = clopper_pearson(refuted, args.audits, confidence=0.95)
                    rows.append(f"| {name} | {level:g} | {deficit:g} | {refuted} / {args.audits} | {refuted / args.audits:.3f} "
                                f"| [{low:.3f}, {high:.3f}] | {seconds:.2f} |")  # fmt: skip
                    print(rows[-1], flush=True)
    command = "python benchmarks/null_simulations.py " + " ".join(sys.argv[1:])
    lines = [
        "# Null simulations through the real audits",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC; device: cpu ({platform.machine()}, {os.cpu_count()} logical cores shared "
        f"with other sessions; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end)",
        f"- command: `{command}` (seeds 0 … audits − 1; the power step after the verdict skipped: it can only turn a "
        "pass into undecided, never make or unmake a violation)",
        "- mechanisms and settings: tests/null_simulations.py (`one_run`: run_audit's Dirac audit of the claimed "
        "Gaussian mechanism, claimed ε 6, q = 1, 160 000 canaries in 64 runs; `every_update`: run_audit's every-update "
        "audit of DP-SGD of softmax regression on Dirac records handing over its updates, q = 1, 2 steps, σ 1.2, "
        "80 000 canaries in 32 runs; `two_world/<world>`: run_two_world_audit of the claimed Gaussian mechanism as "
        "the world's score reads it, μ = 2 (q = 1, σ 0.5, 1 step), 400 runs per world; the four worlds scored on "
        "the final model read the same draws by seed, so their rows coincide)",
        "- deficit k: the truth adds σ/k where the claim states σ (k = 1: the claim is the truth; k = 1.25: the "
        "claimed curve is 1.25 times too strong); level: 1 − the audit's confidence",
        "- interval: two-sided 95 % Clopper–Pearson of the refuted rate",
        "",
        "| audit | level | deficit k | refuted | rate | 95 % CP | CPU s / audit |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
