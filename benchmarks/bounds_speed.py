"""Time the statistics of an audit: the one-run bounds and the replace-one accountant.

Run from the repository root:

    .venvs/torch/bin/python benchmarks/bounds_speed.py

It prints a markdown table and writes it to benchmarks/results/bounds_speed.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import timeit
from pathlib import Path

import numpy as np

from dpverify.stats.accounting import add_remove_epsilon, replace_one_epsilon
from dpverify.stats.bounds import epsilon_lower_bound, fdp_epsilon_lower_bound, optimal_epsilon
from dpverify.stats.scoring import GuessRule, count_correct, guesses_from_scores, self_comparison_scores

DELTA = 1e-5
OUTPUT = Path(__file__).parent / "results" / "bounds_speed.md"
GRID = np.linspace(500, 10_000, 20).astype(int)


def typical_run(method: str, sigma: float = 1.0, steps: int = 500) -> dict:
    return {"noise_multiplier": sigma, "sampling_rate": 0.1, "steps": steps, "delta": DELTA, "method": method}


def score_and_guess(m: int = 100_000, num_classes: int = 100) -> int:
    """Self-comparison scores of m canaries and the guesses of the default 7-count grid, counted."""
    rule = GuessRule()
    scores = self_comparison_scores(LOG_PROBS, LABELS, COMPARISON)
    return sum(count_correct(guesses_from_scores(scores, int(k)), MEMBERSHIP) for k in rule.counts(m))


_rng = np.random.default_rng(0)
LOG_PROBS = _rng.standard_normal((100_000, 100))
LABELS = _rng.integers(0, 100, 100_000)
COMPARISON = (LABELS + _rng.integers(1, 100, 100_000)) % 100
MEMBERSHIP = _rng.choice(np.array([-1, 1]), 100_000)

CASES = [
    ("self-comparison scores and guesses of the 7-count grid, m = 10^5, C = 100", score_and_guess),
    ("epsilon_lower_bound, m = 10^4, 10^4 guesses, 9000 correct",
     lambda: epsilon_lower_bound(10_000, 10_000, 9_000, delta=DELTA)),
    ("epsilon_lower_bound, m = 10^4, 1000 guesses, 900 correct",
     lambda: epsilon_lower_bound(10_000, 1_000, 900, delta=DELTA)),
    ("epsilon_lower_bound, m = 10^4, grid of 20 guess counts (500..10^4, 90 % correct)",
     lambda: epsilon_lower_bound(10_000, GRID, (0.9 * GRID).astype(int), delta=DELTA)),
    ("optimal_epsilon, m = 10^4", lambda: optimal_epsilon(10_000, delta=DELTA)),
    ("fdp_epsilon_lower_bound, m = 10^4, 1000 guesses, 900 correct",
     lambda: fdp_epsilon_lower_bound(10_000, 1_000, 900, delta=DELTA)),
    ("replace_one_epsilon pld, σ = 1, q = 0.1, 500 steps",
     lambda: replace_one_epsilon(**typical_run("pld"))),
    ("replace_one_epsilon pld, σ = 0.5, q = 0.1, 1000 steps",
     lambda: replace_one_epsilon(**typical_run("pld", 0.5, 1000))),
    ("replace_one_epsilon pld, σ = 3, q = 0.1, 200 steps",
     lambda: replace_one_epsilon(**typical_run("pld", 3.0, 200))),
    ("replace_one_epsilon rdp, σ = 1, q = 0.1, 500 steps",
     lambda: replace_one_epsilon(**typical_run("rdp"))),
    ("replace_one_epsilon group, σ = 3, q = 0.1, 200 steps",
     lambda: replace_one_epsilon(**typical_run("group", 3.0, 200))),
    ("add_remove_epsilon pld, σ = 1, q = 0.1, 500 steps", lambda: add_remove_epsilon(**typical_run("pld"))),
]


def measure(call, budget: float = 1.0) -> tuple[float, float, int]:
    """(median, min) seconds per call over repeats that fill about ``budget`` seconds."""
    once = timeit.timeit(call, number=1)
    repeats = max(3, min(50, int(budget / max(once, 1e-6))))
    times = timeit.repeat(call, number=1, repeat=repeats)
    return statistics.median(times), min(times), repeats


def main() -> None:
    rows = []
    for name, call in CASES:
        median, best, repeats = measure(call)
        rows.append(f"| {name} | {1e3 * median:.1f} | {1e3 * best:.1f} | {repeats} |")
        print(rows[-1], flush=True)
    header = [
        "# Speed of the audit statistics",
        "",
        f"- device: 2-core CPU (no GPU); {platform.machine()}, {os.cpu_count()} logical cores",
        f"- date: {datetime.date.today().isoformat()}",
        f"- Python {platform.python_version()}, numpy {np.__version__}",
        "- command: `.venvs/torch/bin/python benchmarks/bounds_speed.py`",
        "",
        "| computation | median ms | min ms | repeats |",
        "|---|---:|---:|---:|",
    ]
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text("\n".join(header + rows) + "\n")
    print(f"wrote {OUTPUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
