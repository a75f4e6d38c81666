"""Seconds per quick audit of the slow implementations, before and after their speed-ups, beside opacus-ghost.

    .venvs/torch/bin/python benchmarks/tf_speed.py --seed 0 --repeats 2 --before-source /tmp/before

Every audit runs in a fresh process (``--child``), so imports, TensorFlow's tracing and environment
variables read once at start-up (``THP_MEM_ALLOC_ENABLE``) belong to that audit alone. A row may run the
code of another checkout (``--before-source``: a directory holding an older ``dpverify/`` and ``plugins/``,
e.g. ``git archive <commit> | tar -x -C /tmp/before``), put first on ``PYTHONPATH``. Seconds are the
audit's own (``AuditResult.seconds``: canaries, training, queries, scores, bound; imports excluded) and
the child's CPU seconds (user + system, imports included). The 1-minute load average is read before each
audit. Writes ``benchmarks/results/speed-tf.md``; numbers here are measurements, never test assertions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

#: (implementation, setting, use the --before-source checkout, environment overrides)
ROWS = (
    ("tf-privacy-keras", "before: stock GradientTape.jacobian", True, {}),
    ("tf-privacy-keras", "after: PerRecordJacobianTape", False, {}),
    ("tf-privacy-fast-clipping", "DPModel + fast-clipping registry", False, {}),
    ("opacus-hooks", "THP_MEM_ALLOC_ENABLE=0", False, {"THP_MEM_ALLOC_ENABLE": "0"}),
    ("opacus-hooks", "THP_MEM_ALLOC_ENABLE=1", False, {"THP_MEM_ALLOC_ENABLE": "1"}),
    ("opacus-ghost", "", False, {}),
)


def child(name: str, seed: int, profile: str, epsilon: float) -> None:
    """One audit in this process; prints its result as one JSON line."""
    from dpverify.audits import run_audit
    from dpverify.config import profile_config
    from dpverify.registry import get_implementation

    result = run_audit(get_implementation(name), profile_config(profile, seed=seed, device="cpu", epsilon=epsilon))
    print(json.dumps({"seconds": result.seconds, "verdict": result.verdict, "epsilon_lower_bound": result.epsilon_lower_bound}))


def audit_in_child(args: argparse.Namespace, name: str, seed: int, source: str | None, env: dict[str, str]) -> dict:
    environment = {**os.environ, **env}
    if source:
        environment["PYTHONPATH"] = os.pathsep.join([source, os.path.join(source, "plugins")])
    command = [sys.executable, __file__, "--child", name, "--seed", str(seed), "--profile", args.profile,
               "--epsilon", str(args.epsilon)]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{name} (seed {seed}) failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**result, "cpu": cpu, "load": load}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help="first seed; repetitions use seed, seed+1, ...")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--before-source", help="checkout whose dpverify/ and plugins/ the 'before' rows run")
    parser.add_argument("--only", nargs="*", default=[], help="rows whose implementation contains one of these")
    parser.add_argument("--output", default="speed-tf")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.seed, args.profile, args.epsilon)
        return
    command = "python benchmarks/tf_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()
    lines = []
    for name, setting, before, env in ROWS:
        if args.only and not any(part in name for part in args.only):
            continue
        if before and not args.before_source:
            continue
        runs = [audit_in_child(args, name, args.seed + r, args.before_source if before else None, env)
                for r in range(args.repeats)]
        for r, run in enumerate(runs):
            print(name, setting, args.seed + r, run, flush=True)
        def each(key: str, spec: str) -> str:
            return ", ".join(format(run[key], spec) if spec else run[key] for run in runs)

        median = statistics.median(run["seconds"] for run in runs)
        lines.append(
            f"| {name} | {setting} | {each('seconds', '.1f')} | {median:.1f} | {each('cpu', '.0f')} | "
            f"{each('load', '.1f')} | {each('epsilon_lower_bound', '.3f')} | {each('verdict', '')} |"
        )
    header = [
        "# Speed of one quick audit: TF-Privacy and opacus-hooks, before and after",
        "",
        f"- device: cpu ({platform.machine()}, {os.cpu_count()} logical cores, no GPU), shared with other jobs: "
        "the load average column is the 1-minute load read before each audit",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- profile: {args.profile} at claimed ε = {args.epsilon}, seeds {args.seed}..{args.seed + args.repeats - 1} "
        "(one per repetition, the same seeds in every row), one fresh process per audit",
        "",
        "| implementation | setting | s / audit (each seed) | median s | CPU s (each, imports included) | "
        "load avg | ε_L (each) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    footer = ["", f"Total wall time: {time.perf_counter() - started:.0f} s."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.output}.md").write_text("\n".join(header + lines + footer) + "\n")
    print("\n".join(header + lines + footer))


if __name__ == "__main__":
    main()
