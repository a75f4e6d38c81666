"""DP-SGD on JAX-Privacy's core API (imports jax and jax_privacy).

One run: ``batch_selection.CyclicPoissonSampling`` (cycle length 1: Poisson sampling with rate q, exactly
``steps`` batches) draws each step's records; the batch is padded (``pad_to_multiple_of``, 1.0.0: ``split_and_pad_global_batch``; :mod:`._api`; see :func:`padding_multiple`) and
the padding marked with ``is_padding_example``, so one traced step serves a range of batch sizes; ``clipped_grad`` sums the per-example gradients of the designated model (:func:`designated_model`: softmax regression, the MLP or a layer design's, :mod:`._layers`), each
clipped to C and rescaled to unit norm; ``gaussian_privatizer(stddev=σ · l2_norm_bound)`` adds the noise; the
update is ``lr · C · noisy sum / normaliser`` (the C undoes the unit rescale, so the update is the designated
one: lr times the noisy sum of rows clipped to C, over the public normaliser).

The traced step depends only on the configuration (model shape, C, the variant), never on a run's data or
seed: it is built once per configuration and process and reused by every run, which is what makes a
two-world audit's hundreds of tiny runs cost milliseconds each. Each run gets its own privatizer state, a
PRNG key derived from its seed. The parameters before the first step and after each go to the request's
``observe_update`` when it has one (kernels transposed to the designated (outputs, inputs)).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from dpverify_jaxprivacy._jax import jax, jnp

import numpy as np  # noqa: E402
import optax  # noqa: E402
from scipy.special import log_softmax  # noqa: E402

from dpverify.contract import LayerArchitecture, TrainingRequest, hand_over_kernels  # noqa: E402
from dpverify.seeds import seeds_for  # noqa: E402
from dpverify_jaxprivacy import _api  # noqa: E402
from dpverify_jaxprivacy._steps import DP_STEPS, DPStep  # noqa: E402

__all__ = [
    "LAYER_ORDER", "layer_order", "padding_multiple", "init_params", "logits", "black_box", "Model", "MLP",
    "designated_model", "make_step", "train_core",
]  # fmt: skip

def padding_multiple(batch_size: int) -> int:
    """What a batch of ``batch_size`` records is padded to a multiple of: 64, or a quarter of the largest power
    of two below it, so at most four padded sizes serve each octave of batch sizes (a traced step costs
    seconds to compile, a padded row a fraction of a millisecond; a full-batch run of N ≈ 1250 ± 25 canaries
    is padded to 1280, sometimes 1536, instead of a new size per run)."""
    return max(64, 2 ** max(0, int(batch_size).bit_length() - 3))


def init_params(request: TrainingRequest, seed: int) -> dict[str, jax.Array]:
    """The designated model's parameters: softmax regression (one affine layer) starting at zero, or the
    ``d -> h -> C`` ReLU MLP with Glorot-uniform kernels and zero biases (Keras' default initialisation)."""
    if request.num_tags:
        raise ValueError("the JAX-Privacy trainers take no UniAud++ tags; audit them with the synthetic designs")
    d, c, h = request.dimension, request.num_classes, request.architecture.hidden_width
    if request.architecture.is_softmax_regression:
        return {"w": jnp.zeros((d, c), jnp.float32), "b": jnp.zeros((c,), jnp.float32)}
    glorot = jax.nn.initializers.glorot_uniform()
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {
        "w1": glorot(k1, (d, h), jnp.float32),
        "b1": jnp.zeros((h,), jnp.float32),
        "w": glorot(k2, (h, c), jnp.float32),
        "b": jnp.zeros((c,), jnp.float32),
    }


#: The parameters' names from input to output (a jitted step returns the dict with its keys sorted).
LAYER_ORDER = ("w1", "b1", "w", "b")


def layer_order(params: dict[str, jax.Array]) -> list[jax.Array]:
    """The parameters layer by layer from input to output, each kernel before its bias."""
    return [params[name] for name in LAYER_ORDER if name in params]


def logits(params: dict[str, jax.Array], features: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(features @ params["w1"] + params["b1"]) if "w1" in params else features
    return hidden @ params["w"] + params["b"]


def black_box(params: dict[str, jax.Array]) -> Callable[[np.ndarray], np.ndarray]:
    """``predict_log_proba`` of the trained parameters: float32 logits computed in numpy (a jitted forward
    would be traced anew for every query shape), log-softmax in float64 (small gaps between
    log-probabilities are the audit's signal)."""
    weights = {name: np.asarray(value) for name, value in params.items()}

    def predict_log_proba(features: np.ndarray) -> np.ndarray:
        out = np.asarray(features, dtype=np.float32)
        if "w1" in weights:
            out = np.maximum(out @ weights["w1"] + weights["b1"], 0.0)
        return log_softmax((out @ weights["w"] + weights["b"]).astype(np.float64), axis=1)

    return predict_log_proba


@dataclass(frozen=True)
class Model:
    """The designated model's functions: ``init_params(request, seed)``, ``logits(params, features)``,
    ``order(params)`` (the designated order) and ``black_box(params)``."""

    init_params: Callable[[TrainingRequest, int], dict]
    logits: Callable[[dict, jax.Array], jax.Array]
    order: Callable[[dict], list[jax.Array]]
    black_box: Callable[[dict], Callable[[np.ndarray], np.ndarray]]


#: Softmax regression and the MLP.
MLP = Model(init_params=init_params, logits=logits, order=layer_order, black_box=black_box)


def designated_model(request: TrainingRequest) -> Model:
    """:data:`MLP`, or a layer design's model (:class:`dpverify_jaxprivacy._layers.LayerModel`)."""
    if not isinstance(request.architecture, LayerArchitecture):
        return MLP
    return _layer_model(request.architecture)


@functools.lru_cache(maxsize=16)
def _layer_model(architecture: LayerArchitecture) -> Model:
    """One :class:`Model` per layer design and process: its ``logits`` is a traced step's cache key, and bound
    methods of equal objects compare unequal unless the object is the same one."""
    from dpverify_jaxprivacy._layers import LayerModel

    model = LayerModel.of(architecture)
    return Model(init_params=model.init_params, logits=model.logits, order=model.order, black_box=model.black_box)


def make_step(kind: str, *, clip_norm: float, batch_size: float, architecture) -> DPStep:
    """The DP step ``kind``: one of :data:`~dpverify_jaxprivacy._steps.DP_STEPS`, or a layer variant's
    (:data:`dpverify_jaxprivacy._layers.LAYER_STEPS`)."""
    if kind in DP_STEPS:
        return DPStep(kind=kind, clip_norm=clip_norm, batch_size=batch_size)
    from dpverify_jaxprivacy._layers import LAYER_STEPS, layer_step

    if kind not in LAYER_STEPS:
        raise ValueError(f"unknown DP step {kind!r}; expected one of {', '.join(DP_STEPS + tuple(LAYER_STEPS))}")
    return layer_step(kind, clip_norm=clip_norm, batch_size=batch_size, architecture=architecture)


#: ``clipped_grad``'s ``microbatch_size``: per-example gradients are taken this many at a time, in sequence
#: (a third faster on a 2-core CPU than all ~1280 at once: 0.52 against 0.79 s a step, d = 2500, 10 classes).
MICROBATCH = 128


@functools.lru_cache(maxsize=64)
def _traced_step(step: DPStep, microbatch_size: int, forward: Callable = logits):
    """The clipped sum's ``l2_norm_bound`` and the jitted DP step (params, noise state, x, y, padding, stddev,
    scale) -> (params, noise state) of the model ``forward`` (its logits), traced once per variant, model, clip
    norm and microbatch size and padded batch shape: the noise's stddev and the update's scale are arguments,
    so runs with another σ or normaliser reuse it."""

    def example_loss(params, features, labels):
        return optax.softmax_cross_entropy_with_integer_labels(forward(params, features), labels).sum()

    clipped_sum = step.clipped_grad(
        example_loss,
        l2_clip_norm=step.clip_norm,
        rescale_to_unit_norm=True,
        batch_argnums=(1, 2),
        microbatch_size=microbatch_size,
    )

    @jax.jit
    def dp_step(params, noise_state, features, labels, is_padding, stddev, scale):
        grads = clipped_sum(params, features, labels, is_padding_example=is_padding)
        noisy, noise_state = _api.add_noise(grads, noise_state, stddev)
        return jax.tree.map(lambda p, g: p - scale * g, params, noisy), noise_state

    return clipped_sum.l2_norm_bound, dp_step


def train_core(request: TrainingRequest, kind: str, noise_multiplier: float) -> Callable[[np.ndarray], np.ndarray]:
    """Train the designated model with JAX-Privacy's core API and the DP step ``kind``; the black box."""
    hp = request.hyperparameters
    normaliser = hp.normaliser(request.num_records)
    step = make_step(kind, clip_norm=float(hp.max_grad_norm), batch_size=float(normaliser), architecture=request.architecture)
    model = designated_model(request)
    seeds = seeds_for(request.seed)
    params = model.init_params(request, seeds.init)
    noise_state = _api.noise_state(params, jax.random.key(seeds.noise))  # its key drawn from the run's seed
    scale = jnp.float32(hp.learning_rate * hp.max_grad_norm / normaliser)
    batches = _api.poisson_batches(
        num_examples=request.num_records, sampling_prob=hp.sampling_rate, iterations=hp.steps, rng=seeds.sampling
    )
    features, labels = request.features, request.labels
    hand_over_kernels(request, 0, lambda: model.order(params))
    for taken, batch in enumerate(batches, start=1):
        batch = np.asarray(batch, dtype=np.int64)
        padded = _api.pad(batch, padding_multiple(batch.size))
        if padded.size == 0:  # an empty Poisson batch: one all-padding block keeps the step (noise only)
            padded = np.full(padding_multiple(0), -1, dtype=np.int64)
        is_padding = padded < 0
        l2_norm_bound, dp_step = _traced_step(step, min(MICROBATCH, padding_multiple(batch.size)), model.logits)
        stddev = jnp.float32(step.noise_stddev(float(noise_multiplier) * l2_norm_bound))
        rows = np.where(is_padding, 0, padded)
        params, noise_state = dp_step(params, noise_state, features[rows], labels[rows], is_padding, stddev, scale)
        hand_over_kernels(request, taken, lambda: model.order(params))
        if request.progress is not None:
            request.progress(taken, hp.steps)
    return model.black_box(params)
