"""TF-Privacy's own accountant, as TF-Privacy itself calls it (imports tensorflow_privacy).

The claim is ``tensorflow_privacy.compute_dp_sgd_privacy``: dp_accounting's ``RdpAccountant`` over
TF-Privacy's list of RDP orders, composing ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` ``steps``
times, add/remove-one adjacency. Calibration is TF-Privacy's ``compute_noise`` (``compute_noise_from_budget_lib``):
the same accountant and event, solved for σ with ``dp_accounting.calibrate_dp_mechanism``.

Both functions take TF-Privacy's own arguments ``(n, batch_size, epochs)`` and derive
``q = batch_size / n`` and ``steps = ceil(epochs * n / batch_size)``. :func:`tf_privacy_arguments`
chooses them so that q and the step count are exactly the run's (``n = 1``, ``batch_size = q``, and
``epochs`` nudged by an ulp where ``steps * q / q`` rounds across an integer).

``compute_dp_sgd_privacy`` is deprecated upstream because it "does not account for doubling of sensitivity
with microbatching": that caveat applies to microbatches of more than one example. Here every microbatch
is one example (``num_microbatches`` = the batch size), so no doubling is due.

Both functions are pure in their arguments; the claim's 1–2 ms were a fifth to a third of a small run that
reuses its traced step (~6 ms): they are memoised per process, so a two-world audit's thousands of runs
with one claim compute it once.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math

from dpverify_tfprivacy import _tf  # noqa: F401  (first: tensorflow without its CUDA-factory noise)

from absl import logging as absl_logging
from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib, compute_noise_from_budget_lib

from dpverify.contract import PrivacyClaim

ACCOUNTANT = "tensorflow_privacy.compute_dp_sgd_privacy (dp_accounting RDP, Poisson-subsampled Gaussian)"

__all__ = ["ACCOUNTANT", "tf_privacy_arguments", "tf_privacy_epsilon", "calibrate_noise_multiplier", "claim"]


def tf_privacy_arguments(sampling_rate: float, steps: int) -> tuple[float, float, float]:
    """``(n, batch_size, epochs)`` for which TF-Privacy's functions use exactly ``q`` and ``steps``."""
    n, batch_size = 1.0, float(sampling_rate)
    epochs = steps * batch_size
    for _ in range(8):
        taken = math.ceil(epochs * n / batch_size)
        if taken == steps:
            return n, batch_size, epochs
        epochs = math.nextafter(epochs, 0.0 if taken > steps else math.inf)
    raise ArithmeticError(f"no epochs value makes TF-Privacy count exactly {steps} steps at q={sampling_rate}")


@contextlib.contextmanager
def _quiet():
    """Silence TF-Privacy's deprecation log line and the prints of ``compute_noise``."""
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        absl_logging.set_verbosity(verbosity)


@functools.lru_cache(maxsize=1024)
def tf_privacy_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> float:
    """ε (add/remove) that TF-Privacy states for ``steps`` Poisson-sampled Gaussian steps; ∞ when σ = 0."""
    n, batch_size, epochs = tf_privacy_arguments(sampling_rate, steps)
    with _quiet():
        epsilon, _order = compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy(
            n, batch_size, float(noise_multiplier), epochs, float(delta)
        )
    return float(epsilon)


@functools.lru_cache(maxsize=1024)
def calibrate_noise_multiplier(target_epsilon: float, sampling_rate: float, steps: int, delta: float) -> float:
    """σ from TF-Privacy's ``compute_noise`` for ``target_epsilon``; its result must reproduce the target
    within 1 % under :func:`tf_privacy_epsilon`, else ``ArithmeticError``."""
    n, batch_size, epochs = tf_privacy_arguments(sampling_rate, steps)
    noise_lbd = 0.3
    while True:
        # compute_noise returns 0 when its lower bracket noise_lbd already meets the target.
        with _quiet():
            sigma = compute_noise_from_budget_lib.compute_noise(
                n, batch_size, float(target_epsilon), epochs, float(delta), noise_lbd
            )
        if sigma > 0:
            break
        if noise_lbd < 1e-4:
            raise ArithmeticError(f"target ε = {target_epsilon} is met by every noise multiplier ≥ 1e-4")
        noise_lbd /= 4
    epsilon = tf_privacy_epsilon(sigma, sampling_rate, steps, delta)
    if not abs(epsilon - target_epsilon) <= 0.01 * target_epsilon:
        raise ArithmeticError(
            f"TF-Privacy's compute_noise gave σ = {sigma} whose ε = {epsilon} is not within 1 % of {target_epsilon}"
        )
    return float(sigma)


def claim(noise_multiplier: float, sampling_rate: float, steps: int, delta: float) -> PrivacyClaim:
    """The add/remove claim TF-Privacy's accountant states for the run."""
    return PrivacyClaim(
        epsilon=tf_privacy_epsilon(noise_multiplier, sampling_rate, steps, delta),
        delta=delta,
        accountant=ACCOUNTANT,
        noise_multiplier=float(noise_multiplier),
        sampling_rate=float(sampling_rate),
        steps=int(steps),
        relation="add_remove",
    )
