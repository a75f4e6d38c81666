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

from dpverify.releases import Library, parse_version
from dpverify.releases import installed_release as installed

__all__ = ["LIBRARY", "POISSON_IN_FIT_FIRST", "installed_version", "missing_path", "missing_since_2", "parse_version"]

#: What dpverify gates of JAX-Privacy (:mod:`dpverify.releases`): 1.0.0 and 2.0.0 (the plugin resolves their
#: calls in ``_api.py``), in the jax family's environment. 1.0.0's wheel pins jax and jaxlib 0.6.2 and
#: more-itertools 10.1.0, imports chex without declaring it (0.1.90: the last chex for jax < 0.7) and its Keras
#: API calls a Keras-internal method (``_enforce_jax_state_sharding``) that Keras 3.12 removed, so its
#: environment has those pins and Keras 3.11.3 in place of the family's.
LIBRARY = Library(
    package="jax-privacy", extra="jax-privacy", family="jax", constraints="constraints-jax.txt",
    implementations="jax-privacy-*", versions=("1.0.0", "2.0.0"),
    pins=(("1.0.0", ("jax==0.6.2", "jaxlib==0.6.2", "more-itertools==10.1.0", "chex==0.1.90", "keras==3.11.3")),),
)

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


def missing_since_2(name: str, needs: str) -> str | None:
    """``n/a`` with the reason for a path written against 2.0.0's API (``needs``) on an earlier installed
    release, or ``None``: 1.0.0 has no execution plan, and its batch selection and noise addition live in
    other modules with other signatures (``experimental.batch_selection``, the ``noise_addition`` package)."""
    version = installed_version()
    if version is None or version >= (2,):
        return None
    from importlib import metadata

    return f"n/a: {name} needs {needs} (first in JAX-Privacy 2.0.0); installed: JAX-Privacy {metadata.version('jax-privacy')}"
