"""k* against simulated DP-SGD: the smallest noise deficit a correct audit states it catches with probability
≥ 0.8 (``dpverify.stats.power``, through ``measure_power``: ρ's lower limit), against the share of fresh
audits that the audit's own decision refutes when the noise is divided by it. The scores are drawn from the
mechanism, not from k*'s model: a Dirac canary's score is its clipped gradient summed over the Binomial(T, q)
steps it is sampled in, plus the noise of every step (``tests.doubles.dirac_scores``); one run of m
canaries, the default guess grid, both tests at the levels of a one-audit session. The model's own k*
(from the true signal rather than its lower limit) is checked at 0.85 and 1 times itself, to show it is
not loose.

    .venvs/torch/bin/python benchmarks/power_check.py --audits 40
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _tables import write_table

from dpverify.stats.curves import ClaimedRun  # noqa: E402
from dpverify.stats.power import audit_refutes, gdp_mu, measure_power, one_run_deficit  # noqa: E402
from dpverify.stats.scoring import GuessRule  # noqa: E402
from tests.doubles import dirac_scores  # noqa: E402

CONFIDENCE = 0.95  # a one-audit session at 95 %, shared by the tests
#: (σ, q, T, m): σ for claimed ε 2, 2, 4 and 2 at δ 1e-5 (the settings the review of issue 31 measured).
SETTINGS = ((1.673, 0.05, 200, 2000), (2.249, 0.1, 100, 2000), (1.813, 0.2, 50, 2000), (6.306, 1.0, 10, 1000))


def deficit(run: ClaimedRun, m: int, fraction: float) -> float:
    return one_run_deficit(run, fraction=fraction, run_sizes=(m,), guess_rule=GuessRule(), claimed_epsilon=run.epsilon(1e-5),
                           delta=1e-5, confidence=CONFIDENCE)  # fmt: skip


def caught(run: ClaimedRun, m: int, k: float, audits: int, rng) -> float:
    epsilon, hits = run.epsilon(1e-5), 0
    for _ in range(audits):
        bits = rng.choice(np.array([-1, 1]), size=m)
        scores = dirac_scores(rng, bits, run=run, noise=run.noise_multiplier / k)
        hits += audit_refutes([scores], [bits], run, guess_rule=GuessRule(), claimed_epsilon=epsilon, delta=1e-5,
                              confidence=CONFIDENCE)  # fmt: skip
    return hits / audits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=40, help="simulated audits per cell")
    parser.add_argument("--stated", type=int, default=10, help="correct audits whose stated k* is taken (median)")
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "power-check.md"))
    args = parser.parse_args()
    started, rng, rows = time.perf_counter(), np.random.default_rng(1), []
    for sigma, q, steps, m in SETTINGS:
        run = ClaimedRun(noise_multiplier=sigma, sampling_rate=q, steps=steps)
        stated = []
        for _ in range(args.stated):
            bits = rng.choice(np.array([-1, 1]), size=m)
            power = measure_power(run, dirac_scores(rng, bits, run=run, noise=sigma), bits,
                                  smallest_deficit=lambda fraction: deficit(run, m, fraction))  # fmt: skip
            stated.append(power.smallest_deficit)
        k = statistics.median(stated)
        model = deficit(run, m, q * math.sqrt(steps) / sigma / gdp_mu(run))
        rates = [caught(run, m, f * model, args.audits, rng) for f in (0.85, 1.0)]
        rows.append(
            f"| {q:g} | {steps} | {run.epsilon(1e-5):.2f} | {m} | {k:.3f} ({min(stated):.2f}–{max(stated):.2f}) "
            f"| {caught(run, m, k, args.audits, rng):.0%} | {model:.3f} | {rates[1]:.0%} | {rates[0]:.0%} |"
        )
        print(rows[-1], flush=True)
    lines = [
        "# k* against simulated DP-SGD",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU)",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `python benchmarks/power_check.py --audits {args.audits} --stated {args.stated}`",
        "",
        " ".join(__doc__.split("\n\n")[0].split()),
        "",
        "| q | T | claimed ε | m | stated k* (median, range) | caught at stated k* | model k* (true signal) "
        "| caught at model k* | caught at 0.85 × model k* |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    write_table(args.output, lines, started=started)


if __name__ == "__main__":
    main()
