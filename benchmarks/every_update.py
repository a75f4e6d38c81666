"""Every-update audits of the fixed-batch world (docs/bugs.md class 9): reach, false alarms and time.

    python benchmarks/every_update.py ideal        # the ideal mechanisms: the shuffle gap and the null
    python benchmarks/every_update.py audits       # real trainers through the audit: findings, false alarms, time

``ideal`` simulates the sums a perfect adversary of the fixed-batch world reads (every released update along
the canary's direction, in clip norms above a full batch of markers): fixed-size shuffled batches (D: the
epoch's last batch one marker short; D′: the canary in a uniform batch) and the Poisson mechanism the
claim states, scored with the world's own statistic and decided by the audit's own looks and tests. It is
the ceiling the real audit is measured against. ``audits`` runs the gate's fixed-batch audit on real
trainers. Each writes its table to ``benchmarks/results/every-update-fixed-batch*.md``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.doubles, tests.third_party

from audits import device_line  # noqa: E402
from dpverify.audits.two_world import look_schedule, refuting_bound, run_two_world_audit  # noqa: E402
from dpverify.canaries.worlds import spike_log_likelihood_ratio  # noqa: E402
from dpverify.config import two_world_config  # noqa: E402
from dpverify.contract import MLPArchitecture  # noqa: E402
from dpverify.stats.curves import ClaimedRun  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DELTA = 1e-5
#: (σ, steps an epoch, epochs, the issue's derived lower bound on the shuffled ε at δ 1e-5 with every
#: update seen, or None), then the gate's own setting.
SETTINGS = ((1.0, 20, 10, 13.6), (1.0, 100, 10, 9.36), (0.8, 100, 1, 5.62), (0.8, 10, 2, None))


def ideal_sums(
    rng: np.random.Generator, runs: int, *, k: int, epochs: int, sigma: float, fixed: str | None, canary: bool, batch: int = 8
) -> np.ndarray:
    """``(runs, epochs, k)`` sums a perfect adversary reads, for k·B − 1 markers (and the canary): Poisson
    batches (``fixed`` None) or fixed ones whose remainder is a short last batch (``"short-last"``) or is
    dropped (``"drop-last"``: D's epoch is k full batches, D′'s the same with the canary in one)."""
    x = rng.normal(0.0, sigma, (runs, epochs, k))
    if fixed and canary:
        at = rng.integers(0, k, (runs, epochs, 1))
        np.put_along_axis(x, at, np.take_along_axis(x, at, axis=2) + 2.0, axis=2)
    elif fixed == "short-last":
        x[..., -1] += 1.0
    elif fixed:
        pass
    else:
        x += batch - rng.binomial(k * batch - 1, 1.0 / k, x.shape)
        if canary:
            x += rng.random(x.shape) < 1.0 / k
    return x


def sequential_refutes(d, dprime, *, curve, claimed: float, confidence: float) -> tuple[bool, int, float]:
    """The audit's looks on one pair of score samples: (refuted, runs per world taken, the GDP ε_L there)."""
    bound = None
    for runs, level in look_schedule(len(d), confidence):
        bound = refuting_bound(d[:runs], dprime[:runs], claimed_epsilon=claimed, curve=curve, delta=DELTA, confidence=level)
        if bound is not None:
            return True, runs, bound.gdp_epsilon_lower_bound
    return False, len(d), 0.0


def clopper_pearson(hits: int, n: int) -> str:
    low, high = stats.binomtest(hits, n).proportion_ci(0.95)
    return f"{hits}/{n} ({low:.3f}–{high:.3f})"


