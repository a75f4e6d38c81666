"""The default gate of one family of implementations over seeds, run as the main job runs it.

    .venvs/jax/bin/python benchmarks/family_seeds.py 'jax-privacy-*' --seeds 5 --planned-audits 31 \
        --output jax-privacy-gate.md

For each seed s it runs ``dpverify audit PATTERN --seed s --planned-audits N --report ...`` in this
environment (``--planned-audits``: the main job's count of audits that can raise a false alarm, so every
audit has the main job's per-audit confidence), then tabulates per implementation and audit: the verdicts in
the seeds against the expectation, the range of ε_L of both tests, the claim, k*, and seconds per audit.
Writes ``benchmarks/results/<output>``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _span(values: list[float]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    low, high = min(present), max(present)
    return f"{low:.2f}" if low == high else f"{low:.2f}–{high:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pattern", help="implementation names or globs, as `dpverify audit` takes them")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--planned-audits", type=int, required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    entries = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            report = Path(tmp) / f"seed{seed}.json"
            command = [sys.executable, "-m", "dpverify", "audit", args.pattern, "--seed", str(seed),
                       "--planned-audits", str(args.planned_audits), "--report", str(report)]  # fmt: skip
            subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
            for result in json.loads(report.read_text())["audits"]:
                entries[(result["implementation"], result.get("design"))].append(result)
    lines = [
        f"# Default gate of `{args.pattern}` over {args.seeds} seeds",
        "",
        f"{started}, {platform.machine()} CPU, "
        f"`{Path(sys.executable).parent.parent.name}` environment; command: "
        f"`python benchmarks/family_seeds.py '{args.pattern}' --seeds {args.seeds} --planned-audits "
        f"{args.planned_audits} --output {args.output}`. Seed s is what `dpverify audit --all --seed s` runs.",
        "",
        "| implementation | audit | expected | verdicts | ε_L | curve ε_L | claimed ε | k* | s / audit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, design), results in sorted(entries.items()):
        verdicts = defaultdict(int)
        for result in results:
            verdicts[result["verdict"]] += 1
        expected = results[0]["expected"]
        power = [(r.get("power") or {}).get("smallest_deficit") for r in results]
        lines.append(
            f"| {name} | {design} | {expected} | "
            + ", ".join(f"{verdict} {count}/{len(results)}" for verdict, count in sorted(verdicts.items()))
            + f" | {_span([r.get('epsilon_lower_bound') for r in results])}"
            f" | {_span([r.get('curve_epsilon_lower_bound') for r in results])}"
            f" | {_span([r.get('claimed_epsilon') for r in results])}"
            f" | {_span(power)} | {_span([r.get('seconds') for r in results])} |"
        )
    (RESULTS / args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
