"""The release matrix's tables from release gates' reports (``bash scripts/release.sh PACKAGE==VERSION`` or
``nox -s release``): one table per library, a row per audit, a column per release, each cell the verdict
with ε_L (the larger of the (ε, δ) and the curve test's bound) over the claimed ε, k* and the known issue's
link; ``n/a`` with the reason where the release lacks the path.

    python benchmarks/release_matrix.py release-opacus-*.json >> benchmarks/results/release-matrix.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from dpverify.releases import parse_release
from dpverify.session import outcome_mark


def cell(audit: dict, issues: dict[str, str]) -> str:
    """``verdict mark ε_L=… k*=…`` and, for a known issue, its link."""
    if audit["verdict"] == "error":
        return f"error ! ({audit['error']})"
    bounds = [audit.get(name) for name in ("epsilon_lower_bound", "curve_epsilon_lower_bound")]
    bound = max((b for b in bounds if b is not None), default=None)
    power = audit.get("power") or {}
    deficit = power.get("smallest_deficit")
    if not power:
        k_star = "n/a"
    elif not power.get("deficit_stated", True):  # the design has no validated deficit model (the CLI's table says so too)
        k_star = "not stated"
    else:
        k_star = "none" if deficit is None else f"{deficit:.1f}"
    text = f"{audit['verdict']} {outcome_mark(audit)}".rstrip()
    if "claimed_epsilon" in audit.get("infinite", ()):
        claimed = "∞"
    else:  # no claim read: an audit that did not run (e.g. the every-update hand-over refused)
        claimed = "-" if audit["claimed_epsilon"] is None else f"{audit['claimed_epsilon']:.2f}"
    text += f" ε_L={'-' if bound is None else f'{bound:.2f}'}/{claimed} k*={k_star}"
    issue = audit.get("issue") or issues.get(audit["implementation"])  # a report before entries had "issue": the map
    if audit["expected"] == "known-issue" and issue:
        text += f" [{link_label(issue)}]({issue})"
    return text


def link_label(address: str) -> str:
    """``#571`` for an issue or pull request, the short hash for a commit, else the address' last part."""
    tail = address.rstrip("/").rsplit("/", 1)[-1]
    if tail.isdigit():
        return f"#{tail}"
    if "/commit/" in address:
        return tail[:7]
    return tail


def tables(reports: list[dict]) -> str:
    """Markdown: for each library, rows of audits, columns of releases in release order; an implementation a
    release lacks is ``n/a [k]`` on each of its rows, its reason k listed once under the table."""
    by_library: dict[str, list[dict]] = defaultdict(list)
    for report in reports:
        by_library[parse_release(report["release"]["spec"]).library.package].append(report)
    out = []
    for package, group in by_library.items():
        releases = [parse_release(r["release"]["spec"]) for r in group]
        order = sorted(range(len(group)), key=lambda i: releases[i].library.versions.index(releases[i].version))
        group = [group[i] for i in order]
        versions = [releases[i].version for i in order]
        rows: dict[str, dict[str, str]] = defaultdict(dict)
        implementation_of: dict[str, str] = {}
        for version, report in zip(versions, group):
            for audit in report["audits"]:
                row = audit["nodeid"].removeprefix("dpverify audit ")
                implementation_of[row] = audit["implementation"]
                rows[row][version] = cell(audit, report.get("issues", {}))
        reasons: list[str] = []
        for version, report in zip(versions, group):
            for skipped in report.get("not_applicable", []):
                name = skipped["implementation"]
                reason = skipped["reason"].removeprefix(f"{name} ")
                if reason not in reasons:
                    reasons.append(reason)
                if name not in implementation_of.values():  # no release ran it: one row of its name
                    implementation_of[name] = name
                for row in [row for row, owner in implementation_of.items() if owner == name]:
                    rows[row].setdefault(version, f"n/a [{reasons.index(reason) + 1}]")
        out.append(f"### {package}\n")
        out.append("| audit | " + " | ".join(versions) + " |")
        out.append("|---" * (len(versions) + 1) + "|")
        for name in sorted(rows):
            out.append(f"| {name} | " + " | ".join(rows[name].get(v, "not run") for v in versions) + " |")
        out.append("")
        out.extend(f"[{index}] n/a: {reason}" for index, reason in enumerate(reasons, start=1))
        out.append("")
    return "\n".join(out)


def main(paths: list[str]) -> int:
    reports = []
    for path in paths:
        with open(path, encoding="utf-8") as stream:
            reports.append(json.load(stream))
    print(tables(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
