"""The Keras training loop shared by the correct TF-Privacy run and its buggy variants (imports tensorflow).

One DP step is TF-Privacy's ``DPKerasSGDOptimizer`` (``GenericDPSGDOptimizer`` over a ``GaussianSumQuery``)
called through ``optimizer.minimize(per_example_loss, variables, tape=tape)``: TF-Privacy computes the
per-example Jacobian, clips each row to the query's ``l2_norm_clip`` by its global norm, sums, adds the
query's Gaussian noise once, and divides the noisy sum by the number of microbatches, which with
``num_microbatches=None`` is the realised batch size. The variants change exactly one piece of that path
(see :data:`DP_STEPS` and :func:`make_dp_optimizer`); the loop, the model, the sampler and the seeds are
the same for all of them.

A multi-task request (UniAud++, its ``tags``) gets a separate tag head on the shared encoder; the model's
one output is ``[main logits | tag logits]`` and :func:`multitask_loss` gives one loss per record, so the
DP optimizer still takes each record's Jacobian row over every variable, the tag head's included, and
clips that whole row.

Speed: the optimizer takes its per-example rows from ``tape.jacobian(per-example losses, variables)``. On a
tape that recorded the *batch* forward pass that Jacobian differentiates the whole batch once per record,
O(B²) work: about 6 CPU-seconds a step at the quick profile's B ≈ 500 (1000 -> 1000 -> 100), 85-290 s an
audit. The step here hands the optimizer a :class:`PerRecordJacobianTape`, whose ``jacobian`` computes
the same rows with ``tf.vectorized_map`` over each record's own forward and backward pass, O(B) work
(about 0.7 CPU-seconds a step); the optimizer and its query do everything else exactly as before. Of the
Keras DP optimizers, ``DPKerasSGDOptimizer`` stays the faster one with these rows (0.7 against 0.8
CPU-seconds a step for ``VectorizedDPKerasSGDOptimizer``); ``jit_compile=True`` is slower (1.3) and
recompiles for every new Poisson batch size, so the step runs without XLA, traced once per configuration
and process and reused by every run of it (:mod:`dpverify_tfprivacy._reuse`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Hashable, Literal

from dpverify_tfprivacy._tf import tf  # first: it imports tensorflow without its CUDA-factory noise

import numpy as np  # noqa: E402
from scipy.special import log_softmax  # noqa: E402
from tensorflow_privacy.privacy.dp_query import gaussian_query  # noqa: E402
from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras  # noqa: E402

from dpverify.contract import LayerArchitecture, TrainingRequest, hand_over_kernels, position_weights  # noqa: E402
from dpverify_tfprivacy._reuse import LOCK, ReusedStep, reused_step  # noqa: E402
from dpverify.seeds import seeds_for  # noqa: E402
from dpverify_tfprivacy._sampling import kernel_seeds, poisson_batches, shuffled_batches  # noqa: E402

DPStep = Literal["correct", "no_noise", "no_clipping", "noise_for_mean"]
DP_STEPS: tuple[str, ...] = ("correct", "no_noise", "no_clipping", "noise_for_mean")

#: The "huge" clipping norm of the no-clipping variant: no gradient of a finite float32 model reaches it.
UNCLIPPED_NORM = 1e30

__all__ = [
    "DPStep",
    "DP_STEPS",
    "UNCLIPPED_NORM",
    "NoiselessGaussianSumQuery",
    "NoiseForMeanDPSGDOptimizer",
    "PerRecordJacobianTape",
    "make_dp_optimizer",
    "build_mlp",
    "multitask_loss",
    "per_example_loss",
    "training_targets",
    "KerasRun",
    "train_mlp",
    "train_steps",
]


class NoiselessGaussianSumQuery(gaussian_query.GaussianSumQuery):
    """Bug 1 (no noise): TF-Privacy's Gaussian sum query whose noised result is thrown away, so the
    optimizer applies the clipped, un-noised sum while the query still reports its Gaussian DP event."""

    def get_noised_result(self, sample_state, global_state):
        _noised, global_state, event = super().get_noised_result(sample_state, global_state)
        return sample_state, global_state, event


class NoiseForMeanDPSGDOptimizer(dp_optimizer_keras.GenericDPSGDOptimizer):
    """Bug 3 (noise scaled for the mean): TF-Privacy's DP-SGD optimizer whose query adds σ·C/B to the sum
    of B clipped rows (σ·C on the mean) instead of σ·C. Everything else is TF-Privacy's own step."""

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        if callable(loss):
            raise TypeError("NoiseForMeanDPSGDOptimizer needs the per-example loss tensor and its tape")
        batch_size = tf.cast(tf.shape(loss)[0], tf.float32)
        nominal = self._global_state
        self._global_state = nominal._replace(stddev=nominal.stddev / batch_size)
        try:
            return super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)
        finally:
            self._global_state = nominal


