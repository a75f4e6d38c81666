"""tf-privacy-ftrl and its variants under the default gate: a numpy ceiling of what each of the gate's audits
can reach against the claim, and the verdicts of `dpverify audit` reports over seeds.

The ceiling (a perfect attacker of the real noise, unit clipped gradients):

- one-run audit (quick profile: q = 1, 10 full-batch steps, σ = 1): an epoch is one step, so the claimed tree
  has one leaf and the claim is √T/σ; the final model shows the sum of the updates, T·g + N_T,
  μ = T/(σ·sd(N_T)), with N_T the prefix noise of the trees the optimizer actually runs (one leaf each; one
  tree of T; σ/√epochs);
- every-update audit (config.EVERY_UPDATE_EPOCHS_SETTING: epochs of P = 4 steps in a fixed order, 8 of them,
  σ calibrated to the target ε by TF-Privacy's accountant): a record at one place of every epoch, uniform and
  unseen; the audit's score is the claim's (``correlated_release``: the claimed tree, its τ, the mixture
  over the P places, ``cyclic_log_likelihood_ratio``), against the claimed μ (the perfect attacker of the
  claimed mechanism, √(epochs·(⌊log₂P⌋ + 1))/σ) and a perfect attacker of the real noise who knows each
  canary's place (its likelihood ratio under the noise the optimizer actually adds). Scores that are not
  Gaussian are summarised by their AUC-equivalent μ = √2·Φ⁻¹(AUC).

    PYTHONPATH=$PWD:$PWD/plugins .venvs/torch/bin/python benchmarks/tf_privacy_ftrl.py /tmp/ftrl/*.json
"""

from __future__ import annotations

import argparse
import datetime
import math
import time
from pathlib import Path

import numpy as np
from scipy import stats

from dpverify.config import EVERY_UPDATE_EPOCHS_SETTING
from dpverify.stats import correlated
from dpverify.stats.events import correlated_release
from dpverify_tfprivacy import _ftrl
from _tables import write_table
from gate_seeds import table

SIGMA = 1.0
ONE_RUN_STEPS = 10
DELTA = 1e-5
#: The variants as the optimizer runs them: (restart period, noise multiplier factor) given the epochs.
RUNS = {
    "tf-privacy-ftrl": lambda period, epochs: (period, 1.0),
    "tf-privacy-ftrl-no-restart": lambda period, epochs: (None, 1.0),
    "tf-privacy-ftrl-one-epoch-noise": lambda period, epochs: (period, 1 / math.sqrt(epochs)),
}


def noise_map(steps: int, period: int | None) -> np.ndarray:
    """L: the updates' noise in unit Gaussians of the trees restarted every ``period`` steps."""
    return correlated._tree_restart_noise_map(steps, correlated._tree_epochs(steps, period, None))  # noqa: SLF001


def one_run_row(name: str) -> tuple[float, float]:
    """(claimed μ, the final model's μ) at the one-run audit's full batch."""
    period, factor = RUNS[name](1, ONE_RUN_STEPS)
    claimed = correlated.tree_restart_claimed_mu(noise_multiplier=SIGMA, epoch_steps=[1] * ONE_RUN_STEPS)
    spread = SIGMA * factor * np.linalg.norm(noise_map(ONE_RUN_STEPS, period).sum(axis=0))
    return claimed, ONE_RUN_STEPS / spread


def every_update_design() -> tuple[int, int, float]:
    """(P, epochs, σ) of the gate's every-update audit of DP-FTRL."""
    setting = EVERY_UPDATE_EPOCHS_SETTING
    period, epochs = _ftrl.epoch_steps(setting["sampling_rate"]), setting["epochs"]
    return period, epochs, _ftrl.calibrate_noise_multiplier(setting["epsilon"], (period,) * epochs, DELTA)


def every_update_row(name: str, *, canaries: int, rng) -> tuple[float, float, float]:
    """(claimed μ, the audit's score's AUC-equivalent μ, a perfect attacker's who knows each canary's place)."""
    period, epochs, sigma = every_update_design()
    steps = period * epochs
    run_period, factor = RUNS[name](period, epochs)
    claim = _ftrl.claim(sigma, steps=steps, period=period, delta=DELTA)
    release = correlated_release(claim)
    member = np.arange(canaries) < canaries // 2
    place = rng.integers(0, period, canaries)
    taken = np.zeros((canaries, steps))
    taken[np.arange(canaries)[:, None], place[:, None] + np.arange(0, steps, period)] = 1.0
    lmap = noise_map(steps, run_period)
    released = member[:, None] * taken + sigma * factor * rng.standard_normal((canaries, lmap.shape[1])) @ lmap.T
    audit = correlated.cyclic_log_likelihood_ratio(
        released, np.ones_like(released), structure=release.structure, noise_stddev=release.noise_stddev, cycle=release.cycle
    )
    true_structure = correlated.NoiseStructure(strategy=np.tril(np.linalg.inv(np.linalg.cholesky(lmap @ lmap.T))))
    known = correlated.decorrelated_log_likelihood_ratio(released, taken, structure=true_structure, noise_stddev=sigma * factor)
    claimed = correlated.tree_restart_claimed_mu(noise_multiplier=sigma, epoch_steps=[period] * epochs)
    return claimed, _auc_mu(audit, member), _auc_mu(known, member)


