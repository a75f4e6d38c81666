"""Utility against auditing power on real data (the paper's Case II figure, "Trade-off for Image
Classification"): test accuracy and ε_L of UniAud++ (``multitask``) and the ``in_distribution`` and
``mislabeled`` O(1) baselines, trained by opacus-ghost on scikit-learn's digits at claimed ε ∈ {1, 2, 4,
8, ∞} and two audit sizes m.

    PYTHONPATH=.:plugins .venvs/torch/bin/python benchmarks/tradeoff.py --seeds 2

Writes ``benchmarks/results/tradeoff.md`` (device, date, command) and ``tradeoff.png``. ε_L is reported in
each design's own relation (replace-one for UniAud++, add/remove for the baselines, so the claims in the
table differ for the same target ε). Numbers are measurements, never test assertions.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

from dpverify.audits import run_audit
from dpverify.audits.planning import resolve_device
from dpverify.config import DATA_DESIGNS, profile_config
from dpverify.registry import get_implementation

RESULTS = Path(__file__).resolve().parent / "results"
EPSILONS = (1.0, 2.0, 4.0, 8.0, float("inf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--m", type=int, nargs="+", default=[150, 600])
    parser.add_argument("--hidden-width", type=int, default=500)
    parser.add_argument("--implementation", default="opacus-ghost")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    implementation = get_implementation(args.implementation)
    rows = []
    started = time.perf_counter()
    for m in args.m:
        for design in DATA_DESIGNS:
            for epsilon in EPSILONS:
                results = [
                    run_audit(
                        implementation,
                        profile_config(
                            "quick", design=design, m=m, trigger_dimension=m, epsilon=epsilon,
                            hidden_width=args.hidden_width, seed=seed, device=args.device,
                        ),
                    )
                    for seed in range(args.seeds)
                ]
                errors = [r.error for r in results if r.verdict == "error"]
                if errors:
                    raise RuntimeError(f"{design} m={m} ε={epsilon}: {errors[0]}")
                rows.append(
                    dict(
                        m=m,
                        design=design,
                        epsilon=epsilon,
                        claimed=statistics.mean(r.claimed_epsilon for r in results),
                        relation=results[0].relation,
                        eps_l=[r.epsilon_lower_bound for r in results],
                        accuracy=[r.test_accuracy for r in results],
                        eps_o=results[0].optimal_epsilon,
                        seconds=statistics.mean(r.seconds for r in results),
                    )
                )
                print(f"{time.perf_counter() - started:7.1f}s m={m} {design} ε={epsilon}: {rows[-1]}", file=sys.stderr)
    device = resolve_device(args.device)
    command = "PYTHONPATH=.:plugins .venvs/torch/bin/python benchmarks/tradeoff.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_table(rows, args, device, command)
    write_figure(rows, args)
    return 0


def _mean_range(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def write_table(rows: list[dict], args: argparse.Namespace, device: str, command: str) -> None:
    lines = [
        "# Utility against auditing power on real data (Case II)",
        "",
        f"Device: {device} ({platform.processor() or platform.machine()}, 2 cores shared); date: "
        f"{datetime.date.today().isoformat()}; command: `{command.strip()}`.",
        "",
        f"{args.implementation}, quick profile (q = 1, 20 epochs, lr 5, C = 1, δ = 1e-5) with hidden width "
        f"{args.hidden_width}; scikit-learn digits (1348 train / 449 test, standardised); UniAud++ with "
        "orthogonal triggers of dimension m (norm 8), |E| = 100, H = 1, λ = 1; 95 % confidence over the "
        f"default guess grid (Bonferroni); {args.seeds} seeds, mean (min–max). Claimed ε is the run's ε in the "
        "design's relation (replace-one for UniAud++, from dpverify's PLD accountant; add/remove for the "
        "baselines, Opacus' RDP).",
        "",
        "| m | design | target ε | relation | claimed ε | ε_L | test accuracy | ε_O | s / audit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['m']} | {r['design']} | {r['epsilon']:g} | {r['relation']} | {r['claimed']:.3g} | "
            f"{_mean_range(r['eps_l'])} | {_mean_range(r['accuracy'])} | {r['eps_o']:.3f} | {r['seconds']:.1f} |"
        )
    (RESULTS / "tradeoff.md").write_text("\n".join(lines) + "\n")


def write_figure(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(args.m), figsize=(5 * len(args.m), 4), squeeze=False)
    markers = {"multitask": "o", "in_distribution": "s", "mislabeled": "^"}
    for axis, m in zip(axes[0], args.m):
        for design in DATA_DESIGNS:
            mine = [r for r in rows if r["m"] == m and r["design"] == design]
            axis.plot(
                [statistics.mean(r["eps_l"]) for r in mine],
                [statistics.mean(r["accuracy"]) for r in mine],
                marker=markers[design],
                label="UniAud++" if design == "multitask" else design.replace("_", "-"),
            )
            for r in mine:
                axis.annotate(f"{r['epsilon']:g}", (statistics.mean(r["eps_l"]), statistics.mean(r["accuracy"])), fontsize=7)
        axis.set_xlabel("ε_L (95 %)")
        axis.set_ylabel("test accuracy")
        axis.set_title(f"digits, m = {m} (labels: target ε)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "tradeoff.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
