"""TF-Privacy's DP Keras model with fast gradient clipping, and its mutations (imports tensorflow).

One DP step is ``train_step`` of the class ``make_dp_model_class(tf.keras.Model)`` builds
(``tensorflow_privacy.privacy.keras_models.dp_keras_model``), given the fast-clipping ``layer_registry``
(``make_default_layer_registry``: ``Dense`` and ``Embedding``). With every trainable layer registered the
model takes TF-Privacy's "fast" path: one forward and backward pass gives each record's gradient norm
from the layers' inputs and output gradients (ghost norms, ``clip_grads.compute_gradient_norms``), a
second backward pass of the loss reweighted by ``C / max(C, norm)`` gives the mean of the clipped rows,
and ``add_aggregate_noise`` adds N(0, (σC/B)²) to that mean, i.e. σC on the sum divided by the realised
batch size B, as the optimizer path does. The designated MLP (``Dense`` layers only, a ``Concatenate``
for UniAud++'s tag head) is fully registered; a model with an unregistered trainable layer is refused
rather than trained on TF-Privacy's slower per-example fallback.

The variants (:data:`FAST_STEPS`) each change one piece of that path: the noise the model adds, the
registry's norm computation, the noise scale in ``train_step``, or the microbatching that decides what is
clipped. ``use_xla`` is off: on the 2-core CPU the fast step takes about 50 ms with or without XLA, and
XLA recompiles for every new Poisson batch size; the step is traced once per configuration and process
instead (:mod:`dpverify_tfprivacy._reuse`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from dpverify_tfprivacy import _keras  # first: tensorflow without its CUDA-factory noise

import tensorflow as tf  # noqa: E402
from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry  # noqa: E402
from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import (  # noqa: E402
    dense,
    einsum_utils,
    embedding,
    layer_normalization,
    registry_function_utils,
)
from tensorflow_privacy.privacy.keras_models import dp_keras_model  # noqa: E402

from dpverify.contract import TrainingRequest  # noqa: E402

__all__ = [
    "DPModel",
    "NoiseForMeanDPModel",
    "FastStep",
    "FAST_STEPS",
    "unclipped_registry",
    "MultitaskLoss",
    "make_dp_model",
    "train_mlp",
]

#: TF-Privacy's DP version of ``tf.keras.Model`` (functional graphs), as its docs build it.
DPModel = dp_keras_model.make_dp_model_class(tf.keras.Model)


class NoiseForMeanDPModel(DPModel):
    """Bug 3 (noise scaled for the mean): the library's ``train_step`` with its noise multiplier divided by
    the realised batch size B for the step, so the mean of clipped rows gets σC/B² (σC/B on the sum)."""

    def train_step(self, data):
        nominal = self._noise_multiplier
        batch_size = tf.shape(tf.keras.utils.unpack_x_y_sample_weight(data)[1])[0]
        self._noise_multiplier = nominal / tf.cast(batch_size, tf.float32)
        try:
            return super().train_step(data)
        finally:
            self._noise_multiplier = nominal


def _dense_without_norms(layer_instance, input_args, input_kwargs, tape, num_microbatches=None):
    """TF-Privacy's ``Dense`` registry function with every squared norm reported as 0."""
    base_vars, outputs, sqr_norm_fn = dense.dense_layer_computation(
        layer_instance, input_args, input_kwargs, tape, num_microbatches
    )
    return base_vars, outputs, lambda grads: tf.zeros_like(sqr_norm_fn(grads))


def unclipped_registry() -> layer_registry.LayerRegistry:
    """Bug 2 (no clipping): the default registry whose ``Dense`` entry reports norm 0 for every record, so
    every clip weight is 1 and rows pass unclipped while the noise stays σ·C for the nominal C."""
    registry = layer_registry.make_default_layer_registry()
    registry.insert(tf.keras.layers.Dense, _dense_without_norms)
    return registry


def full_registry() -> layer_registry.LayerRegistry:
    """TF-Privacy's default registry (``Dense``, ``Embedding``) with its own ``LayerNormalization`` function
    inserted, as its docs have users register a layer the default leaves out; the MLP has no such layer."""
    registry = layer_registry.make_default_layer_registry()
    registry.insert(tf.keras.layers.LayerNormalization, layer_normalization.layer_normalization_computation)
    return registry


