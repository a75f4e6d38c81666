"""Order statistics (Xiang et al. 2025) beside the curve test and the Steinke bound, perfect attacker.

Same audits as benchmarks/curves.py: per-canary scores μ·b + N(0, 1) with b ~ Bernoulli(½), μ the GDP
μ whose ε at δ = 1e-5 is the claim, the lead's 7-count two-sided guess grid with Bonferroni at 95 %,
and noise deficits k (scores from k·μ). All three tests see the same counts:

* Steinke: ε_L of Theorem 1 (max over the grid), caught when ε_L > claimed ε;
* curve: Mahloujifar–Melis–Chaudhuri's one-run f-DP test of the claimed μ-GDP curve (ε_L of the
  weakest refuted μ, max over the grid), caught when the claimed curve is refuted;
* order statistics: eq. 1 of Xiang et al. for m independent μ-Gaussian channels
  (``dpverify.stats.order_statistics``), the same outputs.

A last column runs the three on a mechanism that is exactly μ-GDP for every canary but gives all
canaries one shared privacy-loss level (see ``tests/test_order_statistics.py``): the share of audits
in which each test refutes that true claim, to compare with the 5 % level.

Run from the repository root:

    .venvs/torch/bin/python benchmarks/order_statistics.py

It prints a markdown table and writes it to benchmarks/results/order-statistics.md.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from scipy import special

# benchmarks/ is the script's directory
from curves import CLAIMS, DELTA, LEVEL_CONFIDENCE, RULE, SEEDS, audit, mu_for, write_report

from dpverify.stats.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound
from dpverify.stats.curves import GaussianCurve, curve_refutes
from dpverify.stats.order_statistics import product_channel_tail, product_channel_test

OUTPUT = Path(__file__).parent / "results" / "order-statistics.md"
SIZES = (1000, 10_000, 100_000)
DEFICITS = (1.5, 2.0)
SHARED_SEEDS = 50


def shared_loss_counts(mu: float, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Counts of one audit of the shared-loss mechanism: randomized response at one ε = |LLR| for all."""
    members = rng.random(m) < 0.5
    level = abs(mu * rng.standard_normal() - mu**2 / 2)
    answers = members ^ (rng.random(m) < special.expit(-level))
    ranked = members[np.argsort(-(np.where(answers, 1.0, -1.0) + rng.random(m)))]
    counts = RULE.counts(m)
    return counts, np.array([ranked[: (k + 1) // 2].sum() + (~ranked[m - k // 2 :]).sum() for k in counts])


def verdicts(mu: float, epsilon: float, m: int, counts: np.ndarray, correct: np.ndarray) -> tuple[bool, bool, bool]:
    """Whether Steinke, the curve test and order statistics refute the claim μ on these counts."""
    steinke = np.max(epsilon_lower_bound(m, counts, correct, delta=DELTA, confidence=LEVEL_CONFIDENCE)) > epsilon
    curve = np.any(curve_refutes(m, counts, correct, curve=GaussianCurve(mu=mu), confidence=LEVEL_CONFIDENCE))
    order = np.any(product_channel_tail(m, counts, correct, mu=mu) <= 1 - LEVEL_CONFIDENCE)
    return bool(steinke), bool(curve), bool(order)


def main() -> None:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    header = (
        "| m | claimed ε | μ | median ε_L Steinke / curve / order stat. | "
        + " | ".join(f"caught k={k} Steinke / curve / order stat." for k in DEFICITS)
        + " | true claim refuted, shared loss: Steinke / curve / order stat. |"
    )
    lines = [header, "|" + "---:|" * (5 + len(DEFICITS))]
    for m in SIZES:
        for epsilon in CLAIMS:
            mu = mu_for(epsilon)
            bounds = []
            for _ in range(SEEDS):
                counts, correct, steinke = audit(mu, m, rng)
                curve = np.max(fdp_epsilon_lower_bound(m, counts, correct, delta=DELTA, confidence=LEVEL_CONFIDENCE))
                order = product_channel_test(m, counts, correct, mu=mu, delta=DELTA, confidence=LEVEL_CONFIDENCE)
                bounds.append((steinke, curve, order.epsilon))
            cells = [" / ".join(f"{x:.2f}" for x in np.median(bounds, axis=0))]
            for k in DEFICITS:
                caught = [verdicts(mu, epsilon, m, *audit(k * mu, m, rng)[:2]) for _ in range(SEEDS)]
                cells.append(" / ".join(f"{x:.2f}" for x in np.mean(caught, axis=0)))
            shared = [verdicts(mu, epsilon, m, *shared_loss_counts(mu, m, rng)) for _ in range(SHARED_SEEDS)]
            cells.append(" / ".join(f"{x:.2f}" for x in np.mean(shared, axis=0)))
            lines.append(f"| {m} | {epsilon:g} | {mu:.3f} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    seconds = time.perf_counter() - started
    write_report(
        OUTPUT,
        "Order statistics (Xiang et al. 2025) vs curve test vs Steinke bound, perfect attacker at full batch",
        "benchmarks/order_statistics.py",
        [
            f"{SEEDS} seeds per cell ({SHARED_SEEDS} for the shared-loss column); δ = {DELTA:g}, 95 % confidence, "
            f"Bonferroni over the 7-count grid; total {seconds:.0f} s, one process",
            "scores μ·b + N(0, 1) (members b = 1), independent across canaries; ε_L at the claim itself (k = 1); "
            "'caught' = fraction of seeds where Steinke's ε_L exceeds the claimed ε / the claimed GDP curve is "
            "refuted by the curve test / by order statistics, with scores from k·μ (noise divided by k)",
            "last column: the mechanism of `tests/test_order_statistics.py`, exactly μ-GDP for every canary, "
            "whose canaries share one privacy-loss level: the fraction of audits in which each test refutes this "
            "*true* claim, to compare with the 5 % level",
        ],
        lines,
    )


if __name__ == "__main__":
    main()
