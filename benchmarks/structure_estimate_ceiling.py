"""Numpy ceiling of the every-update audit of ``opacus-dpcr-unrestarted-tree`` at the default gate's setting: whether
any score, the stated trees' whitening, the untouched noise's estimate or the true tree's own (a perfect attacker
of the run), refutes the claim through the audit's own decision.

The gate's correlated every-update audit: q = 1, T = 32 steps, target ε = 4 at δ = 1e-5 (the claim
``GaussianDpEvent(σ)``, σ = 1.081, μ = 0.925), 16 runs of 500 Dirac canaries, one-sided guesses at the profile's
fractions, confidence 0.95. The claim states the binary tree of 16-step blocks (``NoiseStructure.binary_tree``) and
its noise τ = σ‖C·1‖; the variant draws the same node noise over one 32-step tree. Each simulated canary owns a
coordinate and, a member, adds a gradient of norm ``g`` (clip norms) at every step: g = 1 is the most a canary
carries, g ≈ 0.82 what the correct path's canaries carried (ρ 0.81–0.84, benchmarks/results/opacus-dpcr.md). Each
run's estimate takes its 500 canaries' untouched series (K = 500, as the audit's
:meth:`~dpverify.canaries.updates.DiracUpdates.untouched` gives them). ``--steps 64`` runs the same at 64 steps.

    PYTHONPATH=$PWD .venvs/torch/bin/python benchmarks/structure_estimate_ceiling.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import time

import dp_accounting
import numpy as np

from dpverify.audits.verdict import _run_correct
from dpverify.config import every_update_config
from dpverify.stats import correlated
from dpverify.stats.decision import audit_decision
from dpverify.stats.events import EventRun
from dpverify.stats.scoring import correct_counts

EPSILON, DELTA, RUNS, PER_RUN, TREE = 4.0, 1e-5, 16, 500, 16


def curve_test(scores: np.ndarray, membership: np.ndarray, event) -> tuple[bool, float]:
    """The audit's curve test of ``event`` on pooled runs of :data:`PER_RUN`: refuted, and its smallest tail bound."""
    rule = every_update_config("quick", {}, correlated=True).guess_rule
    decision = audit_decision(EventRun(event=event), run_sizes=(PER_RUN,) * RUNS, guess_rule=rule,
                              claimed_epsilon=EPSILON, delta=DELTA, confidence=0.95)  # fmt: skip
    correct = correct_counts(scores, membership, decision.counts, sides=rule.sides)
    test = decision.curve_test(correct, _run_correct(decision, scores, membership)(np.arange(1))[:, 0])
    return test.refuted, test.p_value


def audit(seed: int, *, steps: int, gradient: float) -> dict[str, tuple[bool, float]]:
    """One simulated audit of the variant: each score's curve test (refuted, p)."""
    rng = np.random.default_rng(seed)
    sigma = float(dp_accounting.calibrate_dp_mechanism(dp_accounting.pld.PLDAccountant, dp_accounting.GaussianDpEvent, EPSILON, DELTA))
    stated = correlated.NoiseStructure.binary_tree(steps=steps, tree_steps=TREE)
    true = correlated.NoiseStructure.binary_tree(steps=steps, tree_steps=steps)
    tau = sigma * float(np.linalg.norm(stated.strategy.sum(axis=1)))
    mixing = tau * np.linalg.inv(true.strategy).T
    scores: dict[str, list[np.ndarray]] = {"stated trees": [], "estimated (K = 500)": [], "true tree (perfect attacker)": []}
    membership = []
    for _ in range(RUNS):
        member = np.where(rng.random(PER_RUN) < 0.5, 1, -1)
        gradients = np.full((PER_RUN, steps), gradient)
        released = (member == 1)[:, None] * gradients + rng.standard_normal((PER_RUN, steps)) @ mixing
        untouched = rng.standard_normal((PER_RUN, steps)) @ mixing
        for name, (structure, noise) in {
            "stated trees": (stated, tau),
            "estimated (K = 500)": (correlated.estimated_structure(untouched), 1.0),
            "true tree (perfect attacker)": (true, tau),
        }.items():
            scores[name].append(correlated.decorrelated_log_likelihood_ratio(released, gradients, structure=structure, noise_stddev=noise))
        membership.append(member)
    bits = np.concatenate(membership)
    event = dp_accounting.GaussianDpEvent(sigma)
    return {name: curve_test(np.concatenate(parts), bits, event) for name, parts in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--gradients", type=float, nargs="+", default=[0.82, 1.0])
    args = parser.parse_args()
    start = time.perf_counter()
    true_mu = np.linalg.norm(correlated.NoiseStructure.binary_tree(steps=args.steps, tree_steps=args.steps).strategy.sum(axis=1))
    claimed_mu = np.linalg.norm(correlated.NoiseStructure.binary_tree(steps=args.steps, tree_steps=TREE).strategy.sum(axis=1))
    print(f"T = {args.steps}: the variant's μ is {true_mu / claimed_mu:.2f} times the claim's (a canary of g = 1)")
    print("| g | score | refuted | curve p per seed |")
    print("|---|---|---|---|")
    for gradient in args.gradients:
        results = [audit(seed, steps=args.steps, gradient=gradient) for seed in args.seeds]
        for name in results[0]:
            tests = [r[name] for r in results]
            refuted = sum(hit for hit, _ in tests)
            print(f"| {gradient} | {name} | {refuted} of {len(tests)} | {', '.join(f'{p:.2g}' for _, p in tests)} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
