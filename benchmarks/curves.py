"""Steinke bound against the one-run curve test with a perfect attacker, at full batch (q = 1).

Each canary's score is the likelihood-ratio statistic of the claimed mechanism, μ·b + N(0, 1) with
b ~ Bernoulli(½): no DP-SGD run gives an auditor more per
canary under a correct claim. μ is the GDP μ whose ε at δ = 1e-5 is the claim; a noise deficit k
(noise / k) scores with k·μ. Guesses: the lead's grid (fractions 0.01 … 1 of m, two-sided),
Bonferroni over its 7 counts at 95 %. Reported: the median ε_L over seeds of the Steinke bound
(max over the grid) and of the curve test (ε at δ of the weakest refuted GDP member), and how
often each catches the claim (ε_L above it, resp. the claimed curve refuted).

Run from the repository root:

    .venvs/torch/bin/python benchmarks/curves.py                 # writes benchmarks/results/curves.md
    .venvs/torch/bin/python benchmarks/curves.py combined-runs   # writes benchmarks/results/combined-runs.md

Each prints a markdown table and writes it.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy import optimize

from dpverify.stats.bounds import epsilon_lower_bound
from dpverify.stats.curves import ClaimedRun, combined_curve_test, curve_refutes, curve_test
from dpverify.stats.scoring import GuessRule

DELTA = 1e-5
CONFIDENCE = 0.95
SEEDS = 20
OUTPUT = Path(__file__).parent / "results" / "curves.md"
CLAIMS = (1.0, 2.0, 4.0, 8.0)
DEFICITS = (1.5, 2.0, 3.0)
SIZES = (1000, 10_000)
RULE = GuessRule()
LEVEL_CONFIDENCE = RULE.corrected_confidence(CONFIDENCE)


def mu_for(epsilon: float) -> float:
    """The GDP μ whose ε at DELTA is ``epsilon``: the full-batch claim with σ = 1/μ, T = 1."""
    return optimize.brentq(lambda mu: ClaimedRun(noise_multiplier=1 / mu, steps=1).epsilon(DELTA) - epsilon, 1e-3, 50)


def audit(
    mu_true: float, m: int, rng: np.random.Generator, *, confidence: float = LEVEL_CONFIDENCE
) -> tuple[np.ndarray, np.ndarray, float]:
    """One audit's guess counts, correct counts and Steinke ε_L (max over the grid, each count at
    ``confidence``)."""
    members, scores = _draw(mu_true, m, rng)
    counts = RULE.counts(m)
    correct = _correct(members, scores, counts)
    steinke = float(np.max(epsilon_lower_bound(m, counts, correct, delta=DELTA, confidence=confidence)))
    return counts, correct, steinke


def _draw(mu_true: float, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    members = rng.random(m) < 0.5
    return members, mu_true * members + rng.standard_normal(m)


def _correct(members: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Correct two-sided guesses per count: ⌈k/2⌉ top scores guessed in, ⌊k/2⌋ bottom guessed out."""
    ranked = members[np.argsort(-scores)]
    return np.array([ranked[: (k + 1) // 2].sum() + (~ranked[ranked.size - k // 2 :]).sum() for k in counts])


def perfect_attacker(
    epsilon: float, m: int, *, runs: int = 1, seeds: int, rng: np.random.Generator, deficit: float = 1.0
) -> tuple[float, float, float]:
    """What a perfect attacker reaches under dpverify's verdict rule: the audit's 95 % split evenly between
    the Steinke and the curve test, each split over the guess grid. Returns the median Steinke ε_L, the
    median curve-test ε over ``seeds`` audits of m canaries whose scores come from the μ-GDP mechanism with
    ε = ``epsilon`` at δ (noise divided by ``deficit``), and the fraction of those audits whose verdict
    refutes the claim. ε = ∞ scores separate perfectly. With ``runs`` > 1 the m canaries are split over
    that many independent runs, as a pooled audit: the Steinke bound on all of them, the curve test
    per run and combined (:func:`~dpverify.stats.curves.combined_curve_test`)."""
    from dpverify.audits.planning import split_confidence

    steinke_level, curve_level = (RULE.corrected_confidence(c) for c in split_confidence(CONFIDENCE))
    mu = mu_for(epsilon) if np.isfinite(epsilon) else 50.0
    claim = ClaimedRun(noise_multiplier=1 / mu, steps=1)
    sizes = np.array([part.size for part in np.array_split(np.arange(m), runs)])
    rows = []
    for _ in range(seeds):
        members, scores = _draw(deficit * mu, m, rng)
        counts = RULE.counts(m)
        correct = _correct(members, scores, counts)
        steinke = float(np.max(epsilon_lower_bound(m, counts, correct, delta=DELTA, confidence=steinke_level)))
        if not np.isfinite(epsilon):
            rows.append((steinke, float("nan"), False))
            continue
        if runs == 1:
            curve = curve_test(m, counts, correct, claim=claim, delta=DELTA, confidence=curve_level)
        else:
            guesses, ends = RULE.run_counts(sizes), np.cumsum(sizes)
            per_run = [_correct(members[e - n : e], scores[e - n : e], row) for n, e, row in zip(sizes, ends, guesses)]
            curve = combined_curve_test(sizes, guesses, np.array(per_run), claim=claim, delta=DELTA, confidence=curve_level)
        rows.append((steinke, curve.epsilon, steinke > epsilon or curve.refuted))
    steinke_values, curve_values, caught = zip(*rows)
    return float(np.median(steinke_values)), float(np.nanmedian(curve_values)) if np.isfinite(epsilon) else float("nan"), float(np.mean(caught))


def main() -> None:
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    curve_seconds: list[float] = []
    header = (
        "| m | claimed ε | μ | median ε_L Steinke | median ε_L curve | "
        + " | ".join(f"caught k={k} Steinke / curve" for k in DEFICITS)
        + " |"
    )
    lines = [header, "|" + "---:|" * (5 + len(DEFICITS))]
    for m in SIZES:
        for epsilon in CLAIMS:
            mu = mu_for(epsilon)
            claim = ClaimedRun(noise_multiplier=1 / mu, steps=1)
            null = []
            for _ in range(SEEDS):
                counts, correct, steinke = audit(mu, m, rng)
                tic = time.perf_counter()
                result = curve_test(m, counts, correct, claim=claim, delta=DELTA, confidence=LEVEL_CONFIDENCE)
                curve_seconds.append(time.perf_counter() - tic)
                null.append((steinke, result.epsilon))
            null = np.array(null)
            cells = []
            for k in DEFICITS:
                runs = [audit(k * mu, m, rng) for _ in range(SEEDS)]
                steinke_caught = np.mean([steinke > epsilon for _, _, steinke in runs])
                curve_caught = np.mean(
                    [np.any(curve_refutes(m, n, c, curve=claim.curve(), confidence=LEVEL_CONFIDENCE)) for n, c, _ in runs]
                )
                cells.append(f"{steinke_caught:.2f} / {curve_caught:.2f}")
            row = f"| {m} | {epsilon:g} | {mu:.3f} | {np.median(null[:, 0]):.2f} | {np.median(null[:, 1]):.2f} | "
            lines.append(row + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    seconds = time.perf_counter() - started
    write_report(
        OUTPUT,
        "One-run Steinke bound vs curve test, perfect attacker at full batch",
        "benchmarks/curves.py",
        [
            f"{SEEDS} seeds per cell; δ = {DELTA:g}, 95 % confidence, Bonferroni over the 7-count grid; "
            f"total {seconds:.0f} s; one curve_test (7 counts, with the family search and tail bounds) "
            f"median {np.median(curve_seconds):.2f} s",
            "scores μ·b + N(0, 1) (members b = 1); ε_L columns at the claim itself (k = 1); 'caught' = fraction "
            "of seeds where Steinke's ε_L exceeds the claimed ε / the claimed GDP curve is refuted, with scores "
            "from k·μ (noise divided by k)",
        ],
        lines,
    )


def write_report(path: Path, title: str, script: str, notes: list[str], lines: list[str]) -> None:
    """Write and print a markdown table under a header naming the machine, the date and the command."""
    report = "\n".join(
        [
            f"# {title}",
            "",
            f"- device: 2-core CPU shared with other sessions (no GPU); {platform.machine()}, {os.cpu_count()} logical "
            f"cores; load average at the end {os.getloadavg()[0]:.1f}",
            f"- date: {datetime.date.today().isoformat()}",
            f"- Python {sys.version.split()[0]}, numpy {np.__version__}",
            f"- command: `.venvs/torch/bin/python {script}`",
            *(f"- {note}" for note in notes),
            "",
            *lines,
            "",
        ]
    )
    path.write_text(report)
    print(report)


def combined_runs() -> None:
    """A perfect attacker's catch rate of a noise deficit under the verdict rule, pooled runs tested as one
    recursion over all their canaries against tested per run and combined (Fisher): at the quick and the
    standard profile's shapes, with the same scores for both rules (the same generator seed per row)."""
    started = time.perf_counter()
    shapes = ((4, 2500, (1.5, 2.0)), (8, 2500, (1.5, 2.0)), (100, 2500, (1.5,)))
    lines = ["| runs × canaries | claimed ε | k | caught, one recursion | caught, per run combined |", "|---|---:|---:|---:|---:|"]
    for runs, per_run, deficits in shapes:
        for epsilon in (1.0, 2.0, 4.0):
            for k in deficits:
                rates = [
                    perfect_attacker(epsilon, runs * per_run, runs=r, seeds=10, rng=np.random.default_rng(7), deficit=k)[2]
                    for r in (1, runs)
                ]
                lines.append(f"| {runs} × {per_run} | {epsilon:g} | {k:g} | {rates[0]:.0%} | {rates[1]:.0%} |")
                print(lines[-1], flush=True)
    write_report(
        OUTPUT.with_name("combined-runs.md"),
        "Pooled runs: one recursion over all canaries against each run tested and combined, perfect attacker",
        "benchmarks/curves.py combined-runs",
        [
            f"10 simulated audits per cell (the same scores for both rules); scores μ·b + N(0, 1) with μ the GDP μ "
            f"of the claimed ε at δ = {DELTA:g} times k; the verdict rule of dpverify (95 % split between the "
            f"Steinke and the curve test, Bonferroni over the 7-count grid); total {time.perf_counter() - started:.0f} s",
        ],
        lines,
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["combined-runs"]:
        combined_runs()
    else:
        main()
