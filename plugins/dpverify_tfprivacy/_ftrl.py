"""TF-Privacy's DP-FTRL: ``DPFTRLTreeAggregationOptimizer`` with its tree restarted every epoch, and its
accountant ``compute_rdp_tree_restart`` (imports tensorflow).

DP-FTRL trains without sampling or shuffling (Kairouz et al., 2021): each epoch passes over the data once, in
P = 1/q batches (the request's sampling rate q names the epoch's length; 1/q must be a whole number), so a
record takes part in exactly one step an epoch, what the accountant assumes. The order is fixed: one
permutation of the records (numpy, from the run's sampling seed) split into P batches of sizes within one of
each other, the same batches in the same order every epoch, so a record takes part at one place of every
epoch. The optimizer's tree (``TreeResidualSumQuery``, the efficient tree) restarts every P steps
(``restart_period=P``), and ``compute_rdp_tree_restart(σ, [P, P, ...])`` counts ⌊log₂P⌋ + 1 nodes per epoch.
At q = 1 an epoch is one full-batch step, the tree one leaf, and the noise independent: DP-SGD at q = 1
through the FTRL code.

The claim: ε from that RDP (dp_accounting's RDP-to-(ε, δ) conversion over TF-Privacy's orders), and the
mechanism the accountant's proof counts: each epoch a participation of ⌊log₂P⌋ + 1 tree nodes, each a Gaussian
of sensitivity 1 and noise σ, ``SelfComposedDpEvent(SelfComposedDpEvent(GaussianDpEvent(σ), ⌊log₂P⌋ + 1),
epochs)`` (flat, D = Σ_epochs (⌊log₂P⌋ + 1) Gaussians, where a last, shorter epoch has another depth), whose
RDP is the accountant's exactly; beside it the tree's ``NoiseStructure.tree_aggregation``. The event samples
nothing (DP-FTRL claims no amplification), whatever q named the epoch. Read as one participation an epoch
(:func:`dpverify.stats.events.correlated_release`), the every-update audit scores each canary at each of the
P places it may hold, whitened by the claimed tree; the updates show less than the nodes counted, so a
correct run reaches about 0.8 of the claimed μ there (benchmarks/results/tf-privacy-ftrl.md).

The Keras optimizer keeps the tree's state in a Python attribute (``self._global_state``), which a traced
step cannot carry from one call to the next (a second call of a ``tf.function`` step that only calls
``minimize`` fails with an out-of-scope tensor), and run eagerly its per-microbatch ``tf.while_loop`` is a
Python loop (seconds a step at a thousand records). So the step is traced with the state as its input and
output (:class:`_TracedFTRL`), once per configuration and process. Everything else is the shared TF-Privacy run's:
the model, the per-record loss and Jacobian, the public normaliser (the learning rate scaled by the batch
over the designated normaliser), the seeds and the hand-over of every update (:mod:`._keras`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

from dpverify_tfprivacy._tf import tf  # first: it imports tensorflow without its CUDA-factory noise

import dp_accounting  # noqa: E402
import numpy as np  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402
from scipy.optimize import brentq  # noqa: E402
from tensorflow_privacy.privacy.analysis import tree_aggregation_accountant  # noqa: E402
from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras  # noqa: E402

from dpverify.contract import PrivacyClaim, TrainingRequest, hand_over_kernels  # noqa: E402
from dpverify.seeds import seeds_for  # noqa: E402
from dpverify.stats.correlated import NoiseStructure  # noqa: E402
from dpverify_tfprivacy._keras import (  # noqa: E402
    KerasRun,
    PerRecordJacobianTape,
    _black_boxes,
    build_mlp,
    create_step_variables,
    per_example_loss,
)
from dpverify_tfprivacy._reuse import LOCK, reused_step  # noqa: E402

__all__ = [
    "ACCOUNTANT",
    "FTRL_STEPS",
    "ORDERS",
    "calibrate_noise_multiplier",
    "claim",
    "epoch_batches",
    "epoch_steps",
    "make_optimizer",
    "train_ftrl",
    "tree_epochs",
    "tree_epsilon",
]

ACCOUNTANT = "tensorflow_privacy compute_rdp_tree_restart (RDP of the restarted tree, dp_accounting's conversion)"
#: The RDP orders of the accountant's own docstring example.
ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
#: The DP steps: the library's, the tree restarted less often than the accountant counts (never), and the noise
#: multiplier scaled for one epoch's tree while the accountant counts every epoch.
FTRL_STEPS: tuple[str, ...] = ("correct", "no_restart", "one_epoch_noise")


def epoch_steps(sampling_rate: float) -> int:
    """P = 1/q, the steps of an epoch; a ``ValueError`` unless 1/q is a whole number."""
    steps = round(1.0 / sampling_rate)
    if steps < 1 or abs(steps * sampling_rate - 1.0) > 1e-9:
        raise ValueError(
            f"DP-FTRL passes over the data once an epoch in 1/q batches: sampling_rate must be 1/P for a whole "
            f"number P, got {sampling_rate}"
        )
    return steps


def tree_epochs(steps: int, period: int) -> list[int]:
    """The trees' lengths: full epochs of ``period`` steps, then what is left."""
    return [period] * (steps // period) + ([steps % period] if steps % period else [])


def tree_epsilon(noise_multiplier: float, epochs: tuple[int, ...], delta: float) -> float:
    """ε at ``delta`` of ``compute_rdp_tree_restart(σ, epochs)``; ∞ when σ = 0."""
    rdp = tree_aggregation_accountant.compute_rdp_tree_restart(noise_multiplier, list(epochs), list(ORDERS))
    if np.all(np.isinf(rdp)):
        return math.inf
    return float(rdp_privacy_accountant.compute_epsilon(ORDERS, rdp, delta)[0])


def calibrate_noise_multiplier(target_epsilon: float, epochs: tuple[int, ...], delta: float) -> float:
    """σ whose :func:`tree_epsilon` is ``target_epsilon`` (to 1e-6 relative)."""
    gap = lambda log_sigma: tree_epsilon(math.exp(log_sigma), epochs, delta) - target_epsilon  # noqa: E731
    return math.exp(brentq(gap, math.log(1e-3), math.log(1e4), rtol=1e-9))


def claim(noise_multiplier: float, *, steps: int, period: int, delta: float) -> PrivacyClaim:
    """The accountant's claim for ``steps`` steps with the tree restarted every ``period`` (module docstring)."""
    epochs = tuple(tree_epochs(steps, period))
    depths = [math.floor(math.log2(p)) + 1 for p in epochs]
    node = dp_accounting.GaussianDpEvent(noise_multiplier)
    if len(set(depths)) == 1:  # one participation an epoch, each of its tree's depth in nodes
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.SelfComposedDpEvent(node, depths[0]), len(epochs))
    else:
        event = dp_accounting.SelfComposedDpEvent(node, sum(depths))
    return PrivacyClaim(
        epsilon=tree_epsilon(noise_multiplier, epochs, delta),
        delta=delta,
        accountant=ACCOUNTANT,
        dp_event=event,
        noise_structure=NoiseStructure.tree_aggregation(steps=steps, restart_period=period),
    )