def _embedding_positions_as_rows(layer_instance, input_args, input_kwargs, tape, num_microbatches=None):
    """TF-Privacy's ``Embedding`` registry function whose norm is taken by its own ``embedding_sqr_norm_fn``
    with each position's id offset to a token of its own: a token repeated within a record is not grouped,
    √(Σ_t |g_t|²) instead of the norm of its row's summed gradient."""
    base_vars, outputs, _ = embedding.embedding_layer_computation(
        layer_instance, input_args, input_kwargs, tape, num_microbatches
    )
    input_ids = tf.cast(input_args[0], tf.int32)
    distinct = input_ids + tf.range(tf.shape(input_ids)[1])[None, :] * layer_instance.input_dim
    return base_vars, outputs, lambda grads: registry_function_utils.embedding_sqr_norm_fn(grads.values, distinct, num_microbatches)


def _dense_bias_positions_as_rows(layer_instance, input_args, input_kwargs, tape, num_microbatches=None):
    """TF-Privacy's ``Dense`` registry function whose bias norm on a 3-D input is its 2-D formula, Σ_t |g_t|²,
    instead of the norm of the gradient summed over the positions (Opacus #751's bug in TF-Privacy's path);
    the kernel's norm is the library's (``compute_fast_einsum_squared_gradient_norm`` without the bias)."""
    base_vars, outputs, library_norms = dense.dense_layer_computation(
        layer_instance, input_args, input_kwargs, tape, num_microbatches
    )

    def sqr_norm_fn(grads):
        if grads.shape.rank < 3 or not layer_instance.use_bias or num_microbatches is not None:
            return library_norms(grads)
        kernel = einsum_utils.compute_fast_einsum_squared_gradient_norm("...b,bc->...c", input_args[0], grads, None, None)
        return kernel + tf.reduce_sum(tf.square(grads), axis=list(range(1, grads.shape.rank)))

    return base_vars, outputs, sqr_norm_fn


def _layer_norm_positions_averaged(layer_instance, input_args, input_kwargs, tape, num_microbatches=None):
    """TF-Privacy's ``LayerNormalization`` registry function whose per-record gradient is averaged over the
    positions instead of summed: its squared norm divided by T²."""
    base_vars, outputs, library_norms = layer_normalization.layer_normalization_computation(
        layer_instance, input_args, input_kwargs, tape, num_microbatches
    )
    positions = tf.cast(tf.reduce_prod(tf.shape(input_args[0])[1:-1]), tf.float32)
    return base_vars, outputs, lambda grads: library_norms(grads) / positions**2


def undercounting_registry(layer_type: type, function: Callable) -> Callable[[], layer_registry.LayerRegistry]:
    """Bug 2 for one layer type: :func:`full_registry` with ``layer_type``'s function replaced by ``function``."""

    def registry() -> layer_registry.LayerRegistry:
        registry = full_registry()
        registry.insert(layer_type, function)
        return registry

    return registry


@dataclasses.dataclass(frozen=True)
class FastStep:
    """How a run builds TF-Privacy's DP model: its class, its layer registry, its microbatches, and whether
    the model is given the claimed σ (``noised=False``: σ = 0 while the accountant counts the claimed σ)."""

    model_class: type = DPModel
    registry: Callable[[], layer_registry.LayerRegistry] = full_registry
    num_microbatches: int | None = None
    noised: bool = True


#: The correct step and its mutations, one piece of TF-Privacy's path changed each.
FAST_STEPS: dict[str, FastStep] = {
    "correct": FastStep(),
    "no_noise": FastStep(noised=False),
    "no_clipping": FastStep(registry=unclipped_registry),
    "noise_for_mean": FastStep(model_class=NoiseForMeanDPModel),
    "batch_clipping": FastStep(num_microbatches=1),  # one microbatch: the batch-mean gradient clipped to C
    "embedding_norm": FastStep(registry=undercounting_registry(tf.keras.layers.Embedding, _embedding_positions_as_rows)),
    "linear_bias_norm": FastStep(registry=undercounting_registry(tf.keras.layers.Dense, _dense_bias_positions_as_rows)),
    "layer_norm_norm": FastStep(
        registry=undercounting_registry(tf.keras.layers.LayerNormalization, _layer_norm_positions_averaged)
    ),
}