def make_dp_optimizer(
    step: DPStep, *, l2_norm_clip: float, noise_multiplier: float, learning_rate: float
) -> tf.keras.optimizers.legacy.Optimizer:
    """TF-Privacy's Keras DP-SGD optimizer with one example per microbatch, or its mutation ``step``."""
    stddev = l2_norm_clip * noise_multiplier  # the nominal σ·C, kept by every variant
    common = dict(num_microbatches=None, learning_rate=learning_rate)
    if step == "correct":
        return dp_optimizer_keras.DPKerasSGDOptimizer(
            l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, **common
        )
    if step == "no_noise":
        query = NoiselessGaussianSumQuery(l2_norm_clip, stddev)
        return dp_optimizer_keras.GenericDPSGDOptimizer(dp_sum_query=query, **common)
    if step == "no_clipping":
        query = gaussian_query.GaussianSumQuery(UNCLIPPED_NORM, stddev)
        return dp_optimizer_keras.GenericDPSGDOptimizer(dp_sum_query=query, **common)
    if step == "noise_for_mean":
        query = gaussian_query.GaussianSumQuery(l2_norm_clip, stddev)
        return NoiseForMeanDPSGDOptimizer(dp_sum_query=query, **common)
    raise ValueError(f"unknown DP step {step!r}; expected one of {', '.join(DP_STEPS)}")


class PerRecordJacobianTape(tf.GradientTape):
    """A tape whose ``jacobian`` of the per-example loss vector is computed record by record.

    ``record_loss(x, y)`` is the loss of a batch (shape ``(n,)``); ``jacobian(target, sources)`` returns
    its gradient for each record of ``inputs`` alone, stacked (``tf.vectorized_map``), which is the
    Jacobian of ``target`` when ``target`` is ``record_loss(*inputs)``: what TF-Privacy's optimizers ask for
    with ``num_microbatches=None``. Why: the stock Jacobian of a batch loss costs B backward passes of the
    whole batch. The per-example losses must not couple records (no batch statistics)."""

    def __init__(self, record_loss: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], inputs: tuple[tf.Tensor, tf.Tensor]):
        super().__init__()
        self._record_loss = record_loss
        self._inputs = inputs

    def jacobian(self, target, sources, unconnected_gradients=tf.UnconnectedGradients.NONE, **_ignored):
        if target.shape.rank != 1:
            raise ValueError(
                f"PerRecordJacobianTape differentiates one loss per record (rank 1), got shape {target.shape}; "
                "use num_microbatches=None"
            )
        check = tf.debugging.assert_equal(
            tf.shape(target)[0], tf.shape(self._inputs[0])[0], message="one loss per record of the batch"
        )

        def row(record):
            x, y = record
            with tf.GradientTape() as tape:
                loss = self._record_loss(x[tf.newaxis], y[tf.newaxis])[0]
            return tape.gradient(loss, sources, unconnected_gradients=unconnected_gradients)

        with tf.control_dependencies([check]):
            return tf.vectorized_map(row, self._inputs)


