"""Null simulations through the real audits (tests/null_simulations.py): how often each audit refutes a
mechanism that is exactly its claim, and one whose noise is ``deficit`` times smaller than claimed, and
each null check of tests/test_null_simulations.py run once at the truth and at 1.25×.

    python benchmarks/null_simulations.py --audits 40                        # rates of every audit type
    python benchmarks/null_simulations.py --audits 40 --only two_world       # the five worlds only
    python benchmarks/null_simulations.py --audits 24 --first-seed 16 --only one_run --levels 0.2 --deficits 1.25
    python benchmarks/null_simulations.py --null-checks                      # the tests' null checks, once
    python benchmarks/null_simulations.py --subsampled 160000:2500:one:1.25 --audits 3  # q = 0.5: curve p-values

Prints markdown rows: per audit type, level and deficit the refuted count, its two-sided 95 %
Clopper–Pearson interval and the CPU seconds per audit; with ``--null-checks``, per simulation the tests'
audits (their seeds) at the truth and at 1.25×, the null check's one-sided 99 % lower end and whether it
fails; with ``--subsampled m:run:sides:k``, the every-update audit at q = 0.5 (tests/null_simulations.py's
``SUBSAMPLED_EVERY_UPDATE``) at m canaries in runs of ``run``, guessing on one side (the gate's guesses) or
two (the quick profile's), σ/k added: each audit's verdict and curve p-value.
benchmarks/results/null-simulations.md collects them with the commands that printed them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpverify.audits import run_audit  # noqa: E402
from tests.null_simulations import (  # noqa: E402
    DEFICIT,
    DEPARTURES,
    LEVEL,
    NULL_AUDITS,
    SIMULATIONS,
    SUBSAMPLED_EVERY_UPDATE,
    DiracDPSGD,
    every_update_config,
    clopper_pearson,
    level_exceeded,
    null_check_lower_end,
    null_check_refuted,
    without_power_step,
)


def selected(name: str, only: str | None) -> bool:
    return only is None or name == only or name.startswith(only + "/")


def rate_rows(args: argparse.Namespace) -> None:
    print("| audit | level | deficit k | seeds | refuted | rate | 95 % CP | CPU s / audit |\n|---|---|---|---|---|---|---|---|")
    seeds = range(args.first_seed, args.first_seed + args.audits)
    with without_power_step():
        for name, simulate in SIMULATIONS.items():
            if not selected(name, args.only):
                continue
            for level in args.levels:
                for deficit in args.deficits:
                    if level != LEVEL and deficit != 1.0:
                        continue  # a broken level matters at the truth; power is measured at the tests' level
                    clock = time.process_time()
                    refuted = sum(simulate(deficit=deficit, seed=seed, confidence=1 - min(level, 0.999)) for seed in seeds)
                    seconds = (time.process_time() - clock) / args.audits
                    low, high = clopper_pearson(refuted, args.audits, confidence=0.95)
                    print(f"| {name} | {level:g} | {deficit:g} | {seeds.start}–{seeds.stop - 1} | {refuted} / {args.audits} "
                          f"| {refuted / args.audits:.3f} | [{low:.3f}, {high:.3f}] | {seconds:.2f} |", flush=True)  # fmt: skip


def null_check_rows(args: argparse.Namespace) -> None:
    print(f"| audit | at the truth: refuted of {NULL_AUDITS}, lower end, null check | departure k | at k: refuted of "
          f"{NULL_AUDITS}, lower end, null check | CPU s |\n|---|---|---|---|---|")  # fmt: skip
    for name in SIMULATIONS:
        if not selected(name, args.only):
            continue
        clock = time.process_time()
        cells = []
        for deficit in (1.0, DEPARTURES[name]):
            refuted = null_check_refuted(name, deficit=deficit)
            verdict = "fails" if level_exceeded(refuted, NULL_AUDITS) else "passes"
            cells.append(f"{refuted}, {null_check_lower_end(refuted, NULL_AUDITS):.3f}, {verdict}")
        print(f"| {name} | {cells[0]} | {DEPARTURES[name]:g} | {cells[1]} | {time.process_time() - clock:.1f} |", flush=True)


def subsampled_rows(args: argparse.Namespace) -> None:
    print("| canaries | runs of | guesses | deficit k | seed | verdict | curve p |\n|---|---|---|---|---|---|---|")
    for spec in args.subsampled:
        m, run, sides, deficit = spec.split(":")
        design = dict(SUBSAMPLED_EVERY_UPDATE, m=int(m), pooled_runs=int(m) // int(run))
        if sides == "two":  # the quick profile's guesses
            del design["guesses"], design["sides"]
        for seed in range(args.first_seed, args.first_seed + args.audits):
            with without_power_step():
                config = every_update_config(seed=seed, confidence=1 - LEVEL, **design)
                result = run_audit(DiracDPSGD(noise_deficit=float(deficit)), config)
            print(f"| {m} | {run} | {sides} side{'s' * (sides == 'two')} | {deficit} | {seed} | {result.verdict} "
                  f"| {result.curve_p_value:.3g} |", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--audits", type=int, default=40, help="simulated audits per row")
    parser.add_argument("--first-seed", type=int, default=0, help="the first audit's seed (then one more each)")
    parser.add_argument("--only", default=None, help="a simulation to run, or a family of them (two_world)")
    parser.add_argument("--levels", type=float, nargs="+", default=[LEVEL, 4 * LEVEL], help="levels to run at")
    parser.add_argument("--deficits", type=float, nargs="+", default=[1.0, DEFICIT], help="deficits to run at")
    parser.add_argument("--null-checks", action="store_true", help="run the tests' null checks once instead")
    parser.add_argument("--subsampled", nargs="+", metavar="M:RUN:SIDES:K", help="q = 0.5 every-update audits' p-values instead")
    args = parser.parse_args()
    (null_check_rows if args.null_checks else subsampled_rows if args.subsampled else rate_rows)(args)


if __name__ == "__main__":
    main()
