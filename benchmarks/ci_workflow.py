"""The README's CI step over seeds: how often it passes a correct trainer and fails its 2× noise bug.

    PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/ci_workflow.py --seeds 5

``tests/test_readme.py`` runs the pytest step of ``docs/ci/dp-audit.yml`` on the README's conftest over a
small plain-torch DP-SGD (``mylib``) at the workflow's own seed. This runs the same step, in the same project,
at seeds 0 … N − 1 (the step's ``--dp-audit-seed`` replaced), for the correct ``mylib`` and for the same
``mylib`` with its noise divided by 2, and tabulates per trainer how often the step exited non-zero and each
audit's verdicts. Writes ``benchmarks/results/ci-workflow.md``.
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
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_readme import FILES, HALF_NOISE, MYLIB, NOISE, _workflow_pytest_step  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRAINERS = {"correct": MYLIB, "noise divided by 2": MYLIB.replace(NOISE, HALF_NOISE)}


def _run_step(mylib: str, seed: int) -> tuple[int, list[dict], float]:
    """The workflow's pytest step at ``seed`` in a fresh project: its exit status, its audits, its seconds."""
    _pytest, *arguments = _workflow_pytest_step()
    arguments = [a for a in arguments if not a.startswith("--dp-audit-seed")] + [f"--dp-audit-seed={seed}"]
    (report,) = [a.split("=", 1)[1] for a in arguments if a.startswith("--dp-audit-report=")]
    with tempfile.TemporaryDirectory() as project:
        (Path(project) / "mylib.py").write_text(mylib)
        (Path(project) / "conftest.py").write_text(FILES["conftest.py"])
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *arguments],
            cwd=project, capture_output=True, text=True, env=os.environ.copy(),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        return done.returncode, json.loads((Path(project) / report).read_text())["audits"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# The README's CI step over seeds: a correct trainer and its 2× noise bug",
        "",
        f"{started}, {platform.machine()} CPU ({os.cpu_count()} cores, shared with other jobs), "
        f"`{Path(sys.executable).parent.parent.name}` environment; command: "
        f"`PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/ci_workflow.py --seeds {args.seeds}`. "
        "The pytest step of `docs/ci/dp-audit.yml` (quick profile, `--dp-audit-strict`) on the README's conftest "
        "over `mylib` of `tests/test_readme.py`, at seeds 0 … "
        f"{args.seeds - 1}; the workflow itself runs seed 0.",
        "",
        "| trainer | step failed | audit | verdicts | s / step |",
        "|---|---|---|---|---|",
    ]
    for trainer, mylib in TRAINERS.items():
        failed, seconds, verdicts = 0, [], defaultdict(Counter)
        for seed in range(args.seeds):
            status, audits, took = _run_step(mylib, seed)
            failed += status != 0
            seconds.append(took)
            for audit in audits:
                verdicts[audit["nodeid"]][audit["verdict"]] += 1
        for index, (nodeid, counts) in enumerate(sorted(verdicts.items())):
            head = f"{trainer} | {failed}/{args.seeds}" if index == 0 else " | "
            took = f"{min(seconds):.0f}–{max(seconds):.0f}" if index == 0 else ""
            shown = ", ".join(f"{verdict} {count}/{args.seeds}" for verdict, count in sorted(counts.items()))
            lines.append(f"| {head} | `{nodeid}` | {shown} | {took} |")
        print("\n".join(lines), flush=True)
    (RESULTS / "ci-workflow.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
