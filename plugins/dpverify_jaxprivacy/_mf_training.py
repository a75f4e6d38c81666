"""Matrix-factorization training on JAX-Privacy's core API (imports jax and jax_privacy): fixed cyclic batches,
the clipped sum, and a dense ``noise_addition.matrix_factorization_privatizer``.

The privatizer is the library's own, built inside the traced step from the noising matrix (a constant of the
trace: the library takes a concrete array, not a traced one), the stddev and the key (the step's arguments): one
trace serves every run of a configuration (model, clip norm, padded batch shape, noising matrix), whatever its σ
or seed. Its state is the step index the dense privatizer
keeps; its noise at step t is the library's Σ_j C⁻¹[t, j]·normal(fold_in(key, j)) times the stddev, so the
whole run's noise is one draw of C⁻¹Z. The clipped sum, the model, the padding and the update are the core
path's (:mod:`._core`); the parameters before the first step and after each go to ``observe_update``.
"""

from __future__ import annotations

import functools
from typing import Callable

from dpverify_jaxprivacy._jax import jax, jnp

import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax_privacy import batch_selection, noise_addition  # noqa: E402

from dpverify.contract import TrainingRequest, hand_over_kernels  # noqa: E402
from dpverify.seeds import seeds_for  # noqa: E402
from dpverify_jaxprivacy import _api  # noqa: E402
from dpverify_jaxprivacy._core import MICROBATCH, designated_model, make_step, padding_multiple  # noqa: E402

__all__ = ["cyclic_batches", "run_steps", "train_with_privatizer"]


def cyclic_batches(*, num_examples: int, cycle_length: int, iterations: int, rng: int):
    """The library's fixed order over several epochs: ``CyclicPoissonSampling(sampling_prob=1, cycle_length=b,
    partition_type=INDEPENDENT)``, each record in one of b groups drawn independently, a group every b steps."""
    sampler = batch_selection.CyclicPoissonSampling(
        sampling_prob=1.0,
        iterations=iterations,
        cycle_length=cycle_length,
        partition_type=batch_selection.PartitionType.INDEPENDENT,
    )
    return sampler.batch_iterator(num_examples, rng=rng)


@functools.lru_cache(maxsize=32)
def _traced_step(clip_norm: float, microbatch_size: int, forward: Callable, matrix: tuple[tuple[int, ...], bytes]):
    """The clipped sum's ``l2_norm_bound`` and the jitted step (params, noise state, x, y, padding, stddev, key,
    scale) -> (params, noise state) with the noising matrix ``matrix`` (its shape and float32 bytes)."""
    shape, data = matrix
    noising_matrix = jnp.asarray(np.frombuffer(data, dtype=np.float32).reshape(shape))
    step = make_step("correct", clip_norm=clip_norm, batch_size=1.0, architecture=None)

    def example_loss(params, features, labels):
        return optax.softmax_cross_entropy_with_integer_labels(forward(params, features), labels).sum()

    clipped_sum = step.clipped_grad(
        example_loss, l2_clip_norm=clip_norm, rescale_to_unit_norm=True, batch_argnums=(1, 2), microbatch_size=microbatch_size
    )

    @jax.jit
    def dp_step(params, noise_state, features, labels, is_padding, stddev, key, scale):
        grads = clipped_sum(params, features, labels, is_padding_example=is_padding)
        privatizer = noise_addition.matrix_factorization_privatizer(noising_matrix, stddev=stddev, prng_key=key)
        noisy, noise_state = privatizer.update(grads, noise_state)
        return jax.tree.map(lambda p, g: p - scale * g, params, noisy), noise_state

    return clipped_sum.l2_norm_bound, dp_step


def train_with_privatizer(
    request: TrainingRequest, *, noising_matrix, stddev_per_bound: float, cycle_length: int
) -> Callable[[np.ndarray], np.ndarray]:
    """Train the designated model for the request's steps on fixed cyclic batches (:func:`cyclic_batches`) with
    the dense ``matrix_factorization_privatizer(noising_matrix, stddev=stddev_per_bound · l2_norm_bound)``;
    the black box. ``noising_matrix`` is handed to the privatizer as it is, whatever its rows."""
    hp = request.hyperparameters
    normaliser = hp.normaliser(request.num_records)
    model = designated_model(request)
    seeds = seeds_for(request.seed)
    params = model.init_params(request, seeds.init)
    key = jax.random.key(seeds.noise)
    noise_state = noise_addition.matrix_factorization_privatizer(noising_matrix, stddev=0.0, prng_key=key).init(params)
    matrix = np.asarray(noising_matrix, dtype=np.float32)
    matrix = (matrix.shape, matrix.tobytes())
    scale = jnp.float32(hp.learning_rate * hp.max_grad_norm / normaliser)
    batches = cyclic_batches(num_examples=request.num_records, cycle_length=cycle_length, iterations=hp.steps, rng=seeds.sampling)

    def step_for(microbatch_size: int):
        bound, dp_step = _traced_step(float(hp.max_grad_norm), microbatch_size, model.logits, matrix)
        stddev = jnp.float32(stddev_per_bound * bound)
        return lambda p, state, x, y, padding: dp_step(p, state, x, y, padding, stddev, key, scale)

    return run_steps(request, model=model, params=params, noise_state=noise_state, batches=batches, step_for=step_for)


def run_steps(request: TrainingRequest, *, model, params, noise_state, batches, step_for: Callable) -> Callable[[np.ndarray], np.ndarray]:
    """Train over ``batches`` as the core path pads them (an empty batch: one all-padding block, the step's
    noise only), each step ``step_for(microbatch_size)``'s (params, noise state, x, y, padding) -> (params,
    noise state); the parameters go to ``observe_update`` before the first step and after each; the black box.
    The matrix-factorization paths' one loop (dense privatizer here, the BandMF plan in :mod:`._bandmf`)."""
    steps = request.hyperparameters.steps
    features, labels = request.features, request.labels
    hand_over_kernels(request, 0, lambda: model.order(params))
    for taken, batch in enumerate(batches, start=1):
        batch = np.asarray(batch, dtype=np.int64)
        padded = _api.pad(batch, padding_multiple(batch.size))
        if padded.size == 0:
            padded = np.full(padding_multiple(0), -1, dtype=np.int64)
        is_padding = padded < 0
        dp_step = step_for(min(MICROBATCH, padding_multiple(batch.size)))
        rows = np.where(is_padding, 0, padded)
        params, noise_state = dp_step(params, noise_state, features[rows], labels[rows], is_padding)
        hand_over_kernels(request, taken, lambda: model.order(params))
        if request.progress is not None:
            request.progress(taken, steps)
    return model.black_box(params)
