"""How often the linear_3d design's audit refutes each Linear norm formula: a numpy model of its scores through
the audit's own curve test, in seconds where the real audits take minutes (their table: layer-formulas.md).

Each canary of a run is in a position regime (its label modulo 4, :func:`dpverify.contract.position_regime`), with
position gradients g_t = c_t·u, where c is its regime's row of :func:`dpverify.contract.position_weights` and u the
zero-initialised softmax's gradient over the run's 1000 labels; its input is the design's 1/16 at every position.
Each formula of ``dpverify_opacus.variants.LINEAR_NORM_FORMULAS`` states a norm N' for it against the true N, so a
member is clipped by min(1, C / N'). Over 10 full-batch steps at the claim's σ, the canary's self-comparison score
is N·(member·min(1, C/N')·N·steps + σC√steps·z): in the linear regime, the model's logits move along the record's
own gradient, so signal and noise both scale with its norm. The guesses (two-sided, the gate's fractions) are
each run's own, and ``dpverify.stats.curves.combined_curve_test`` decides at ``--confidence`` (the main job's
0.99878 by default). A model, not the audit: it leaves out the other canaries' share of the softmax and the
steps' drift; on main's earlier regimes it gave what the real audits gave (a root too many 1 of 10, real 1 of 5;
T × the first position 0 of 10, curve ε_L 1.76, real 1.55–1.81).

    python benchmarks/layer_formula_sim.py --seeds 20
    python benchmarks/layer_formula_sim.py --seeds 20 --runs 4 --confidence 0.95 --formulas rows squared_gram --append
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import brentq

from dpverify.contract import position_weights
from dpverify.stats.bounds import _gdp_epsilon
from dpverify.stats.curves import ClaimedRun, combined_curve_test
from dpverify.stats.scoring import GuessRule, guesses_from_scores
from dpverify_opacus.variants import LINEAR_NORM_FORMULAS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from two_world import RESULTS, _write, header  # noqa: E402

STEPS, CLIP, DELTA, TARGET_EPSILON = 10, 0.5, 1e-5, 2.0  # dpverify.config.LAYER_SETTINGS' quick profile
POSITIONS, LABELS, INPUT = 16, 1000, 1 / 16


def regime_norms(formula: str) -> tuple[np.ndarray, np.ndarray]:
    """Per regime, the norm ``formula`` states and the true one, for a record of the zero-initialised design."""
    weights = torch.from_numpy(position_weights(POSITIONS)).double()
    softmax_gradient = torch.full((LABELS,), 1.0 / LABELS, dtype=torch.float64)
    softmax_gradient[0] -= 1.0
    backprops = weights[:, :, None] * softmax_gradient  # (R, T, labels)
    activations = torch.zeros(weights.shape[0], POSITIONS, 4, dtype=torch.float64)
    activations[..., 0] = INPUT
    stated = torch.stack(LINEAR_NORM_FORMULAS[formula](activations, backprops)).norm(dim=0)
    true = torch.stack(LINEAR_NORM_FORMULAS["exact"](activations, backprops)).norm(dim=0)
    return stated.numpy(), true.numpy()


def refuted(formula: str, *, seed: int, runs: int, m: int, confidence: float, sigma: float) -> tuple[bool, float]:
    """Whether the curve test refutes the claim on one simulated audit, and its curve ε_L."""
    rng = np.random.default_rng(seed)
    stated, true = regime_norms(formula)
    rule = GuessRule()
    counts = rule.run_counts([m] * runs)
    correct = np.zeros(counts.shape, dtype=int)
    for run in range(runs):
        regime = rng.integers(0, len(true), m)
        clipped = np.minimum(1.0, CLIP / np.maximum(stated[regime], 1e-12))
        member = rng.random(m) < 0.5
        norm = true[regime]
        scores = norm * (member * clipped * norm * STEPS + sigma * CLIP * math.sqrt(STEPS) * rng.standard_normal(m))
        bits = np.where(member, 1, -1)
        correct[run] = [np.count_nonzero(guesses_from_scores(scores, int(k)) * bits > 0) for k in counts[run]]
    claim = ClaimedRun(noise_multiplier=sigma, steps=STEPS)
    test = combined_curve_test(
        [m] * runs, counts, correct, claim=claim, delta=DELTA, confidence=rule.corrected_confidence(confidence)
    )
    return test.refuted, test.epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=8, help="pooled runs (the design's 8)")
    parser.add_argument("--m", type=int, default=500, help="canaries per run (the design's 500)")
    parser.add_argument("--confidence", type=float, default=0.99878, help="the audit's (the main job's by default)")
    parser.add_argument("--formulas", nargs="*", choices=list(LINEAR_NORM_FORMULAS), help="default: every one")
    parser.add_argument("--output", default="layer-formula-sim.md")
    parser.add_argument("--append", action="store_true", help="add a section to the output file")
    args = parser.parse_args()
    mu = brentq(lambda value: float(_gdp_epsilon(np.array(value), DELTA)) - TARGET_EPSILON, 0.01, 10.0)
    sigma = math.sqrt(STEPS) / mu  # the full-batch σ whose μ-GDP ε at δ is the target, as the libraries calibrate
    lines = header("A numpy model of the linear_3d design's audit of each Linear norm formula", args, [
        f"- {args.runs} runs × {args.m} canaries, confidence {args.confidence}, σ {sigma:.3f} (GDP μ {mu:.3f}), "
        f"{POSITIONS} positions pooled by `dpverify.contract.position_weights`; seeds 0–{args.seeds - 1}",
    ]) + ["| formula | stated / true norm per regime | refuted | curve ε_L (median) |", "|---|---|---|---|"]  # fmt: skip
    for formula in args.formulas or LINEAR_NORM_FORMULAS:
        stated, true = regime_norms(formula)
        outcomes = [refuted(formula, seed=s, runs=args.runs, m=args.m, confidence=args.confidence, sigma=sigma) for s in range(args.seeds)]
        ratios = ", ".join(f"{s / t:.2f}" for s, t in zip(stated, true))
        row = f"| {formula} | {ratios} | {sum(r for r, _ in outcomes)} / {args.seeds} | {np.median([e for _, e in outcomes]):.2f} |"
        print(row, flush=True)
        lines.append(row)
    path = RESULTS / args.output
    if args.append and path.exists():
        lines = [path.read_text().rstrip("\n"), "", "#" + lines[0], *lines[1:]]
    _write(args.output, lines)


if __name__ == "__main__":
    main()
