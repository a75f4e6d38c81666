"""JAX-Privacy's own accountant, as its Keras API calls it (imports jax_privacy).

The claim is ``jax_privacy.accounting.DpsgdTrainingAccountant`` with the PLD accountant at the value
discretisation the Keras API uses (1e-3): ``steps`` compositions of ``PoissonSampledDpEvent(q,
GaussianDpEvent(σ))``, add/remove adjacency, q = ``batch_size / num_samples``. Calibration is the
library's ``calibrate_noise_multiplier`` against the same accountant.

The accountant takes integers (a batch size and a dataset size), not a rate: :func:`batch_and_size` writes
the request's q as the exact integer ratio the accountant then divides back. Both functions are pure and
memoised per process (a two-world audit's hundreds of runs share one claim).
"""

from __future__ import annotations

import fractions
import functools

from jax_privacy.accounting import accountants, analysis, calibrate

from dpverify.contract import PrivacyClaim

ACCOUNTANT = "jax_privacy.accounting.DpsgdTrainingAccountant (dp_accounting PLD, value discretisation 1e-3)"

__all__ = ["ACCOUNTANT", "accountant", "batch_and_size", "epsilon", "calibrate_noise_multiplier", "claim"]


@functools.cache
def accountant() -> analysis.DpsgdTrainingAccountant:
    """The accountant of JAX-Privacy's Keras API (``DPKerasConfig._accountant``)."""
    return analysis.DpsgdTrainingAccountant(
        dp_accountant_config=accountants.PldAccountantConfig(value_discretization_interval=1e-3)
    )


def batch_and_size(sampling_rate: float) -> tuple[int, int]:
    """``(batch_size, num_samples)``, the smallest integers up to 1e9 whose float ratio is ``sampling_rate``
    exactly (the accountant computes q as batch_size / num_samples)."""
    ratio = fractions.Fraction(sampling_rate).limit_denominator(10**9)
    if ratio.numerator / ratio.denominator != sampling_rate:
        raise ValueError(f"sampling_rate {sampling_rate!r} is no ratio of integers up to 1e9")
    return ratio.numerator, ratio.denominator


@functools.lru_cache(maxsize=256)
def epsilon(noise_multiplier: float, batch_size: int, num_samples: int, steps: int, delta: float) -> float:
    """ε of ``steps`` DP-SGD steps at q = batch_size/num_samples by JAX-Privacy's accountant."""
    params = analysis.DpParams(
        noise_multipliers=noise_multiplier, batch_size=batch_size, num_samples=num_samples, delta=delta
    )
    return float(accountant().compute_epsilon(steps, params))


@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(target_epsilon: float, batch_size: int, num_samples: int, steps: int, delta: float) -> float:
    """The σ JAX-Privacy's calibration gives for ``target_epsilon`` (its ``DPKerasConfig`` does the same
    when ``noise_multiplier`` is left unset)."""
    return float(
        calibrate.calibrate_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            accountant=accountant(),
            batch_sizes=batch_size,
            num_updates=steps,
            num_samples=num_samples,
        )
    )


def claim(
    noise_multiplier: float, sampling_rate: float, steps: int, delta: float, *, batch_size: int | None = None, num_samples: int | None = None
) -> PrivacyClaim:
    """What JAX-Privacy states for a run of ``steps`` steps at q and σ (infinite ε without noise). The
    accountant is given ``batch_size`` and ``num_samples`` when the trainer had them (the Keras API), else the
    integers of :func:`batch_and_size`."""
    if batch_size is None or num_samples is None:
        batch_size, num_samples = batch_and_size(sampling_rate)
    eps = float("inf") if noise_multiplier == 0 else epsilon(noise_multiplier, batch_size, num_samples, steps, delta)
    return PrivacyClaim(
        epsilon=eps,
        delta=delta,
        accountant=ACCOUNTANT,
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        steps=steps,
    )
