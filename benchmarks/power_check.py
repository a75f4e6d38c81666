"""k* against simulation: the smallest noise deficit an audit states it catches with probability ≥ 0.8
(``dpverify.stats.power.one_run_deficit``), against the share of simulated audits that the audit's own
decision refutes at k* and at 0.85·k*. Each simulated audit draws m Gaussian-shift scores (members N(k·μ, 1),
the claimed run exactly μ-GDP at q = 1, 10 steps) and fresh secret bits, guesses with the default rule and
decides with both tests at the levels of a one-audit session.

    .venv/bin/python benchmarks/power_check.py --audits 40
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

from dpverify.audits.steps import _correct_counts
from dpverify.stats.bounds import _gdp_epsilon, steinke_refutes
from dpverify.stats.curves import ClaimedRun, combined_refutes, curve_refutes
from dpverify.stats.power import one_run_deficit
from dpverify.stats.scoring import GuessRule

RULE = GuessRule()
CONFIDENCES = (0.975, 0.975)  # a one-audit session at 95 %, split between the tests


def full_batch(epsilon: float, steps: int = 10) -> ClaimedRun:
    mu = optimize.brentq(lambda m: float(_gdp_epsilon(np.array(m), 1e-5)) - epsilon, 1e-3, 50)
    return ClaimedRun(noise_multiplier=math.sqrt(steps) / mu, steps=steps)


def caught(run: ClaimedRun, epsilon: float, sizes: tuple[int, ...], deficit: float, audits: int, rng) -> float:
    """Share of ``audits`` simulated audits of ``sizes`` pooled runs refuted by either test."""
    steinke, curve = (RULE.corrected_confidence(c) for c in CONFIDENCES)
    hits = 0
    for _ in range(audits):
        bits = [rng.choice(np.array([-1, 1], dtype=np.int8), size=m) for m in sizes]
        scores = [rng.standard_normal(m) + deficit * run.mu * (b == 1) for m, b in zip(sizes, bits)]
        every, all_bits = np.concatenate(scores), np.concatenate(bits)
        counts = RULE.counts(every.size)
        hit = bool(np.any(steinke_refutes(every.size, counts, _correct_counts(every, all_bits, counts, RULE.sides),
                                          epsilon=epsilon, delta=1e-5, confidence=steinke)))  # fmt: skip
        if not hit:
            run_counts = RULE.run_counts(sizes)
            correct = np.array([_correct_counts(s, b, row, RULE.sides) for s, b, row in zip(scores, bits, run_counts)])
            if len(sizes) == 1:
                hit = bool(np.any(curve_refutes(sizes[0], run_counts[0], correct[0], curve=run.curve(), confidence=curve)))
            else:
                hit = bool(np.any(combined_refutes(sizes, run_counts, correct, curve=run.curve(), confidence=curve)))
        hits += hit
    return hits / audits


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
            rates = [caught(run, epsilon, sizes, deficit * f, args.audits, rng) for f in (0.85, 1.0)]
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
