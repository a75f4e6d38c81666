"""Every gate audit of some implementations over seeds, one row each, read from `dpverify audit --report`
files: the verdict, the claimed ε, the (ε, δ) and curve tests' lower bounds, the curve test's p, ρ (the share
of the claimed μ the audit's score reached) and the audit's seconds.

    PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/gate_seeds.py reports/*.json \
        --title "..." --command "..." --out benchmarks/results/NAME.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

from _tables import write_table


def audit_name(audit: dict) -> str:
    """The gate audit an entry of a report is: its design, ``@updates`` for the every-update audit, or the
    world of a two-world audit."""
    if audit["design"] == "two_world":
        return f"two_world:{audit['config']['worlds']['world']}"
    return audit["design"] + ("@updates" if audit.get("observed") == "every update" else "")


def report_rows(paths: list[str]) -> dict[tuple[str, str], dict[int, dict]]:
    """(implementation, audit) -> {seed: the report's entry}; a later file's audit of the same implementation,
    audit and seed replaces an earlier one's."""
    found: dict[tuple[str, str], dict[int, dict]] = {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        for audit in report["audits"]:
            found.setdefault((audit["implementation"], audit_name(audit)), {})[report["seed"]] = audit
    return found


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(paths: list[str]) -> list[str]:
    """The table's lines: one row per implementation, audit and seed."""
    lines = [
        "| implementation | audit | seed | verdict | claimed ε | ε_L | curve ε_L | curve p | ρ | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, audit), seeds in sorted(report_rows(paths).items()):
        for seed, entry in sorted(seeds.items()):
            rho = (entry.get("power") or {}).get("signal_fraction")
            p = entry.get("curve_p_value")
            lines.append(
                f"| `{name}` | {audit} | {seed} | {entry['verdict']} | {_number(entry.get('claimed_epsilon'))} | "
                f"{_number(entry.get('epsilon_lower_bound'))} | {_number(entry.get('curve_epsilon_lower_bound'))} | "
                f"{'-' if p is None else f'{p:.2g}'} | {_number(rho)} | {entry['seconds']:.0f} |"
            )
    return lines


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="dpverify audit --report files")
    parser.add_argument("--title", required=True)
    parser.add_argument("--command", required=True, help="the command that made the reports")
    parser.add_argument("--note", action="append", default=[], help="a paragraph after the table (repeatable)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lines = [
        f"# {args.title}",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{args.command}`, then `PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/gate_seeds.py "
        "REPORTS --out ...`",
        "- device: 2-core CPU (shared with other sessions)",
        "",
        *table(args.reports),
        "",
    ]
    for note in args.note:
        lines += [note, ""]
    write_table(args.out, lines, started=started)


if __name__ == "__main__":
    main()
