"""False alarms of the gate's many-run and design audits on correct implementations, over many seeds.

    python benchmarks/false_alarms_gate.py reference-dpsgd opacus-ghost opacus-hooks --seeds 20 --parallel 16 \
        --output false-alarms-gate.md

For each seed s, one process runs ``dpverify audit NAMES --seed s --worlds fixed_batch --every-update on
--layers applicable``: every audit the gate plans for a correct path (the one-run audit, the every-update
audit, the fixed-batch world named so that each implementation runs it, each layer design). Each audit runs at
``--level`` (its ``--confidence`` is 1 − level × the planned audits, which the run splits evenly) rather than
the gate's far smaller share, so that a level broken by a factor of a few shows in a few hundred audits.
``--parallel`` processes run side by side, one thread each.

The table counts, per audit kind, the audits refuted and gives the Clopper–Pearson 95 % interval of the
refutation rate: a correct implementation's audits are refuted at most at the level, so the interval's lower
end above the level would refute the audit's error control. ``undecided`` and errors are counted apart (they
are neither a pass nor a false alarm). Writes ``benchmarks/results/<output>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scipy.stats import beta

RESULTS = Path(__file__).resolve().parent / "results"


def clopper_pearson(refuted: int, audits: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval of a binomial rate: Beta(k, n − k + 1) and Beta(k + 1, n − k) quantiles."""
    tail = (1 - confidence) / 2
    low = 0.0 if refuted == 0 else float(beta.ppf(tail, refuted, audits - refuted + 1))
    high = 1.0 if refuted == audits else float(beta.ppf(1 - tail, refuted + 1, audits - refuted))
    return low, high


def audit_kind(entry: dict) -> str:
    """The gate's name of an audit: one-run, every-update, a world's or a layer design's."""
    architecture = entry["config"].get("architecture") or {}
    if "layer" in architecture:
        return f"layer {architecture['layer']}"
    if entry.get("design") == "two_world":
        return f"world {entry['config']['worlds']['world']}"
    return "every-update" if entry.get("observed") == "every update" else "one-run"


def audit_command(implementations: list[str], seed: int) -> list[str]:
    return [sys.executable, "-m", "dpverify", "audit", *implementations, "--seed", str(seed), "--profile", "quick",
            "--worlds", "fixed_batch", "--every-update", "on", "--layers", "applicable"]  # fmt: skip


def run_seed(seed: int, args: argparse.Namespace, folder: Path) -> tuple[int, list[dict], float]:
    report = folder / f"seed{seed}.json"
    command = audit_command(args.implementations, seed)
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    plan = subprocess.run([*command, "--plan"], check=True, capture_output=True, text=True, env=environment)
    planned = json.loads(plan.stdout)["planned_audits"]
    confidence = 1 - args.level * planned
    started = time.monotonic()
    subprocess.run([*command, "--confidence", str(confidence), "--device", args.device, "--report", str(report)],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment)  # fmt: skip
    seconds = time.monotonic() - started
    entries = json.loads(report.read_text())["audits"] if report.exists() else []
    return seed, entries, seconds


def table(entries: list[dict], level: float) -> list[str]:
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for entry in entries:
        by_kind[audit_kind(entry)].append(entry)
    lines = ["| audit | implementations | decided | refuted | undecided | errors | refuted rate, 95 % CI | seconds (median) |",
             "|---|---|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    rows = sorted(by_kind.items()) + [("all", entries)]
    for kind, group in rows:
        decided = [e for e in group if e["verdict"] in ("pass", "violation")]
        refuted = sum(e["verdict"] == "violation" for e in decided)
        undecided = sum(e["verdict"] == "undecided" for e in group)
        errors = sum(e["verdict"] == "error" for e in group)
        low, high = clopper_pearson(refuted, len(decided)) if decided else (float("nan"), float("nan"))
        names = ", ".join(sorted({e["implementation"] for e in group})) if kind != "all" else "all"
        seconds = sorted(e["seconds"] or 0.0 for e in group) or [float("nan")]
        lines.append(f"| {kind} | {names} | {len(decided)} | {refuted} | {undecided} | {errors} | "
                     f"{refuted / max(len(decided), 1):.3f} [{low:.3f}, {high:.3f}] | {seconds[len(seconds) // 2]:.1f} |")  # fmt: skip
    lines.append("")
    lines.append(f"Level of each audit: {level:g}. The error control holds where the interval's lower end is at "
                 f"or below it.")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("implementations", nargs="+", help="correct implementations (names or globs)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds 1000 … 1000 + seeds − 1")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=2, help="processes side by side")
    parser.add_argument("--level", type=float, default=0.02, help="each audit's level (false-alarm rate it allows)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--output", required=True, help="file name under benchmarks/results/")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    begun = time.monotonic()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda seed: run_seed(seed, args, Path(tmp)), seeds))
    entries = [entry for _, seed_entries, _ in runs for entry in seed_entries]
    missing = [seed for seed, seed_entries, _ in runs if not seed_entries]
    lines = [
        "# False alarms of the gate's audits on correct implementations",
        "",
        f"- date: {started}; {platform.machine()}, {os.cpu_count()} logical cores, device {args.device}, "
        f"Python {platform.python_version()}",
        f"- command: `python benchmarks/false_alarms_gate.py {' '.join(args.implementations)} --seeds {args.seeds} "
        f"--first-seed {args.first_seed} --parallel {args.parallel} --level {args.level} "
        f"--device {args.device} --output {args.output}`",
        f"- {len(entries)} audits in {len(runs)} seeds ({time.monotonic() - begun:.0f} s wall)"
        + (f"; seeds without a report: {missing}" if missing else ""),
        "",
        *table(entries, args.level),
    ]
    (RESULTS / args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
