"""How long a pytest-xdist run of two workers takes for an order of its items, by simulating xdist 3.8's
schedulers (``load``: chunks dealt in collection order, refilled when a worker runs low; ``worksteal``:
halves, then an idle worker takes half of the other's queue; ``loadfile``: each file whole) on measured
item durations. Used to choose the order of scripts/test.sh's JAX run (benchmarks/results/ci-test-time.md).

    .venvs/jax/bin/pytest --collect-only -q --dp-audit ... FILES dp-audit | grep :: > items.txt
    python benchmarks/xdist_order.py items.txt --durations LOG ... --report ci-dp-audit-report-jax.json \\
        --scale 3.3 --first tests/test_jax_privacy_bandmf.py tests/test_dense_mf.py

``--durations`` reads ``pytest --durations=0`` logs (setup + call + teardown per item, divided by
``--scale``: those logs' wall over an unloaded run's), ``--report`` a dp-audit report's audit seconds
(unscaled); an item in neither takes ``--default`` seconds.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import deque


def load(durations: list[float], workers: int = 2) -> list[float]:
    """Each worker's busy time under ``--dist load`` (xdist.scheduler.load: an initial chunk of a quarter
    of each worker's share, then refills of up to half of the pending share when a worker holds fewer
    than a quarter, not after a test of 0.1 s or more while it still holds two)."""
    pending, queues = deque(range(len(durations))), [deque() for _ in range(workers)]
    for queue in queues:
        for _ in range(max(len(durations) // workers // 4, 2)):
            if pending:
                queue.append(pending.popleft())

    def refill(queue: deque, last: float) -> None:
        if not pending:
            return
        low, high = max(2, len(pending) // workers // 4), max(2, len(pending) // workers // 2)
        if len(queue) < low and not (last >= 0.1 and len(queue) >= 2):
            for _ in range(high - len(queue)):
                if pending:
                    queue.append(pending.popleft())

    return _run(durations, queues, refill)


def worksteal(durations: list[float], workers: int = 2, min_pending: int = 2) -> list[float]:
    """Each worker's busy time under ``--dist worksteal`` (xdist.scheduler.worksteal)."""
    share = len(durations) // workers
    queues = [deque(range(k * share, len(durations) if k == workers - 1 else (k + 1) * share)) for k in range(workers)]

    def steal(queue: deque, last: float) -> None:
        if len(queue) < min_pending:
            victim = max(queues, key=len)
            for item in reversed([victim.pop() for _ in range(min(len(victim) // 2, max(0, len(victim) - min_pending)))]):
                queue.append(item)

    return _run(durations, queues, steal)


def _run(durations: list[float], queues: list[deque], after_each) -> list[float]:
    clock = [0.0] * len(queues)
    ends = [clock[k] + durations[q[0]] if q else None for k, q in enumerate(queues)]
    while any(end is not None for end in ends):
        worker = min((end, k) for k, end in enumerate(ends) if end is not None)[1]
        clock[worker] = ends[worker]
        after_each(queues[worker], durations[queues[worker].popleft()])
        ends[worker] = clock[worker] + durations[queues[worker][0]] if queues[worker] else None
    return clock


def loadfile(durations: list[float], items: list[str], workers: int = 2) -> list[float]:
    """Each worker's busy time under ``--dist loadfile``: each file (the dp-audit module too) whole, to the
    worker that is free first."""
    files: dict[str, float] = {}
    for item, seconds in zip(items, durations):
        files[item.split("::")[0]] = files.get(item.split("::")[0], 0.0) + seconds
    clock = [0.0] * workers
    for seconds in files.values():
        clock[clock.index(min(clock))] += seconds
    return clock


def measured(args: argparse.Namespace) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for path in args.durations:
        for line in open(path):
            match = re.match(r"([0-9.]+)s (?:call|setup|teardown)\s+(\S+)", line)
            if match:
                seconds[match[2]] = seconds.get(match[2], 0.0) + float(match[1]) / args.scale
    for path in args.report:
        for audit in json.load(open(path))["audits"]:
            seconds[audit["nodeid"]] = audit["seconds"] or 0.0
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", help="the run's node ids in collection order, one a line")
    parser.add_argument("--durations", nargs="*", default=[], help="pytest --durations=0 logs")
    parser.add_argument("--report", nargs="*", default=[], help="dp-audit reports (their audits' seconds)")
    parser.add_argument("--scale", type=float, default=1.0, help="the logs' wall time over an unloaded run's")
    parser.add_argument("--default", type=float, default=0.3, help="seconds of an item not measured")
    parser.add_argument("--first", nargs="*", default=[], help="files to move to the front, in this order")
    args = parser.parse_args()
    items = [line.strip() for line in open(args.items) if "::" in line]
    seconds = measured(args)
    print(f"{len(items)} items, {sum(item in seconds for item in items)} measured\n")
    print("| order | ideal (s) | load (s) | worksteal (s) | loadfile (s) |\n|---|---:|---:|---:|---:|")
    moved = [item for prefix in args.first for item in items if item.startswith(prefix + "::")]
    for name, order in (("as collected", items), (f"{', '.join(args.first)} first", moved + [i for i in items if i not in moved])):
        durations = [seconds.get(item, args.default) for item in order]
        print(f"| {name} | {sum(durations) / 2:.1f} | {max(load(durations)):.1f} | {max(worksteal(durations)):.1f} "
              f"| {max(loadfile(durations, order)):.1f} |")


if __name__ == "__main__":
    main()