def build_mlp(request: TrainingRequest, *, model_class: Callable[..., tf.keras.Model] = tf.keras.Model) -> tf.keras.Model:
    """The designated ``d -> h -> C`` ReLU MLP with Keras' default initialisation (Glorot-uniform kernels,
    zero biases); outputs logits. Softmax regression (``hidden_width=0``): one ``Dense(C)`` starting at zero.

    Each kernel's initialiser has its own seed, derived from ``request.seed`` alone: Keras would otherwise
    draw it from the process' random state, which ``tf.keras.utils.set_random_seed`` seeds, and that
    call also clears TensorFlow's kernel caches, so a reused traced step would be instantiated anew
    (~0.2 s) in every run.

    With tags: the shared encoder ``Dense(h, relu)``, the main head ``Dense(C)`` and a separate tag head
    ``Dense(|E|)`` (as :class:`dpverify.torch.MultiTaskMLP`), concatenated into one ``(n, C + |E|)``
    output. A functional graph, built as ``model_class(inputs=..., outputs=...)``, so that TF-Privacy's DP
    model class (which walks that graph for fast clipping) can be the model. A layer design's
    :class:`~dpverify.contract.LayerArchitecture`: :func:`build_layer_model`."""
    features = tf.keras.Input(shape=(request.dimension,), dtype=tf.float32)
    if isinstance(request.architecture, LayerArchitecture):
        return build_layer_model(request, features, model_class=model_class)
    width = request.architecture.hidden_width
    if request.architecture.is_softmax_regression:
        logits = tf.keras.layers.Dense(
            request.num_classes, kernel_initializer="zeros", bias_initializer="zeros", name="main_head"
        )(features)
        return model_class(inputs=features, outputs=logits)
    encoder, main_head, tag_head = (
        tf.keras.initializers.GlorotUniform(seed=seed) for seed in kernel_seeds(seeds_for(request.seed), 3)
    )
    hidden = tf.keras.layers.Dense(width, activation="relu", kernel_initializer=encoder, name="encoder")(features)
    main = tf.keras.layers.Dense(request.num_classes, kernel_initializer=main_head, name="main_head")(hidden)
    if not request.num_tags:
        return model_class(inputs=features, outputs=main)
    tags = tf.keras.layers.Dense(request.num_tags, kernel_initializer=tag_head, name="tag_head")(hidden)
    return model_class(inputs=features, outputs=tf.keras.layers.Concatenate()([main, tags]))


def build_layer_model(
    request: TrainingRequest, features: tf.Tensor, *, model_class: Callable[..., tf.keras.Model]
) -> tf.keras.Model:
    """A layer design's model, as :class:`dpverify.torch.LayerModel`: each record lifted to a sequence of
    ``positions`` equal positions (parameter-free layers), the designated layer (``Embedding(d, C)`` on the
    record's largest feature as its token; ``Dense(C)`` with bias; ``LayerNormalization``, d = C), zero
    weights, the outputs weighted by the record's position regime (:func:`~dpverify.contract.position_weights`,
    a constant) and summed over the positions."""
    architecture = request.architecture
    positions = architecture.positions
    if architecture.layer == "embedding":
        tokens = tf.keras.layers.Lambda(
            lambda x: tf.repeat(tf.argmax(x, axis=-1, output_type=tf.int32)[:, None], positions, axis=1), name="tokens"
        )(features)
        layer = tf.keras.layers.Embedding(request.dimension, request.num_classes, embeddings_initializer="zeros")
        outputs = layer(tokens)
    elif architecture.layer == "linear_3d":
        sequence = tf.keras.layers.RepeatVector(positions)(features)
        outputs = tf.keras.layers.Dense(request.num_classes, kernel_initializer="zeros", bias_initializer="zeros")(sequence)
    elif architecture.layer == "layer_norm":
        if request.dimension != request.num_classes:
            raise ValueError(
                f"the layer_norm design's outputs are its inputs' normalised coordinates, so the features' "
                f"dimension must equal num_classes, got dimension={request.dimension}, num_classes={request.num_classes}"
            )
        sequence = tf.keras.layers.RepeatVector(positions)(features)
        outputs = tf.keras.layers.LayerNormalization(gamma_initializer="zeros", beta_initializer="zeros")(sequence)
    else:
        raise ValueError(
            f"the {architecture.layer!r} layer design is n/a for TF-Privacy: its fast-clipping layer registry has no such "
            "layer (dense, einsum_dense, embedding, layer_normalization, multi_head_attention, nlp_* only); "
            "audit it with an implementation whose ImplementationInfo.layers names it"
        )
    table = tf.constant(position_weights(positions))
    weights = tf.keras.layers.Lambda(
        lambda x: tf.gather(table, tf.math.floormod(tf.argmax(x, axis=-1, output_type=tf.int32), table.shape[0])),
        name="position_weights",
    )(features)
    logits = tf.keras.layers.Lambda(lambda pair: tf.einsum("ntc,nt->nc", *pair), name="pool_positions")([outputs, weights])
    return model_class(inputs=features, outputs=logits)


