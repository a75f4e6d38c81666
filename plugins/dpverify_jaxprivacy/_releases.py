"""Which of the plugin's JAX-Privacy paths each release has (1.0.0 and 2.0.0). Imports neither jax nor
jax_privacy, so the registry and the tests can ask it about any release; :mod:`._api` resolves the calls.

Read in each release's wheel:

- both: ``jax_privacy.clipped_grad`` (1.0.0's ``experimental/gradient_clipping.py``; the same signature,
  ``rescale_to_unit_norm``, ``normalize_by``, ``microbatch_size``, ``is_padding_example`` at call time),
  ``noise_addition.gaussian_privatizer``, Poisson sampling (``CyclicPoissonSampling``), the accountant
  (``accounting.analysis.DpsgdTrainingAccountant``, PLD) and a Keras API (``make_private``, ``DPKerasConfig``).
- 1.0.0's Keras API (``jax_privacy.keras.keras_api``) has no ``poisson_sampling_in_fit``: its ``fit`` trains on
  the batches it is given, fixed-size ones, and its train step clips and noises with
  ``dp_sgd.gradients.DpsgdGradientComputer``, calling neither ``clipped_grad`` nor ``gaussian_privatizer``.
  So the Keras paths that sample Poisson batches in ``fit`` (``jax-privacy-keras``, its accumulation call
  and its variants, which change those two calls) are ``n/a`` there; its one Keras path is the fixed-batch
  one (``jax-privacy-keras-fixed-batches``).
"""

from __future__ import annotations

from dpverify.releases import installed_release as installed
from dpverify.releases import parse_version

__all__ = ["POISSON_IN_FIT_FIRST", "installed_version", "missing_path", "parse_version"]

#: The first release whose Keras API samples Poisson batches in ``fit`` (``poisson_sampling_in_fit``) and
#: clips and noises with ``clipped_grad`` and ``gaussian_privatizer``.
POISSON_IN_FIT_FIRST = (2,)


def installed_version() -> tuple[int, ...] | None:
    """The installed JAX-Privacy release, or ``None`` when it is not installed."""
    return installed("jax-privacy")


def missing_path(version: tuple[int, ...], path: str, *, poisson_in_fit: bool, variant: bool) -> str | None:
    """Why release ``version`` has no such path, or ``None``: the Keras API's Poisson sampling in ``fit``, or
    a variant of the Keras API's ``clipped_grad``/``gaussian_privatizer`` calls, before 2.0.0."""
    if path != "keras" or version >= POISSON_IN_FIT_FIRST:
        return None
    if variant:
        return (
            "the Keras API's calls of clipped_grad and gaussian_privatizer, which this variant changes (first in "
            "JAX-Privacy 2.0.0; before, its Keras train step clips and noises with dp_sgd's DpsgdGradientComputer)"
        )
    if poisson_in_fit:
        return (
            "Poisson sampling in the Keras API's fit (DPKerasConfig.poisson_sampling_in_fit, first shipped in "
            "JAX-Privacy 2.0.0; before, fit trains on the fixed-size batches it is given)"
        )
    return None
