"""Numpy ceiling of the every-update audit of ``jax-privacy-bandmf`` at the default gate's setting: what a
perfect attacker reaches on the claimed mechanism, on the run as it is (the phase unseen), and on each variant.

The gate's every-update audit designates T = 80 steps (8 epochs at q = 0.1) and σ = 1; the plan has b = 2
bands (``optimal_max_error_strategy_coefs(2)``), cyclic Poisson at ``sampling_prob`` q, noise τ = σ·‖coef‖ in
clip norms. Each simulated canary owns a coordinate and, when a member, takes part in each step of its phase
(t ≡ j mod b, j uniform) with probability q, with a unit gradient in a fixed direction:
y = 1{member}·u + τ C⁻¹ Z. Summarised by the AUC-equivalent μ = √2·Φ⁻¹(AUC):

- claimed: the claimed mechanism itself (``amplified_bandmf_event``: ⌈T/b⌉ Poisson-sampled Gaussians of σ),
  its own likelihood ratio (the perfect attacker, who knows each record's phase);
- phase known: the decorrelated score given the phase (``decorrelated_log_likelihood_ratio``);
- audit's score: the score the audit uses, mixed over the unseen phase (``cyclic_log_likelihood_ratio``),
  on the run as it is and on each variant's releases (``_bandmf.PLAN_FAULTS``).

    PYTHONPATH=$PWD .venvs/jax/bin/python benchmarks/bandmf_ceiling.py --canaries 40000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from correlated_ceiling import auc_mu, auc_mu_standard_error
from dpverify.stats import correlated
from dpverify.stats.scoring import subsampled_gaussian_log_likelihood_ratio

STEPS, BANDS, SIGMA, Q = 80, 2, 1.0, 0.1


def releases(fault: str, member: np.ndarray, phase: np.ndarray, rng) -> np.ndarray:
    """(m, T) releases of the run as ``fault`` makes it, in clip norms."""
    coef = correlated.optimal_max_error_coefficients(BANDS)
    tau = SIGMA * float(np.linalg.norm(coef))
    noising = correlated.NoiseStructure.banded_toeplitz(coef, steps=STEPS)
    if fault == "one_participation":
        tau /= math.sqrt(-(-STEPS // BANDS))
    if fault == "unbanded_noise":
        noising = correlated.NoiseStructure.banded_toeplitz(correlated.optimal_max_error_coefficients(STEPS), steps=STEPS)
    allowed = np.ones((member.size, STEPS), bool)
    if fault != "poisson_everywhere":
        allowed = (np.arange(STEPS)[None, :] % BANDS) == phase[:, None]
    taken = member[:, None] * allowed * (rng.random((member.size, STEPS)) < Q)
    return taken + tau * rng.standard_normal((member.size, STEPS)) @ np.linalg.inv(noising.strategy).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, default=40000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    m = args.canaries
    member = (np.arange(m) < m // 2).astype(float)
    phase = rng.integers(0, BANDS, m)
    coef = correlated.optimal_max_error_coefficients(BANDS)
    structure = correlated.NoiseStructure.banded_toeplitz(coef, steps=STEPS)
    tau = SIGMA * float(np.linalg.norm(coef))
    ones = np.ones((m, STEPS))
    rounds = -(-STEPS // BANDS)
    claimed_release = member[:, None] * (rng.random((m, rounds)) < Q) + SIGMA * rng.standard_normal((m, rounds))
    claimed = auc_mu(subsampled_gaussian_log_likelihood_ratio(np.ones((m, rounds)), claimed_release, noise_multiplier=SIGMA, sampling_rate=Q), member)
    rows = [("claimed mechanism (phase known)", claimed)]
    own = releases("correct", member, phase, rng)
    at_phase = ones * ((np.arange(STEPS)[None, :] % BANDS) == phase[:, None])
    known = correlated.decorrelated_log_likelihood_ratio(own, at_phase, structure=structure, noise_stddev=tau, sampling_rate=Q)
    rows.append(("jax-privacy-bandmf, phase known", auc_mu(known, member)))
    for fault in ("correct", "one_participation", "poisson_everywhere", "unbanded_noise"):
        released = own if fault == "correct" else releases(fault, member, phase, rng)
        score = correlated.cyclic_log_likelihood_ratio(released, ones, structure=structure, noise_stddev=tau, cycle=BANDS, sampling_rate=Q)
        name = "jax-privacy-bandmf" + ("" if fault == "correct" else "-" + fault.replace("_", "-"))
        rows.append((f"{name}, audit's score (phase unseen)", auc_mu(score, member)))
    print(f"T = {STEPS}, b = {BANDS}, σ = {SIGMA}, q = {Q}, {m} canaries (half members), seed {args.seed}, {time.perf_counter() - start:.1f} s")
    print("| releases, score | AUC-equivalent μ | s.e. | / claimed |")
    print("|---|---|---|---|")
    for name, mu in rows:
        print(f"| {name} | {mu:.3f} | {auc_mu_standard_error(mu, m):.3f} | {mu / claimed:.2f} |")


if __name__ == "__main__":
    main()
