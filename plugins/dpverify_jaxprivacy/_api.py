"""The installed JAX-Privacy release's calls, under one name each (imports jax_privacy): where 1.0.0 and 2.0.0
differ, the difference is here and nowhere else (:mod:`._releases` says which paths each release has).

Read in both wheels:

- Poisson sampling: 2.0.0's ``batch_selection.CyclicPoissonSampling(sampling_prob, iterations)`` takes the
  dataset size in ``batch_iterator(num_examples, rng=)`` and pads with ``pad_to_multiple_of``; 1.0.0's
  (``jax_privacy.experimental.batch_selection``) takes ``num_examples`` in the constructor, and pads with
  ``split_and_pad_global_batch`` (one minibatch of the padded size).
- Noise: 2.0.0's ``gaussian_privatizer(stddev=, prng_key=)`` is an optax-style transformation whose state holds
  the key (``init``, ``update``); 1.0.0's ``gaussian_privatizer(noise_key=, stddev=)`` is a
  ``GradientPrivatizer`` whose state is a step index, the key bound at construction (``init``, ``privatize``).
  Both add N(0, stddev²) to every coordinate.
- ``clipped_grad``: the same call in both (``jax_privacy.clipped_grad``); its result, a frozen
  ``BoundedSensitivityCallable``, and ``clip_pytree``, which it looks up when it clips, live in
  ``jax_privacy.clipping`` (2.0.0) or ``jax_privacy.experimental.clipping`` (1.0.0): :data:`clipping`.
- Keras: ``jax_privacy.keras_api`` (2.0.0) or ``jax_privacy.keras.keras_api`` (1.0.0), whose ``DPKerasConfig``
  has neither ``poisson_sampling_in_fit`` nor ``microbatch_size``, and whose model clips and noises with the
  ``dp_sgd`` gradient computer it builds, which holds its noise multiplier (σ/√accumulation steps), where
  2.0.0's calls ``clipped_grad`` and ``gaussian_privatizer`` and has ``get_noise_multiplier()``.
"""

from __future__ import annotations

import copy
import math
from typing import Iterator

import jax_privacy
import numpy as np
from jax_privacy import noise_addition

from dpverify_jaxprivacy._releases import POISSON_IN_FIT_FIRST, parse_version

if parse_version(jax_privacy.__version__) >= POISSON_IN_FIT_FIRST:
    from jax_privacy import batch_selection, clipping, keras_api

    RELEASE_2 = True
else:
    from jax_privacy.experimental import batch_selection, clipping
    from jax_privacy.keras import keras_api

    RELEASE_2 = False

__all__ = [
    "GAUSSIAN_PRIVATIZER", "add_noise", "clipping", "keras_api", "keras_fields", "noise_multiplier", "noise_state", "pad",
    "poisson_batches", "without_noise",
]  # fmt: skip

#: The library's own privatizer, kept before :func:`dpverify_jaxprivacy._steps.library_calls` ever replaces it.
GAUSSIAN_PRIVATIZER = noise_addition.gaussian_privatizer


def poisson_batches(*, num_examples: int, sampling_prob: float, iterations: int, rng: int) -> Iterator[np.ndarray]:
    """``CyclicPoissonSampling`` (cycle length 1): ``iterations`` batches, each record in each with
    probability ``sampling_prob``."""
    if RELEASE_2:
        sampler = batch_selection.CyclicPoissonSampling(sampling_prob=sampling_prob, iterations=iterations)
        return sampler.batch_iterator(num_examples, rng=rng)
    sampler = batch_selection.CyclicPoissonSampling(num_examples=num_examples, sampling_prob=sampling_prob, iterations=iterations)
    return sampler.batch_iterator(rng=rng)


def pad(batch: np.ndarray, multiple: int) -> np.ndarray:
    """``batch`` padded with -1 to a multiple of ``multiple`` (an empty batch stays empty on 2.0.0 and becomes
    one block of padding on 1.0.0)."""
    if RELEASE_2:
        return batch_selection.pad_to_multiple_of(batch, multiple)
    size = max(1, -(-batch.size // multiple)) * multiple
    return batch_selection.split_and_pad_global_batch(batch, minibatch_size=size)[0]


def noise_state(params, key):
    """The Gaussian privatizer's state for ``params``, its noise drawn from ``key``."""
    if RELEASE_2:
        return GAUSSIAN_PRIVATIZER(stddev=0.0, prng_key=key).init(params)
    return key, GAUSSIAN_PRIVATIZER(noise_key=key, stddev=0.0).init(params)


def add_noise(grads, state, stddev):
    """``grads`` plus the privatizer's Gaussian noise of standard deviation ``stddev``, and the next state
    (traceable: ``stddev`` and the state may be traced values)."""
    if RELEASE_2:  # the update reads only the state it is given, never the key the privatizer was built with
        return GAUSSIAN_PRIVATIZER(stddev=stddev, prng_key=0).update(grads, state)
    key, index = state
    noisy, index = GAUSSIAN_PRIVATIZER(noise_key=key, stddev=stddev).privatize(sum_of_clipped_grads=grads, noise_state=index)
    return noisy, (key, index)


def keras_fields(*, poisson_in_fit: bool, microbatch_size: int) -> dict:
    """The ``DPKerasConfig`` fields that only 2.0.0 has; a ValueError for Poisson sampling in ``fit`` on 1.0.0
    (that path is ``n/a`` there, never called)."""
    if RELEASE_2:
        return dict(poisson_sampling_in_fit=poisson_in_fit, microbatch_size=microbatch_size)
    if poisson_in_fit:
        raise ValueError(f"JAX-Privacy {jax_privacy.__version__}'s Keras API has no Poisson sampling in fit")
    return {}


def noise_multiplier(model) -> float:
    """The noise multiplier a private Keras model trains with (calibrated when its config left it unset)."""
    if RELEASE_2:
        return float(model.get_noise_multiplier())
    per_batch = model._gradient_computer._noise_multiplier  # σ/√(accumulation steps), as make_private set it
    return float(per_batch) * math.sqrt(model._dp_params.gradient_accumulation_steps)


def without_noise(model) -> None:
    """A private Keras model's DP step without noise (both releases' ``DPKerasConfig`` refuse σ = 0). 2.0.0's
    train step calls ``gaussian_privatizer``, which the no-noise step replaces (:func:`._steps.library_calls`):
    nothing to do here. 1.0.0's calls its model's ``dp_sgd`` gradient computer, whose noise multiplier 0 adds
    none (``optim.compute_noise_std``): the model gets a copy with that."""
    if not RELEASE_2:
        silent = copy.copy(model._gradient_computer)
        silent._noise_multiplier = 0.0
        model._gradient_computer = silent