def epoch_batches(num_records: int, period: int, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32): one permutation of the records split into
    ``period`` batches whose sizes differ by at most one (empty where there are fewer records than steps),
    the same batches in the same order every epoch (DP-FTRL's fixed order)."""
    batches = np.array_split(np.random.default_rng(seed).permutation(num_records).astype(np.int32), period)
    for taken in range(steps):
        yield batches[taken % period]


def make_optimizer(step: str, model: tf.keras.Model, *, noise_multiplier: float, period: int, epochs: int, **common):
    """TF-Privacy's DP-FTRL optimizer restarted every ``period`` steps, or its mutation ``step``."""
    if step == "correct":
        return dp_optimizer_keras.DPFTRLTreeAggregationOptimizer(
            noise_multiplier=noise_multiplier, var_list_or_model=model, restart_period=period, **common
        )
    if step == "no_restart":  # restart_period left out: one tree for the whole run
        return dp_optimizer_keras.DPFTRLTreeAggregationOptimizer(noise_multiplier=noise_multiplier, var_list_or_model=model, **common)
    if step == "one_epoch_noise":  # σ for one epoch's tree: sensitivity √depth where the run's is √(epochs·depth)
        return dp_optimizer_keras.DPFTRLTreeAggregationOptimizer(
            noise_multiplier=noise_multiplier / math.sqrt(epochs), var_list_or_model=model, restart_period=period, **common
        )
    raise ValueError(f"unknown DP-FTRL step {step!r}; expected one of {', '.join(FTRL_STEPS)}")


@dataclass(eq=False)
class _TracedFTRL:
    """A model, the DP-FTRL optimizer and its step traced for one configuration. The step takes the query's
    global state (the tree) and returns the next: the Keras optimizer keeps it in a Python attribute, which a
    traced step cannot carry from one call to the next, so it travels as the step's input and output."""

    model: tf.keras.Model
    optimizer: tf.keras.optimizers.legacy.Optimizer
    step: Callable


def _traced_ftrl(request: TrainingRequest, step: str, noise_multiplier: float, period: int, epochs: int) -> _TracedFTRL:
    """The traced step of ``(step, σ, period, epochs)`` and the request's model, built once per process."""
    hp = request.hyperparameters
    loss_per_record = per_example_loss(request)
    key = ("ftrl", step, noise_multiplier, period, epochs, request.architecture, request.dimension, request.num_classes,
           hp.max_grad_norm, hp.learning_rate)  # fmt: skip

    def build() -> _TracedFTRL:
        model = build_mlp(request)
        optimizer = make_optimizer(step, model, noise_multiplier=noise_multiplier, period=period, epochs=epochs,
                                   noise_seed=0, **_common(request))  # fmt: skip
        create_step_variables(optimizer, model)

        def weighted_loss(x, targets):  # targets: (n, 2) of label and weight (0 for the null record)
            return loss_per_record(tf.cast(targets[:, 0], tf.int64), model(x, training=True)) * targets[:, 1]

        def dp_step(x, targets, global_state):
            optimizer._global_state = global_state  # noqa: SLF001 (the query's state, see the class docstring)
            tape = PerRecordJacobianTape(weighted_loss, (x, targets))
            with tape:
                loss = weighted_loss(x, targets)
            optimizer.minimize(loss, model.trainable_variables, tape=tape)
            return optimizer._global_state  # noqa: SLF001

        state = _state_signature(optimizer._global_state)  # noqa: SLF001
        batch = (tf.TensorSpec([None, request.dimension], tf.float32), tf.TensorSpec([None, 2], tf.float32))
        return _TracedFTRL(model=model, optimizer=optimizer, step=tf.function(dp_step, input_signature=(*batch, state)))

    return reused_step(key, build)


def _state_signature(state):
    """The query's global state as specs: exact shapes, but the tree's level buffers (``TreeState``'s
    ``level_buffer`` and ``level_buffer_idx``), which grow with its depth, free in their leading dimension, so
    one trace serves every step."""
    exact = lambda t: tf.TensorSpec(t.shape, t.dtype)  # noqa: E731
    growing = lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype)  # noqa: E731
    if hasattr(state, "level_buffer_idx"):
        return state._replace(
            level_buffer=tf.nest.map_structure(growing, state.level_buffer),
            level_buffer_idx=growing(state.level_buffer_idx),
            value_generator_state=tf.nest.map_structure(exact, state.value_generator_state),
        )
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(_state_signature(part) for part in state))
    return tf.nest.map_structure(exact, state)


