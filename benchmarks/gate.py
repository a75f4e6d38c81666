"""The default gate's two-world audits over seeds: how often each world refutes each implementation, at the
per-audit confidence the main job gives it.

    python benchmarks/gate.py --seeds 5        # every registered classification implementation and a
                                               # third party's DP-SGD with each of its three normalisers

Writes ``benchmarks/results/two-world-gate.md``: per implementation and world, the violations in the
seeds, the (ε, δ) test's and the curve test's ε_L (min – max), the claim, and seconds per run. The audits'
seeds are the session's for seeds 0, 1, …, so seed s is what `dpverify audit --all --seed s` runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.third_party, a user's DP-SGD

from dpverify.audits import run_audit  # noqa: E402
from dpverify.config import two_world_config  # noqa: E402
from dpverify.gate import gate_audits  # noqa: E402
from dpverify.registry import registered_implementations  # noqa: E402
from dpverify.session import AuditSession  # noqa: E402
from tests.third_party import NORMALISERS, ThirdPartyDPSGD  # noqa: E402

from two_world import _range, _write, header, verdict_cells  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--implementations", nargs="*", help="names (default: every classification one, and a third party's)")
    parser.add_argument("--output", default="two-world-gate.md")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # as two_world.py: tiny models, a shared box

    registered = [i for i in registered_implementations() if i.info.task == "classification" and not i.unavailable_reason()]
    # The main job's plan: its per-audit confidence is what each of these audits runs at.
    planned = sum(a.counted for a in gate_audits([i.info for i in registered]))
    confidence = 1 - 0.05 / planned
    third_party = [ThirdPartyDPSGD(f"third-party-{n}", n) for n in NORMALISERS]
    chosen = [i for i in registered + third_party if not args.implementations or i.info.name in args.implementations]
    lines = header(
        "The default gate's two-world audits over seeds",
        args,
        [
            f"- each audit at confidence {confidence:.5f}: the main job's (`dpverify audit --all`, {planned} planned "
            "audits, session 0.95); seed s is the session seed, as `dpverify audit --all --seed s` runs it",
            "- settings: each world's `quick_setting` (`dpverify.canaries.worlds.WORLDS`); `third-party-*`: tests/third_party.py, "
            "a user's DP-SGD dividing by the designated normaliser, by q·N of its dataset, or by the realised batch",
        ],
    ) + [
        "| implementation | expected | world | violations | as expected | ε_L (min – max) | curve ε_L (min – max) | claimed ε | s/run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for implementation in chosen:
        info = implementation.info
        for audit in gate_audits([info]):
            if audit.world is None:
                continue
            results = []
            for seed in range(args.seeds):
                session = AuditSession(enabled=True, profile="quick", confidence=0.95, seed=seed, device="cpu",
                                       epsilon=2.0, implementations=(), report_path=None, plots_dir=None)  # fmt: skip
                config = two_world_config("quick", audit.world).with_overrides(
                    seed=session.audit_seed(audit.seed_key), confidence=confidence, device="cpu"
                )
                results.append(run_audit(implementation, config))
            curve = [r.curve_epsilon_lower_bound or 0.0 for r in results]
            row = (
                verdict_cells(info, audit.world, results) + f"{_range(curve)} | {results[0].claimed_epsilon:.3f} | "
                f"{np.mean([r.seconds / (2 * r.m) for r in results]):.4f} |"
            )
            print(row, flush=True)
            lines.append(row)
    _write(args.output, lines)


if __name__ == "__main__":
    main()
