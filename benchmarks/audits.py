"""Audit benchmarks: power, bug detection, false alarms and speed, written as markdown tables.

    .venv/bin/python benchmarks/audits.py power        # ε_L against claimed ε, beside the paper's table
    .venv/bin/python benchmarks/audits.py detection    # every buggy variant × claimed ε × seeds
    .venv/bin/python benchmarks/audits.py noise-deficit  # smallest noise deficit 1/k caught
    .venv/bin/python benchmarks/audits.py false-alarms # many audits of correct implementations
    .venv/bin/python benchmarks/audits.py speed        # seconds per audit and the auditor's share

Each writes ``benchmarks/results/<name>.md`` stating the device, the date and the command. Numbers here
are measurements, never test assertions. ``--seeds`` and ``--quick`` shrink a run.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Iterable

from scipy import stats

from dpverify.audit import resolve_device, run_audit
from dpverify.config import profile_config
from dpverify.registry import get_implementation, registered_implementations
from dpverify.results import AuditResult

RESULTS = Path(__file__).resolve().parent / "results"
EPSILONS = (1.0, 2.0, 4.0, 8.0, float("inf"))
#: The paper's tab:main_cv, orthogonal canaries with self-comparison (m = 2000) and Gaussian (m = 10⁴).
PAPER = {("orthogonal", 2000): {1.0: 1.089, 8.0: 3.059, float("inf"): 6.449}, ("gaussian", 10_000): {1.0: 0.771, 8.0: 3.780, float("inf"): 7.829}}


def _audit(name: str, *, seed: int, **overrides) -> AuditResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_audit(get_implementation(name), profile_config("quick", seed=seed, device="auto", **overrides))


def _header(title: str, command: str) -> list[str]:
    device = resolve_device("auto")
    cpu = f"{platform.machine()}, {__import__('os').cpu_count()} logical cores"
    return [
        f"# {title}",
        "",
        f"- device: {device} ({cpu}; a 2-core CPU without GPU unless it says cuda)",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{command}`",
        "- profile: quick unless a column says otherwise (m = d = h = 1000, C = 100, q = 1, 20 steps, lr 5, "
        "inclusion design, δ = 1e-5, 95 % confidence per audit, guess grid of 7 counts with Bonferroni)",
        "",
    ]


def _table(columns: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    columns = list(columns)
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "∞" if value == float("inf") else f"{value:.3f}"
    return str(value)


def _write(name: str, lines: list[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def power(args: argparse.Namespace) -> list[str]:
    """ε_L of a correct implementation (opacus-ghost) across claimed ε, canary mode, score and m."""
    rows = []
    scores = {"inclusion": ("mean_comparison", "self_comparison", "loss"), "pair": ("self_comparison", "loss")}
    grid = [(m, d, mode, score) for m in args.m for d in args.designs for mode in ("orthogonal", "gaussian") for score in scores[d]]
    for m, design, mode, score in grid:
        for epsilon in EPSILONS:
            results = [
                _audit("opacus-ghost", seed=s, m=m, dimension=m, mode=mode, score=score, epsilon=epsilon, design=design)
                for s in range(args.seeds)
            ]
            paper = PAPER.get((mode, m), {}).get(epsilon, "") if design == "pair" else ""
            rows.append(
                (m, design, mode, score, epsilon, _median(r.library_epsilon for r in results), _median(r.claimed_epsilon for r in results),
                 _median(r.epsilon_lower_bound for r in results), max(r.epsilon_lower_bound for r in results),
                 _median(r.fdp_epsilon_lower_bound for r in results), results[0].optimal_epsilon, paper,
                 _median(r.seconds for r in results))
            )
    columns = ("m", "design", "canaries", "score", "target ε", "Opacus ε (add/remove, RDP)", "claimed ε in the design's relation", "median ε_L", "max ε_L",
               "median f-DP ε", "ε_O", "paper ε_L", "s / audit")
    return _header("Auditing power: ε_L of a correct implementation", args.command) + [
        f"opacus-ghost, {args.seeds} seed(s) per row; the verdict uses ε_L (Steinke et al.); the f-DP column "
        "(Mahloujifar et al., μ-GDP family) is for comparison. The paper's numbers (pair design, q = 0.1, "
        "its own training set-up) stand beside our pair rows; the pair design's claim is the replace-one ε "
        "of the same run (dpverify's PLD), the inclusion design's the library's add/remove ε.",
        "",
    ] + _table(columns, rows)


def detection(args: argparse.Namespace) -> list[str]:
    """Fraction of seeds on which each buggy variant is caught, per claimed ε."""
    rows = []
    variants = [i for i in registered_implementations() if i.info.expected == "violation" and i.unavailable_reason() is None]
    for implementation in variants:
        if args.only and not any(p in implementation.info.name for p in args.only):
            continue
        for epsilon in (1.0, 2.0, 4.0):
            results = [_audit(implementation.info.name, seed=s, epsilon=epsilon) for s in range(args.seeds)]
            caught = sum(r.verdict == "violation" for r in results)
            rows.append((implementation.info.name, implementation.info.bug, implementation.info.detectability, epsilon,
                         f"{caught}/{len(results)}", _median(r.epsilon_lower_bound for r in results),
                         _median(r.seconds for r in results)))
    columns = ("variant", "bugs.md row", "expected", "claimed ε", "caught", "median ε_L", "s / audit")
    return _header("Bug detection: buggy variants caught", args.command) + _table(columns, rows)


def noise_deficit(args: argparse.Namespace) -> list[str]:
    """Noise scaled by 1/k with the claim kept: the smallest k caught in ≥ 80 % of seeds."""
    from dpverify.registry import register_implementation
    from dpverify_opacus import noise_scaled

    rows = []
    for epsilon in (1.0, 2.0):
        smallest = None
        for k in (1.25, 1.5, 2.0, 3.0, 5.0, 10.0):
            name = register_implementation(noise_scaled(k), replace=True).info.name
            results = [_audit(name, seed=s, epsilon=epsilon) for s in range(args.seeds)]
            rate = sum(r.verdict == "violation" for r in results) / len(results)
            if smallest is None and rate >= 0.8:
                smallest = k
            rows.append((epsilon, k, f"{rate:.0%}", _median(r.epsilon_lower_bound for r in results)))
        rows.append((epsilon, "smallest k caught ≥ 80 %", smallest or "none ≤ 10", ""))
    return _header("Smallest noise deficit caught", args.command) + _table(("claimed ε", "k", "caught", "median ε_L"), rows)


def false_alarms(args: argparse.Namespace) -> list[str]:
    """Many audits of correct implementations at 95 %: violations and their Clopper–Pearson interval."""
    rows, total_violations, total = [], 0, 0
    for name in args.implementations:
        results = [_audit(name, seed=1000 + s, epsilon=e) for s in range(args.seeds) for e in (1.0, 2.0, 4.0)]
        violations = sum(r.verdict == "violation" for r in results)
        total_violations, total = total_violations + violations, total + len(results)
        rows.append((name, len(results), violations, _median(r.epsilon_lower_bound for r in results)))
    interval = stats.binomtest(total_violations, total).proportion_ci(0.95, method="exact")
    rows.append(("all", total, total_violations, f"95 % CI of the rate [{interval.low:.3f}, {interval.high:.3f}]; level 0.05"))
    return _header("False alarms: audits of correct implementations", args.command) + _table(
        ("implementation", "audits", "violations", "median ε_L"), rows
    )


def speed(args: argparse.Namespace) -> list[str]:
    """Seconds per quick audit, the auditor's own share (canaries, scoring, bound), and growth with m and h."""
    rows = []
    for name in args.implementations:
        result = _audit(name, seed=0, epsilon=2.0)
        rows.append((name, "quick", result.device, result.seconds, result.auditor_seconds,
                     f"{result.auditor_seconds / result.seconds:.1%}"))
    for label, overrides in [(f"m = d = {m}", dict(m=m, dimension=m)) for m in (2000, 4000)] + [
        (f"h = {h}", dict(hidden_width=h)) for h in (500, 2000, 4000)
    ]:
        result = _audit("opacus-ghost", seed=0, epsilon=2.0, **overrides)
        rows.append(("opacus-ghost", label, result.device, result.seconds, result.auditor_seconds,
                     f"{result.auditor_seconds / result.seconds:.1%}"))
    return _header("Speed of one audit", args.command) + [
        "One run per row (seconds vary by ±30 % between runs on this shared CPU).", ""
    ] + _table(("implementation", "setting", "device", "s / audit", "auditor s", "auditor share"), rows)


def _median(values: Iterable[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=("power", "detection", "noise-deficit", "false-alarms", "speed"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--m", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--designs", nargs="+", choices=("inclusion", "pair"), default=["inclusion", "pair"])
    parser.add_argument("--only", nargs="*", default=[], help="variants whose name contains one of these")
    parser.add_argument(
        "--implementations", nargs="+", default=["opacus-ghost", "reference-dpsgd", "opacus-hooks", "tf-privacy-keras"]
    )
    args = parser.parse_args(argv)
    args.command = "python benchmarks/audits.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    name = args.benchmark.replace("-", "_")
    lines = globals()[name](args)
    lines += ["", f"Total wall time: {time.perf_counter() - started:.0f} s."]
    _write(args.benchmark, lines)


if __name__ == "__main__":
    main()