def multitask_loss(targets: tf.Tensor, logits: tf.Tensor, *, num_classes: int, tag_weight: float) -> tf.Tensor:
    """One loss per record: ``CE(main, y) + tag_weight · mean_h CE(tag head, e_h)`` over the tags the
    record carries (``targets`` (..., 1 + H): the label, then H tags, −1 = no tag; 0 tag loss without tags),
    the formula of :class:`dpverify.torch.MultiTaskLoss`. Leading axes are kept (TF-Privacy's microbatches
    add one)."""
    leading = tf.shape(targets)[:-1]
    targets = tf.reshape(targets, [-1, tf.shape(targets)[-1]])
    logits = tf.reshape(logits, [-1, tf.shape(logits)[-1]])
    main_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets[:, 0], logits=logits[:, :num_classes])
    tags = targets[:, 1:]
    carried = tf.cast(tags >= 0, logits.dtype)
    tag_log_probs = tf.nn.log_softmax(logits[:, num_classes:], axis=-1)
    picked = tf.gather(tag_log_probs, tf.maximum(tags, 0), batch_dims=1)  # (n, H); masked below where no tag
    tag_loss = -tf.reduce_sum(picked * carried, axis=-1) / tf.maximum(tf.reduce_sum(carried, axis=-1), 1.0)
    return tf.reshape(main_loss + tag_weight * tag_loss, leading)


def per_example_loss(request: TrainingRequest) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """The request's loss, one value per record (TF-Privacy needs reduction NONE, not the batch mean):
    cross-entropy, or :func:`multitask_loss` when it carries tags."""
    if request.num_tags:
        return functools.partial(multitask_loss, num_classes=request.num_classes, tag_weight=request.tag_weight)
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def training_targets(request: TrainingRequest) -> np.ndarray:
    """The labels, or with tags the packed ``(n, 1 + H)`` targets ``[label | tags]`` of :func:`multitask_loss`."""
    return request.labels if request.tags is None else np.column_stack([request.labels, request.tags])


@dataclass(frozen=True, eq=False)
class KerasRun:
    """A finished run: the black boxes (the tag head's is ``None`` without tags), where it ran, what the
    input pipeline did and the final weights (for white-box tests)."""

    predict_log_proba: Callable[[np.ndarray], np.ndarray]
    predict_tag_log_proba: Callable[[np.ndarray], np.ndarray] | None
    device: str
    batch_sizes: tuple[int, ...]
    optimizer_steps: int
    weights: tuple[np.ndarray, ...]


def _allow_gpu_memory_growth() -> None:
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError):  # the runtime is already initialised: keep its settings
            pass


