"""The every-update audit of JAX-Privacy's dense matrix-factorization path over seeds, beside its numpy ceiling.

Each run is ``run_audit`` of ``jax-privacy-dense-mf`` (or one of its runs, ``--kinds``) with the default gate's
every-update audit of correlated noise (``every_update_config(correlated=True)``: q = 1, a record in every step,
min-separation 1), at confidence 0.99.

The ceiling is numpy's, per run, for a canary with a unit gradient in a fixed direction at every step (the
perfect attacker on the mechanism the run has, module docstring of dpverify.stats.correlated): the claimed
μ = 1/σ (σ the one calibrated to the target ε); the true μ = ‖C_noise·1‖/τ_run with C_noise the strategy whose inverse draws the noise and τ_run its
stddev; the claimed-structure score's μ = ‖C·1‖/(τ_run·s) with s² = ‖Mᵀ Cᵀ C·1‖²/‖C·1‖², M the noise's map from
unit Gaussians (C_noise⁻¹, its rows clamped as the release reads them), what the audit's score can reach; and the
final model's μ = T/(τ_run‖Mᵀ1‖), the one-run audit's observation. For the run past its noising matrix's
rows (``short_noising``) the true μ is infinite for an attacker who knows the gradients (noiseless differences)
and finite only for this fixed-direction canary, so no true μ is stated.

    PYTHONPATH=$PWD:$PWD/plugins KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/dense_mf.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import datetime
import time
from pathlib import Path

import numpy as np

from dpverify.audits import run_audit
from dpverify.config import every_update_config
from dpverify_jaxprivacy import _matrix_factorization as dense_mf

NAMES = {
    "correct": "jax-privacy-dense-mf",
    "single_participation": "jax-privacy-dense-mf-single-participation",
    "mismatched_noising": "jax-privacy-dense-mf-mismatched-noising",
    "short_noising": "short-noising (known issue)",
}


def ceiling(kind: str, steps: int, sigma: float = 1.0) -> dict[str, float]:
    """The numpy ceiling of ``kind`` at q = 1 (module docstring)."""
    claimed = dense_mf.strategy(steps).strategy
    noising = np.asarray(dense_mf._noising_matrix(kind, steps), dtype=np.float64)
    rows = np.minimum(np.arange(steps), noising.shape[0] - 1)  # the release's clamped rows past the last one
    noise_map = np.zeros((steps, steps))
    noise_map[:, : noising.shape[1]] = noising[rows]
    tau = sigma * dense_mf._noise_sensitivity(kind, steps, 1)
    ones = np.ones(steps)
    signal = claimed @ ones
    score_sd = np.linalg.norm(noise_map.T @ claimed.T @ signal) / np.linalg.norm(signal)
    true = np.nan if kind == "short_noising" else np.linalg.norm(np.linalg.solve(noise_map, ones)) / tau
    return dict(
        claimed=1.0 / sigma,
        true=true,
        score=np.linalg.norm(signal) / (tau * score_sd),
        final=steps / (tau * np.linalg.norm(noise_map.T @ ones)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(NAMES), choices=list(NAMES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    infos = {impl.info.name: impl.info for impl in dense_mf.implementations()}
    lines = [
        "| run | seed | verdict | curve refuted | curve p | ε_L (curve) | ρ | CPU s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    design = every_update_config(args.profile, {"device": "cpu"}, correlated=True)
    steps, sigma = design.hyperparameters.steps, None
    started = time.process_time()
    for kind in args.kinds:
        info = infos.get(NAMES[kind], infos["jax-privacy-dense-mf"])
        impl = dense_mf.DenseMatrixFactorization(info, kind)
        for seed in args.seeds:
            config = every_update_config(args.profile, {"device": "cpu"}, correlated=True).with_overrides(confidence=0.99, seed=seed)
            before = time.process_time()
            result = run_audit(impl, config)
            sigma = dense_mf._calibrated_sigma(design.hyperparameters.target_epsilon, design.hyperparameters.delta)
            rho = result.power.signal_fraction if result.power is not None else float("nan")
            p_value = float("nan") if result.curve_p_value is None else result.curve_p_value
            curve_lower = float("nan") if result.curve_epsilon_lower_bound is None else result.curve_epsilon_lower_bound
            line = (
                f"| {NAMES[kind]} | {seed} | {result.verdict} | {result.curve_refuted} | {p_value:.3g} | "
                f"{curve_lower:.3f} | {rho:.2f} | {time.process_time() - before:.1f} |"
            )
            print(line, flush=True)
            lines.append(line)
    ceilings = [
        "| run | claimed μ | true μ | claimed-structure score μ | final-model μ | score / claimed |",
        "|---|---|---|---|---|---|",
    ]
    for kind in args.kinds:
        c = ceiling(kind, steps, sigma)
        ceilings.append(
            f"| {NAMES[kind]} | {c['claimed']:.3f} | {c['true']:.3f} | {c['score']:.3f} | {c['final']:.3f} | {c['score'] / c['claimed']:.2f} |"
        )
    text = "\n".join(
        [
            f"- date: {datetime.date.today().isoformat()}",
            f"- command: `PYTHONPATH=$PWD:$PWD/plugins KERAS_BACKEND=jax .venvs/jax/bin/python benchmarks/dense_mf.py --seeds {' '.join(map(str, args.seeds))} --kinds {' '.join(args.kinds)}`",
            f"- the default gate's every-update audit of correlated noise at the {args.profile} profile (q = 1): {design.pooled_runs} pooled runs of {design.canaries_per_run[0]} Dirac canaries, {steps} steps, target ε {design.hyperparameters.target_epsilon:g} (σ = {sigma:.3f}), one-sided, at confidence 0.99; {time.process_time() - started:.0f} CPU-s in all",
            "",
            *lines,
            "",
            f"Numpy ceiling (a unit gradient in a fixed direction at every step, σ = {sigma:.3f}):",
            "",
            *ceilings,
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
