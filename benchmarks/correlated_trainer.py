"""docs/trainer.md's hand-written banded-MF trainer over seeds: the every-update audit of the correct trainer
and of its two bugs (tests/test_correlated_trainer.py's setting), with the μ its scores reach against the
numpy ceiling of the same releases.

    PYTHONPATH=$PWD:$PWD/plugins OMP_NUM_THREADS=1 .venvs/torch/bin/python benchmarks/correlated_trainer.py --seeds 5

μ reached is the scores' AUC-equivalent μ, √2·Φ⁻¹(AUC) (members against non-members); the ceiling is the μ
that the claimed strategy's whitened, exact log-likelihood ratio has on the releases each variant makes
(one unit gradient at every step), and ρ their ratio. Writes ``benchmarks/results/correlated-trainer.md``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpverify.audits import run_audit  # noqa: E402
from tests.test_correlated_trainer import BUGS, CONFIDENCE, audit_config, bandmf  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "correlated-trainer.md"


#: The page's module namespace (its strategy functions and BANDS).
PAGE = type(bandmf()).train.__globals__


def _toeplitz(bands: int, steps: int) -> np.ndarray:
    """The trainer's strategy at ``bands`` bands, by the page's own functions."""
    return PAGE["lower_toeplitz"](PAGE["strategy_coefficients"](bands), steps)


def ceiling_mu(variant: str, *, steps: int, bands: int, sigma: float) -> float:
    """μ of the claimed strategy's whitened statistic ⟨C1, Cy⟩/‖C1‖ on the variant's releases y = 1 + noise."""
    claimed = _toeplitz(bands, steps)
    one = np.ones(steps)
    tau = sigma * np.linalg.norm(claimed @ one)
    noise_map = {  # the variant's noise in unit Gaussians, τ·C⁻¹ as written
        "mismatched-strategy": np.linalg.inv(_toeplitz(steps, steps)),
        "more-private": np.diag(np.linalg.norm(np.linalg.inv(claimed), axis=1)),
    }.get(variant, np.linalg.inv(claimed))
    scale = tau if variant != "unscaled-noise" else sigma
    direction = claimed.T @ claimed @ one / np.linalg.norm(claimed @ one)
    null_sd = scale * np.linalg.norm(noise_map.T @ direction)
    return float(np.linalg.norm(claimed @ one) / null_sd)


def auc_mu(scores: np.ndarray, membership: np.ndarray) -> float:
    members, others = scores[membership == 1], scores[membership == -1]
    auc = stats.mannwhitneyu(members, others).statistic / (members.size * others.size)
    return float(np.sqrt(2) * stats.norm.ppf(auc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    config = audit_config(seed=0)
    hp = config.hyperparameters
    bands = PAGE["BANDS"]
    rows, started = [], time.perf_counter()
    for variant in ("correct", "more-private", *sorted(BUGS)):
        ceiling = ceiling_mu(variant, steps=hp.steps, bands=bands, sigma=hp.noise_multiplier)
        for seed in range(args.seeds):
            tick = time.perf_counter()
            result = run_audit(bandmf(None if variant == "correct" else variant), audit_config(seed=seed))
            reached = auc_mu(result.scores, result.membership)
            shown, rho = ("∞", "∞") if np.isinf(reached) else (f"{reached:.2f}", f"{reached / ceiling:.2f}")
            rows.append(
                f"| {variant} | {seed} | {result.verdict} | {result.curve_p_value:.3g} | {result.epsilon_lower_bound:.2f} "
                f"| {result.curve_epsilon_lower_bound:.2f} | {result.curve_claimed_epsilon:.2f} | {result.m} | {shown} "
                f"| {ceiling:.2f} | {rho} | {time.perf_counter() - tick:.0f} |"
            )
            print(rows[-1], flush=True)
    text = f"""# The hand-written correlated-noise trainer, audited on every update

- date: {datetime.date.today().isoformat()}
- command: `PYTHONPATH=$PWD:$PWD/plugins OMP_NUM_THREADS=1 .venvs/torch/bin/python benchmarks/correlated_trainer.py --seeds {args.seeds}`
- device: cpu ({platform.machine()}, shared with other jobs), {time.perf_counter() - started:.0f} s in all
- setting (tests/test_correlated_trainer.py): docs/trainer.md's `my_bandmf.py`, {bands} bands, {hp.steps} full-batch
  steps, the event `GaussianDpEvent({hp.noise_multiplier:g})` (claimed μ = 1), {config.pooled_runs} runs of
  {config.canaries.m // config.pooled_runs} Dirac canaries, per-audit confidence {CONFIDENCE}
- bugs: `unscaled-noise` (noise not scaled by the strategy's sensitivity ‖C·1‖), `mismatched-strategy` (noise
  drawn with the unbanded strategy, the claim and the sensitivity the {bands}-band one's); and `more-private`, no
  bug: independent noise of the claimed per-step variance while claiming the banded C, which gives less than
  the claim (its true μ is below 1), so the audit must not refute it

μ reached: the scores' AUC-equivalent μ (on the canaries of the runs the audit used: a refuted audit may stop
early; ∞ where every member scored above every non-member, AUC = 1); ceiling: the μ of the claimed strategy's exact log-likelihood ratio on that variant's releases (a unit
gradient at every step, numpy); ρ = reached / ceiling. The claimed μ is 1, so the correct trainer's ceiling is
the claim itself (benchmarks/results/correlated-ceiling.md: decorrelated / claimed = 1.00 at q = 1).

| trainer | seed | verdict | curve p | ε_L | curve ε_L | claimed ε | canaries | μ reached | ceiling μ | ρ | wall s |
|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