def train_mlp(
    request: TrainingRequest, step: DPStep, noise_multiplier: float, *, realised_normaliser: bool = False, fixed_batches: bool = False
) -> KerasRun:
    """Train the designated MLP on ``request`` with TF-Privacy's DP optimizer step (or its mutation ``step``);
    ``realised_normaliser`` and ``fixed_batches``: see :func:`train_steps`."""
    hp = request.hyperparameters

    def make_step(_x: tf.Tensor, _y: tf.Tensor) -> tuple[tf.keras.Model, Callable, tf.keras.optimizers.legacy.Optimizer]:
        model = build_mlp(request)
        optimizer = make_dp_optimizer(
            step, l2_norm_clip=hp.max_grad_norm, noise_multiplier=noise_multiplier, learning_rate=hp.learning_rate
        )
        create_step_variables(optimizer, model)
        loss_per_record = per_example_loss(request)

        def dp_sgd_step(x, y):
            tape = PerRecordJacobianTape(lambda xs, ys: loss_per_record(ys, model(xs, training=True)), (x, y))
            with tape:
                loss = loss_per_record(y, model(x, training=True))
            optimizer.minimize(loss, model.trainable_variables, tape=tape)

        return model, dp_sgd_step, optimizer

    variant = ("optimizer", step, noise_multiplier)
    return train_steps(request, variant, make_step, realised_normaliser=realised_normaliser, fixed_batches=fixed_batches)


def create_step_variables(optimizer: tf.keras.optimizers.legacy.Optimizer, model: tf.keras.Model) -> None:
    """Create the legacy optimizer's variables (step counter, hyperparameters) before the DP step is traced:
    a ``tf.function`` whose first trace creates variables is traced a second time."""
    optimizer._create_all_weights(model.trainable_variables)  # noqa: SLF001 (Keras 2 has no public build for it)


def train_steps(
    request: TrainingRequest,
    variant: tuple[Hashable, ...],
    make_step: Callable[[tf.Tensor, tf.Tensor], tuple[tf.keras.Model, Callable[..., None], tf.keras.optimizers.legacy.Optimizer]],
    *,
    realised_normaliser: bool = False,
    fixed_batches: bool = False,
) -> KerasRun:
    """The run every TF-Privacy path shares: seeds, device, batches, divergence check, the hand-over of every
    update (:attr:`~dpverify.contract.Request.observe_update`: the weights before the first step and after
    each, an empty batch's unchanged ones included), black boxes.

    ``make_step(x, y)`` builds the model and every variable its step uses (``(x, y)``: one record, for
    steps that build on data), and returns the model, its DP step on a batch ``(x, y)``, and the
    optimizer. The step is traced once per process for ``variant`` (the path, the step and
    anything else ``make_step`` reads beyond the request's model and hyperparameters) and reused
    (:mod:`dpverify_tfprivacy._reuse`). ``request.seed`` alone fixes the initial weights (seeded
    initialisers, :func:`build_mlp`; zero for softmax regression), the noise (the step's generator,
    reset from the seed; op determinism on) and the Poisson batches (a numpy generator).
    Exactly ``request.hyperparameters.steps`` steps are drawn; an empty batch (probability (1-q)^N)
    leaves the weights unchanged, because TF-Privacy's DP steps cannot take a batch of size 0.

    TF-Privacy divides the noisy sum by the number of microbatches, the size B_t of the batch it is handed,
    and has no setting for a public normaliser. With Poisson batches B_t is private (docs/bugs.md class 7: the
    two-world dataset-size world separates 2 from 3 records in every run), so each step's learning rate
    is scaled by B_t / the designated normaliser (``DPHyperparameters.normaliser``): the update is then the
    noisy sum over the public normaliser, while TF-Privacy still clips, sums, noises and divides.
    ``realised_normaliser=True`` leaves the rate alone: the call TF-Privacy's API makes by default.

    ``fixed_batches=True`` is the tutorial's pipeline instead (:func:`~dpverify_tfprivacy._sampling.shuffled_batches`:
    ``shuffle(N).batch(B)`` epoch after epoch, B = :meth:`~dpverify.contract.DPHyperparameters.fixed_batch_size`,
    the last batch of an epoch N mod B records short), with the rate left alone as the tutorial leaves it:
    TF-Privacy divides each batch's noisy sum by its size, B, and the short batch's by its own size.
    """
    hp = request.hyperparameters
    seeds = seeds_for(request.seed)
    _allow_gpu_memory_growth()
    use_gpu = request.device == "cuda" and bool(tf.config.list_physical_devices("GPU"))
    device_name = "/GPU:0" if use_gpu else "/CPU:0"
    features, targets = request.features, training_targets(request)
    specs = tuple(tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)) for a in (features, targets))
    tag_weight = request.tag_weight if request.num_tags else None
    model_key = (request.architecture, request.dimension, request.num_classes, request.num_tags, tag_weight)
    key = (*variant, *model_key, hp.max_grad_norm, hp.learning_rate, device_name, specs)
    tf.config.experimental.enable_op_determinism()

    with LOCK, tf.device(device_name):
        sample = (tf.constant(features[:1]), tf.constant(targets[:1]))
        entry = reused_step(key, lambda: ReusedStep.trace(make_step, specs, sample))
        if request.architecture.is_softmax_regression:
            initial = [np.zeros(w.shape, w.dtype.as_numpy_dtype) for w in entry.model.weights]
        else:
            initial = build_mlp(request).get_weights()
        entry.start(initial, seeds.noise)
        batch_sizes = []
        normaliser = hp.normaliser(request.num_records)
        if fixed_batches:
            batches = shuffled_batches(request.num_records, hp.fixed_batch_size(request.num_records), hp.steps, seeds.sampling)
        else:
            batches = poisson_batches(request.num_records, hp.sampling_rate, hp.steps, seeds.sampling)
        rescale = not (realised_normaliser or fixed_batches)
        hand_over_kernels(request, 0, entry.model.get_weights)
        for taken, indices in enumerate(batches, 1):
            batch_sizes.append(int(indices.size))
            if indices.size:
                if rescale:
                    entry.optimizer.learning_rate.assign(hp.learning_rate * indices.size / normaliser)
                entry.step(tf.constant(features[indices]), tf.constant(targets[indices]))
            hand_over_kernels(request, taken, entry.model.get_weights)
            if request.progress is not None:
                request.progress(taken, hp.steps)
        weights = entry.model.get_weights()
        optimizer_steps = int(entry.iterations.numpy())

    for variable, value in zip(entry.model.weights, weights):
        if not np.all(np.isfinite(value)):
            raise FloatingPointError(f"training diverged: {variable.name} has non-finite entries")
    return KerasRun(
        **_black_boxes(entry.model, weights, device_name, request),
        device="cuda" if use_gpu else "cpu",
        batch_sizes=tuple(batch_sizes),
        optimizer_steps=optimizer_steps,
        weights=tuple(weights),
    )


