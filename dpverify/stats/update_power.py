"""What an every-update audit could have caught: whether it refutes a :data:`~dpverify.stats.power.LARGEST_DEFICIT`-fold
noise deficit where its canaries carry a fraction ρ of the claimed signal.

Its score is each canary's likelihood ratio over the steps, not the participation sum that
:func:`~dpverify.stats.power.one_run_catches` simulates, and the two disagree near the edge: at the gate's
every-update setting (16 × 2500 canaries, q = 0.1, 80 steps, σ = 1) the one-run model says a 10× deficit is
caught from ρ = 0.16, where simulated every-update audits refute 0 of 14 (14 of 14 from ρ = 0.2:
benchmarks/results/every-update-power.md).
So the every-update audit's own decision is simulated on its own scores
(:func:`~dpverify.stats.power.every_update_detection` with the signal fraction ρ), seeded so that a
configuration always says the same. No k* is stated for it: none has been checked against its real deficits.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from dpverify.stats.curves import ClaimedRun
from dpverify.stats.power import LARGEST_DEFICIT, POWER, every_update_detection
from dpverify.stats.scoring import GuessRule

__all__ = ["CATCH_AUDITS", "every_update_catches"]

#: Simulated audits that must all refute for a deficit to count as caught: a detection rate of
#: :data:`~dpverify.stats.power.POWER` or less refutes all of them with probability POWER^n ≤ 5 % (n = 14).
CATCH_AUDITS = math.ceil(math.log(0.05) / math.log(POWER))


@functools.lru_cache(maxsize=16)
def every_update_catches(
    run: ClaimedRun,
    *,
    run_sizes: tuple[int, ...],
    guess_rule: GuessRule,
    delta: float,
    confidence: float,
) -> Callable[[float], bool]:
    """``catches(ρ)``: whether the every-update audit of ``run`` (pooled runs of ``run_sizes`` canaries, the
    audit's guess rule and the look's ``confidence``) refutes a :data:`LARGEST_DEFICIT`-fold noise deficit where its
    canaries carry fraction ρ of the claimed signal: :data:`CATCH_AUDITS` simulated audits, stopped at the
    first that does not refute. Detection rises with ρ, so each answer settles every larger ρ (caught) or
    smaller one (missed) without another simulation: asked at ρ's lower limit first, one simulation answers
    :func:`~dpverify.stats.power.measure_power`'s two questions. The same configuration gets the same
    ``catches`` (cached), so the audits of a session that share it (the gate's, of every correct
    implementation) simulate once: about 2 CPU seconds at the gate's setting."""
    truth = run.with_noise(run.noise_multiplier / LARGEST_DEFICIT)
    least_caught, most_missed = math.inf, 0.0

    def catches(fraction: float) -> bool:
        nonlocal least_caught, most_missed
        if fraction >= least_caught:
            return True
        if fraction <= most_missed or run.noise_multiplier == 0:
            return False
        rng = np.random.default_rng(0)
        caught = all(
            every_update_detection(
                run, truth=truth, signal=fraction, run_sizes=run_sizes, guess_rule=guess_rule, delta=delta,
                confidence=confidence, audits=1, rng=rng,
            )  # fmt: skip
            for _ in range(CATCH_AUDITS)
        )
        if caught:
            least_caught = fraction
        else:
            most_missed = fraction
        return caught

    return catches