def _common(request: TrainingRequest) -> dict:
    hp = request.hyperparameters
    return dict(l2_norm_clip=hp.max_grad_norm, num_microbatches=None, learning_rate=hp.learning_rate)


def train_ftrl(request: TrainingRequest, step: str, noise_multiplier: float) -> KerasRun:
    """Train the designated model with TF-Privacy's DP-FTRL (or its mutation ``step``) on the CPU.

    The tree's noise comes from its own seeded generator (``noise_seed``, from the run's noise seed): the
    run's initial global state is that of the optimizer built with it. A step whose batch is empty (fewer
    records than the epoch's steps) still runs the optimizer, on one null record whose loss is weighted 0:
    the tree releases its noise as on any step, and the update is that noise over the public normaliser."""
    if request.num_tags:
        raise ValueError("DP-FTRL here trains the main head only: a request with tags is not supported")
    hp = request.hyperparameters
    period = epoch_steps(hp.sampling_rate)
    epochs = len(tree_epochs(hp.steps, period))
    seeds = seeds_for(request.seed)
    normaliser = hp.normaliser(request.num_records)
    null = (np.zeros((1, request.dimension), np.float32), np.zeros((1, 2), np.float32))
    with LOCK, tf.device("/CPU:0"):
        entry = _traced_ftrl(request, step, noise_multiplier, period, epochs)
        model, optimizer = entry.model, entry.optimizer
        if request.architecture.is_softmax_regression:
            model.set_weights([np.zeros(w.shape, w.dtype.as_numpy_dtype) for w in model.weights])
        else:
            model.set_weights(build_mlp(request).get_weights())
        optimizer.iterations.assign(0)
        state = make_optimizer(step, model, noise_multiplier=noise_multiplier, period=period, epochs=epochs,
                               noise_seed=seeds.noise % 2**31, **_common(request))._global_state  # noqa: SLF001  # fmt: skip
        hand_over_kernels(request, 0, model.get_weights)
        batch_sizes = []
        for taken, indices in enumerate(epoch_batches(request.num_records, period, hp.steps, seeds.sampling), 1):
            batch_sizes.append(int(indices.size))
            if indices.size:
                x = request.features[indices].astype(np.float32)
                targets = np.column_stack([request.labels[indices], np.ones(indices.size)]).astype(np.float32)
            else:
                x, targets = null
            optimizer.learning_rate.assign(hp.learning_rate * x.shape[0] / normaliser)  # the divisor: microbatches
            state = entry.step(tf.constant(x), tf.constant(targets), state)
            hand_over_kernels(request, taken, model.get_weights)
            if request.progress is not None:
                request.progress(taken, hp.steps)
        weights = model.get_weights()
        optimizer_steps = int(optimizer.iterations.numpy())
    for variable, value in zip(model.weights, weights):
        if not np.all(np.isfinite(value)):
            raise FloatingPointError(f"training diverged: {variable.name} has non-finite entries")
    return KerasRun(
        **_black_boxes(model, weights, "/CPU:0", request),
        device="cpu",
        batch_sizes=tuple(batch_sizes),
        optimizer_steps=optimizer_steps,
        weights=tuple(weights),
    )