class MultitaskLoss(tf.keras.losses.Loss):
    """UniAud++'s per-record loss (:func:`_keras.multitask_loss`) as a Keras loss, because fast clipping
    rebuilds the compiled loss from its config with reduction ``NONE`` to get one loss per record."""

    def __init__(self, *, num_classes: int, tag_weight: float, **kwargs):
        super().__init__(**kwargs)
        self.num_classes, self.tag_weight = num_classes, tag_weight

    def call(self, y_true, y_pred):
        return _keras.multitask_loss(y_true, y_pred, num_classes=self.num_classes, tag_weight=self.tag_weight)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "tag_weight": self.tag_weight}


def make_dp_model(
    request: TrainingRequest, step: str, *, noise_multiplier: float, l2_norm_clip: float, learning_rate: float
) -> tf.keras.Model:
    """The designated MLP as TF-Privacy's DP model for ``step``, compiled with plain SGD and a mean-reduced
    per-record loss; ``ValueError`` when TF-Privacy would not take its fast-clipping path for it."""
    if step not in FAST_STEPS:
        raise ValueError(f"unknown fast-clipping step {step!r}; expected one of {', '.join(FAST_STEPS)}")
    how = FAST_STEPS[step]
    registry = how.registry()
    model = _keras.build_mlp(
        request,
        model_class=lambda **graph: how.model_class(
            l2_norm_clip=l2_norm_clip,
            noise_multiplier=noise_multiplier if how.noised else 0.0,
            num_microbatches=how.num_microbatches,
            use_xla=False,
            layer_registry=registry,
            **graph,
        ),
    )
    if not model._enable_fast_peg_computation:  # noqa: SLF001 (the library's own switch between its two paths)
        missing = sorted(
            {type(layer).__name__ for layer in model.layers if layer.trainable_variables and not registry.is_elem(layer)}
        )
        raise ValueError(
            f"{step}: TF-Privacy's fast-clipping registry cannot clip this model: trainable layers {missing} are "
            "not registered (TF-Privacy registers Dense and Embedding, and here LayerNormalization); train other "
            "architectures with "
            "tf-privacy-keras"
        )
    if request.num_tags:
        loss = MultitaskLoss(num_classes=request.num_classes, tag_weight=request.tag_weight)
    else:
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(learning_rate=learning_rate), loss=loss)
    return model


def _create_step_variables(model: tf.keras.Model, features: tf.Tensor, targets: tf.Tensor) -> None:
    """Create what ``DPModel.train_step`` creates on its first call (its clipping loss, the compiled loss and
    metrics, the optimizer's variables) from one record, so that the step is traced once, not twice (see
    :func:`_keras.create_step_variables`). Only metric states see the record; no weight moves."""
    model._make_clipping_loss()  # noqa: SLF001 (TF-Privacy's own lazy build, done early)
    predicted = model(features, training=False)
    model._clipping_loss.build(predicted)  # noqa: SLF001
    model.compiled_loss.build(predicted)
    model.compiled_metrics.build(predicted, targets)
    _keras.create_step_variables(model.optimizer, model)


def train_mlp(
    request: TrainingRequest, step: str, noise_multiplier: float, *, realised_normaliser: bool = False, fixed_batches: bool = False
) -> _keras.KerasRun:
    """Train the designated MLP on ``request`` with TF-Privacy's fast-clipping DP model (or its mutation);
    ``realised_normaliser`` and ``fixed_batches``: see :func:`_keras.train_steps`."""
    hp = request.hyperparameters

    def make_step(x: tf.Tensor, y: tf.Tensor):
        model = make_dp_model(
            request,
            step,
            noise_multiplier=noise_multiplier,
            l2_norm_clip=hp.max_grad_norm,
            learning_rate=hp.learning_rate,
        )
        _create_step_variables(model, x, y)

        def dp_sgd_step(x, y):
            model.train_step((x, y))

        return model, dp_sgd_step, model.optimizer

    variant = ("fast_clipping", step, FAST_STEPS.get(step), noise_multiplier)
    return _keras.train_steps(request, variant, make_step, realised_normaliser=realised_normaliser, fixed_batches=fixed_batches)