def ideal(args: argparse.Namespace) -> list[str]:
    lines = [
        "| σ | steps/epoch | epochs | Poisson claim ε (PLD) | issue's shuffle bound | runs/world | confidence | batches | fixed batches refuted | median runs taken | median GDP ε_L when refuted | Poisson refuted (false alarm) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sigma, k, epochs, bound in SETTINGS:
        claim = ClaimedRun(noise_multiplier=sigma, sampling_rate=1.0 / k, steps=k * epochs)
        curve, claimed = claim.curve(), claim.epsilon(DELTA)

        def scores(seed: int, runs: int, fixed: str | None) -> list[np.ndarray]:
            rng = np.random.default_rng(seed)
            return [
                spike_log_likelihood_ratio(
                    ideal_sums(rng, runs, k=k, epochs=epochs, sigma=sigma, fixed=fixed, canary=canary), noise_multiplier=sigma
                )
                for canary in (False, True)
            ]

        for runs in args.runs:
            for confidence in (0.95, 0.9995):
                null = sum(
                    sequential_refutes(*scores(10_000 + seed, runs, None), curve=curve, claimed=claimed, confidence=confidence)[0]
                    for seed in range(args.seeds)
                )
                for layout in ("short-last", "drop-last"):
                    outcomes = [
                        sequential_refutes(*scores(seed, runs, layout), curve=curve, claimed=claimed, confidence=confidence)
                        for seed in range(args.seeds)
                    ]
                    found = [hit for hit, _, _ in outcomes]
                    eps = [gdp for hit, _, gdp in outcomes if hit]
                    lines.append(
                        f"| {sigma} | {k} | {epochs} | {claimed:.2f} | {bound if bound else '–'} | {runs} | {confidence} | "
                        f"{layout} | {clopper_pearson(sum(found), len(found))} | {np.median([at for _, at, _ in outcomes]):.0f} | "
                        f"{np.median(eps) if eps else float('nan'):.2f} | {clopper_pearson(null, args.seeds)} |"
                    )
                    print(lines[-1], flush=True)
    return lines


def audits(args: argparse.Namespace) -> list[str]:
    from dpverify.registry import get_implementation
    from tests.doubles import NumpyDPSGD
    from tests.third_party import ThirdPartyDPSGD

    gate = two_world_config("quick", "fixed_batch")
    trainers = {
        "opacus-shuffled-batches": lambda: get_implementation("opacus-shuffled-batches"),
        "third-party-shuffled": lambda: ThirdPartyDPSGD("third-party-shuffled", "designated", batches="shuffled"),
        "third-party-poisson": lambda: ThirdPartyDPSGD("third-party-poisson", "designated"),
        "reference-dpsgd": lambda: get_implementation("reference-dpsgd"),
        "opacus-ghost": lambda: get_implementation("opacus-ghost"),
        "opacus-hooks": lambda: get_implementation("opacus-hooks"),
        "numpy-dpsgd (Poisson)": lambda: NumpyDPSGD(),
    }
    lines = [
        "| trainer | seeds | confidence | refuted | runs/world taken (median) | curve GDP ε_L (median) | s per audit (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.trainers:
        seeds = args.null_seeds if name.startswith("numpy") else args.seeds
        refuted, taken, gdp, seconds = 0, [], [], []
        for seed in range(seeds):
            started = time.perf_counter()
            result = run_two_world_audit(
                trainers[name](), world=gate.worlds.worlds(), runs=gate.worlds.runs, hyperparameters=gate.hyperparameters,
                architecture=MLPArchitecture(hidden_width=0), confidence=args.confidence, seed=seed,
            )  # fmt: skip
            seconds.append(time.perf_counter() - started)
            if result.verdict == "error":
                raise RuntimeError(result.error)
            refuted += result.verdict == "violation"
            taken.append(len(result.scores_d))
            gdp.append(result.bound.gdp_epsilon_lower_bound if result.bound else float("nan"))
        lines.append(
            f"| {name} | {seeds} | {args.confidence} | {clopper_pearson(refuted, seeds)} | {np.median(taken):.0f} | "
            f"{np.nanmedian(gdp):.2f} | {np.median(seconds):.1f} |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("ideal", "audits"))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--null-seeds", type=int, default=300, help="audits of the numpy Poisson DP-SGD (audits)")
    parser.add_argument("--runs", type=int, nargs="+", default=[160, 500])
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--trainers", nargs="+", default=["opacus-shuffled-batches", "third-party-shuffled", "third-party-poisson", "reference-dpsgd", "opacus-ghost", "numpy-dpsgd (Poisson)"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    lines = ideal(args) if args.what == "ideal" else audits(args)
    head = [
        f"# Every-update audits: the fixed-batch world ({args.what})",
        "",
        f"- date: {datetime.date.today()}; device: {device_line('cpu')}, shared with other jobs",
        f"- command: `python benchmarks/every_update.py {' '.join(sys.argv[1:])}` ({time.perf_counter() - started:.0f} s)",
        "- intervals: 95 % Clopper–Pearson",
        "",
    ]
    out = args.out or RESULTS / f"every-update-fixed-batch-{args.what}.md"
    out.write_text("\n".join(head + lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
