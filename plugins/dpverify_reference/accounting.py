"""The reference implementation's accountant: Google's ``dp_accounting`` (not dpverify's own code).

DP-SGD with Poisson sampling is ``steps`` self-compositions of a Poisson-subsampled Gaussian mechanism,
add/remove neighbouring relation.

Both ε are pure functions of (σ, q, steps, δ) and cost up to a second or two each (the PLD at q = 1), far
more than a small model's training: they are memoised per process, so a two-world audit's thousands of
runs with one claim compute it once.
"""

from __future__ import annotations

import functools
import math

RDP_NAME = "dp_accounting.rdp"
PLD_NAME = "dp_accounting.pld"


def _event(noise_multiplier: float, sampling_rate: float, steps: int):
    import dp_accounting

    step = dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def _epsilon(kind: str, noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    from dp_accounting import pld, rdp

    if noise_multiplier == 0.0:
        return math.inf
    accountant = rdp.RdpAccountant() if kind == "rdp" else pld.PLDAccountant()
    accountant.compose(_event(noise_multiplier, sampling_rate, steps))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=1024)
def rdp_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """ε of DP-SGD by the RDP accountant of ``dp_accounting`` (add/remove); ``inf`` without noise."""
    return _epsilon("rdp", noise_multiplier, sampling_rate, steps, delta)


@functools.lru_cache(maxsize=1024)
def pld_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """ε by the privacy-loss-distribution accountant of ``dp_accounting`` (tighter than RDP)."""
    return _epsilon("pld", noise_multiplier, sampling_rate, steps, delta)


def calibrate_noise_multiplier(
    target_epsilon: float, sampling_rate: float, steps: int, delta: float, *, rtol: float = 0.005
) -> float:
    """A σ whose RDP ε lies in ``[(1 - rtol) * target_epsilon, target_epsilon]``.

    ε(σ) is continuous and decreasing: bracket the target by stepping log σ, then solve
    ε(σ) = (1 - rtol/2)·target by regula falsi (Illinois) on log σ, stopping inside the band; each
    accountant call costs up to ~0.3 s. Raises ``ValueError`` if no σ ≤ 1e6 reaches the target."""
    if target_epsilon <= 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon}")
    aim, slack = (1.0 - 0.5 * rtol) * target_epsilon, 0.5 * rtol * target_epsilon

    def excess(log_sigma: float) -> float:
        return rdp_epsilon(math.exp(log_sigma), sampling_rate, steps, delta) - aim

    low, high = 0.0, 0.0  # log σ with excess(low) > 0 >= excess(high)
    f_low = f_high = excess(0.0)
    while f_high > 0:
        low, f_low = high, f_high
        high += math.log(4.0)
        if high > math.log(1e6):
            raise ValueError(f"no noise multiplier up to 1e6 reaches ε = {target_epsilon} at δ = {delta}")
        f_high = excess(high)
    while f_low <= 0:
        if abs(f_low) <= slack:
            return math.exp(low)
        high, f_high = low, f_low
        low -= math.log(4.0)
        if low < math.log(1e-3):
            raise ValueError(f"ε = {target_epsilon} is beyond what σ >= 1e-3 gives; ask for σ = 0 instead")
        f_low = excess(low)
    if abs(f_high) <= slack:
        return math.exp(high)
    side = 0
    for _ in range(100):
        middle = (low * f_high - high * f_low) / (f_high - f_low)
        f_middle = excess(middle)
        if abs(f_middle) <= slack:
            return math.exp(middle)
        if f_middle > 0:
            low, f_low = middle, f_middle
            if side == 1:
                f_high /= 2.0
            side = 1
        else:
            high, f_high = middle, f_middle
            if side == -1:
                f_low /= 2.0
            side = -1
    raise RuntimeError(f"calibration to ε = {target_epsilon} did not converge")  # pragma: no cover
