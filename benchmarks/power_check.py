"""k* against simulation: the smallest noise deficit an audit states it catches with probability ≥ 0.8
(``dpverify.stats.power.one_run_deficit``), against the share of simulated audits that the audit's own
decision refutes at k* and at 0.85·k* (``simulated_detection``: m Gaussian-shift scores, members N(k·μ, 1),
the claimed run exactly μ-GDP at q = 1, 10 steps, fresh secret bits, the default guess rule, both tests at
the levels of a one-audit session).

    .venvs/torch/bin/python benchmarks/power_check.py --audits 40
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
from scipy import optimize

from dpverify.stats.bounds import _gdp_epsilon
from dpverify.stats.curves import ClaimedRun
from dpverify.stats.power import one_run_deficit, simulated_detection
from dpverify.stats.scoring import GuessRule

RULE = GuessRule()
CONFIDENCES = (0.975, 0.975)  # a one-audit session at 95 %, split between the tests


def full_batch(epsilon: float, steps: int = 10) -> ClaimedRun:
    mu = optimize.brentq(lambda m: float(_gdp_epsilon(np.array(m), 1e-5)) - epsilon, 1e-3, 50)
    return ClaimedRun(noise_multiplier=math.sqrt(steps) / mu, steps=steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=40, help="simulated audits per cell")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "power-check.md"))
    args = parser.parse_args()
    started, rng = time.perf_counter(), np.random.default_rng(1)
    rows = []
    for epsilon in (1.0, 2.0, 4.0):
        run = full_batch(epsilon)
        for sizes in ((2500,) * 4, (1000,)):
            deficit = one_run_deficit(run, fraction=1.0, run_sizes=sizes, guess_rule=RULE, claimed_epsilon=epsilon,
                                      delta=1e-5, confidences=CONFIDENCES)  # fmt: skip
            rates = [
                simulated_detection(run, deficit=deficit * f, run_sizes=sizes, guess_rule=RULE, claimed_epsilon=epsilon,
                                    delta=1e-5, confidences=CONFIDENCES, audits=args.audits, rng=rng)
                for f in (0.85, 1.0)
            ]  # fmt: skip
            rows.append(f"| {epsilon:g} | {len(sizes)} × {sizes[0]} | {deficit:.3f} | {rates[1]:.0%} | {rates[0]:.0%} |")
            print(rows[-1], flush=True)
    lines = [
        "# k* against simulated audits",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU)",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `python benchmarks/power_check.py --audits {args.audits}`",
        "",
        __doc__.split("\n\n")[0].replace("\n", " "),
        "",
        "| claimed ε | runs × canaries | stated k* | caught at k* | caught at 0.85·k* |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Total wall time: {time.perf_counter() - started:.0f} s.",
    ]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