def _auc_mu(scores: np.ndarray, member: np.ndarray) -> float:
    """√2·Φ⁻¹(AUC) of the members' scores over the others' (exact for Gaussian scores of unit variance)."""
    ranks = stats.rankdata(scores)
    inside, outside = int(member.sum()), int((~member).sum())
    auc = (ranks[member].sum() - inside * (inside + 1) / 2) / (inside * outside)
    return float(math.sqrt(2) * stats.norm.ppf(auc))


READING = (
    "Reading: the one-run audit (q = 1) sees the tree of one leaf, so the final model carries the whole claimed μ "
    "(ρ near 1) and both variants' final models show about three times it. The every-update audit designates epochs "
    "of 4 steps in DP-FTRL's fixed order (config.EVERY_UPDATE_EPOCHS_SETTING), where the restarted tree of depth 3 "
    "is exercised and the unamplified claim is within reach (target ε 4, the event's μ {claimed:.2f}); its score, "
    "the claimed tree's likelihood ratio mixed over the 4 places a canary may hold, reaches {correct_share:.2f} of "
    "the claimed μ on the correct path's noise (a perfect attacker who knows the places {known_share:.2f}: the "
    "accountant counts 3 nodes an epoch that the updates do not all show), while the tree never restarted shows "
    "{no_restart_share:.2f} times the claimed μ to it and node noise for one epoch's tree {one_epoch_share:.2f} "
    "times. Measured ρ above: the every-update audit's share of the claimed μ.",
    "",
    "The fixed-batch world no longer applies to DP-FTRL: it asks whether fixed-size batches are accounted as Poisson "
    "sampling, and DP-FTRL's claim takes no amplification (ImplementationInfo.amplified false), so its epochs of "
    "fixed batches are what it accounts; at the world's σ = 0.8 and q = 0.1 the unamplified claim was ε 22.0, "
    "undecided on 5 of 5 seeds (the previous version of this table).",
    "",
    "CPU time (2-core CPU shared with other sessions, `/usr/bin/time` of each command): {cpu}",
)


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", help="dpverify audit --report files")
    parser.add_argument("--canaries", type=int, default=40000)
    parser.add_argument("--cpu", default="-", help="the measured CPU seconds, in words, for the reading")
    parser.add_argument("--out", default="benchmarks/results/tf-privacy-ftrl.md")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    period, epochs, sigma = every_update_design()
    lines = [
        "# tf-privacy-ftrl: TF-Privacy's DP-FTRL under the default gate",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        "- command: `for s in 0 1 2 3 4; do dpverify audit tf-privacy-ftrl --profile quick --seed $s --report "
        "correct-$s.json; dpverify audit tf-privacy-ftrl-no-restart tf-privacy-ftrl-one-epoch-noise --profile quick "
        "--seed $s --worlds none --report variants-$s.json; done` (OMP_NUM_THREADS=1), then `PYTHONPATH=$PWD:$PWD/plugins "
        ".venvs/torch/bin/python benchmarks/tf_privacy_ftrl.py correct-*.json variants-*.json`",
        "- device: 2-core CPU (shared with other sessions)",
        "",
        f"## Numpy ceiling ({args.canaries} simulated canaries, half members)",
        "",
        f"One-run audit: σ = {SIGMA}, {ONE_RUN_STEPS} full-batch steps. Every-update audit: {epochs} epochs of P = "
        f"{period} steps, σ = {sigma:.3f} (target ε {EVERY_UPDATE_EPOCHS_SETTING['epsilon']:g}).",
        "",
        "| implementation | one-run: claimed μ | final-model μ | ratio | every-update: claimed μ | audit's score | "
        "ratio | knowing each place | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    shares = {}
    for name in RUNS:
        claimed, final = one_run_row(name)
        every_claimed, score, known = every_update_row(name, canaries=args.canaries, rng=rng)
        shares[name] = (score / every_claimed, known / every_claimed)
        lines.append(
            f"| `{name}` | {claimed:.3f} | {final:.3f} | {final / claimed:.2f} | {every_claimed:.3f} | {score:.3f} | "
            f"{score / every_claimed:.2f} | {known:.3f} | {known / every_claimed:.2f} |"
        )
    reading = "\n".join(READING).format(
        claimed=correlated.tree_restart_claimed_mu(noise_multiplier=sigma, epoch_steps=[period] * epochs),
        correct_share=shares["tf-privacy-ftrl"][0], known_share=shares["tf-privacy-ftrl"][1],
        no_restart_share=shares["tf-privacy-ftrl-no-restart"][0], one_epoch_share=shares["tf-privacy-ftrl-one-epoch-noise"][0],
        cpu=args.cpu,
    )  # fmt: skip
    lines += ["", "## Every gate audit over seeds", "", *table(args.reports), "", reading, ""]
    write_table(args.out, lines, started=started)


if __name__ == "__main__":
    main()
