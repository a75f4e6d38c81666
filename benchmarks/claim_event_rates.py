"""Refutation rates of event claims (PrivacyClaim.dp_event) through the two-world audit, per relation: the
full-batch Gaussian mechanism (tests/doubles.py's WorldGaussianMechanism) claiming its own σ (truth) and twice
it (too strong), on the worst-case-record world, 200 runs per world, level 0.05, seeds 0..N-1; the audit's
default curve (a full-batch event claim's own, by dp_accounting's PLD).

Usage: KERAS_BACKEND=jax PYTHONPATH=.:plugins .venvs/jax/bin/python benchmarks/claim_event_rates.py SEEDS [FACTOR ...]
(the claimed σ over the true one; default 1 and 2)
"""

from __future__ import annotations

import sys

from scipy import stats

from dpverify.audits.two_world import run_two_world_audit
from dpverify.canaries.worlds import worst_case_record_worlds
from dpverify.contract import DPHyperparameters
from tests.doubles import WorldGaussianMechanism

SIGMA = {"add_remove": 0.5, "replace_one": 1.0}
CASES = [("add_remove", "add_remove"), ("replace_one", "replace_one"), ("zero_out", "replace_one")]


def interval(k: int, n: int) -> tuple[float, float]:
    low = 0.0 if k == 0 else stats.beta.ppf(0.025, k, n - k + 1)
    high = 1.0 if k == n else stats.beta.ppf(0.975, k + 1, n - k)
    return low, high


def main(seeds: int, factors: tuple[float, ...]) -> None:
    print("| claim relation | world | claimed σ / true σ | refuted | of | 95 % CP interval | verdicts |")
    print("|---|---|---|---|---|---|---|")
    for claimed, world in CASES:
        sigma = SIGMA[world]
        for factor in factors:
            verdicts = [
                run_two_world_audit(
                    WorldGaussianMechanism(noise_multiplier=sigma, claimed_noise=factor * sigma, relation=claimed),
                    world=worst_case_record_worlds(relation=world, records=2),
                    runs=200,
                    hyperparameters=DPHyperparameters(noise_multiplier=sigma, sampling_rate=1.0, epochs=1, delta=1e-5),
                    seed=seed,
                ).verdict
                for seed in range(seeds)
            ]
            k = verdicts.count("violation")
            low, high = interval(k, seeds)
            counts = ", ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts)))
            print(f"| {claimed} | {world} | {factor:g} | {k} | {seeds} | [{low:.2f}, {high:.2f}] | {counts} |", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), tuple(float(f) for f in sys.argv[2:]) or (1.0, 2.0))