def _black_boxes(
    model: tf.keras.Model, weights: list[np.ndarray], device_name: str, request: TrainingRequest
) -> dict[str, Callable | None]:
    """``predict_log_proba`` (the main head's columns of the output) and ``predict_tag_log_proba`` (the tag
    head's, ``None`` without tags) of the run's ``weights``, sharing one forward pass. ``model`` is the
    reused model, which later runs retrain: each query loads the run's weights into it first. The pass
    runs eagerly: the auditor queries each model once."""
    dimension, chunk = request.dimension, 4096

    def predictor(columns: slice, width: int) -> Callable[[np.ndarray], np.ndarray]:
        def predict_log_proba(features: np.ndarray) -> np.ndarray:
            """Log-probabilities (float64, shape (n, classes)) of one head of the trained model, in chunks."""
            x = np.asarray(features, dtype=np.float32)
            if x.ndim != 2 or x.shape[1] != dimension:
                raise ValueError(f"features must have shape (n, {dimension}), got {x.shape}")
            out = np.empty((x.shape[0], width), dtype=np.float64)
            with LOCK, tf.device(device_name):
                model.set_weights(weights)
                for start in range(0, x.shape[0], chunk):
                    block = model(tf.constant(x[start : start + chunk]), training=False).numpy()[:, columns]
                    out[start : start + chunk] = log_softmax(block.astype(np.float64), axis=1)
            return out

        return predict_log_proba

    classes = request.num_classes
    if not request.num_tags:
        return {"predict_log_proba": predictor(slice(None), classes), "predict_tag_log_proba": None}
    return {
        "predict_log_proba": predictor(slice(0, classes), classes),
        "predict_tag_log_proba": predictor(slice(classes, None), request.num_tags),
    }
