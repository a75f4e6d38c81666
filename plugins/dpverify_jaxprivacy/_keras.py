"""DP-SGD through JAX-Privacy's Keras API (imports keras on the JAX backend and jax_privacy).

A run is what the library's documentation shows: a Keras 3 model of the designated shape,
``keras_api.make_private(model, DPKerasConfig(...))``, compiled with SGD, then ``fit``. With
``poisson_sampling_in_fit=True`` the library's ``fit`` draws Poisson batches with probability
``batch_size / train_size``, pads them and marks the padding; its ``train_step`` clips with
``jax_privacy.clipped_grad(normalize_by=batch_size)`` and adds ``gaussian_privatizer`` noise of
σ · l2_norm_bound / √(accumulation steps); Keras' optimizer averages ``gradient_accumulation_steps`` batches
into one update. ``microbatch_size`` is the core path's (:data:`~dpverify_jaxprivacy._core.MICROBATCH`,
at most the batch). ``rescale_to_unit_norm`` stays at its default (True), so the learning rate is lr · C and the
update is the designated one. ``DPKerasConfig`` refuses σ = 0, so a non-private request (σ = 0, as the
conformance checks make) runs the library's DP step with a privatizer of stddev 0 (1.0.0: its gradient
computer with noise multiplier 0, :func:`._api.without_noise`) and claims ε = ∞. A variant's DP step replaces the library's two calls while ``fit`` traces
(:func:`dpverify_jaxprivacy._steps.library_calls`).

At the config's default ``poisson_sampling_in_fit=False`` (``KerasCall(fixed_batches=True)``) ``fit`` is given
shuffled fixed-size batches of B records (:class:`ShuffledBatches`) and the library's train step takes them
as they come: no padding, ``normalize_by`` = B, the claim still Poisson sampling at q = B/N.
The weights before ``fit`` and after each optimizer update go to the request's ``observe_update`` when it has
one (a Keras callback, attached only then; kernels transposed to the designated (outputs, inputs)).

The API takes a batch size, not a rate: it is called with ``batch_size`` = the designated normaliser
(``expected_batch_size``, else qN), a whole number ≥ 1, over ``gradient_accumulation_steps``, and samples at
``batch_size / train_size``, which is q whenever the normaliser is qN (every one-run audit). The claim gives
the library's accountant the batch size and dataset size the config was given.

Speed: a Keras model traces its train step once and keeps it. Compiling costs seconds and a run of a
two-world audit milliseconds, so the private model is built once per configuration and process
(:func:`private_model`) and each run resets what a fresh model would have: weights (from the run's seed),
optimizer state, the library's step counter and noise key, and the config's sampling seed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import threading
from dataclasses import dataclass
from typing import Callable

from dpverify_jaxprivacy._jax import jax, keras_on_jax

keras = keras_on_jax()

import numpy as np  # noqa: E402

from dpverify.contract import PrivacyClaim, TrainingRequest, hand_over_kernels  # noqa: E402
from dpverify_jaxprivacy import _accounting, _api  # noqa: E402
from dpverify_jaxprivacy._api import keras_api  # noqa: E402
from dpverify.seeds import seeds_for  # noqa: E402
from dpverify_jaxprivacy._core import LAYER_ORDER, MICROBATCH, black_box  # noqa: E402
from dpverify_jaxprivacy._steps import DPStep, library_calls  # noqa: E402

__all__ = ["KerasCall", "KerasRun", "ShuffledBatches", "private_model", "smallest_accepted_noise", "train_keras"]

_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class KerasCall:
    """How the user calls the Keras API: ``accumulation`` gradient-accumulation steps per update;
    ``user_noise``: the user sets ``noise_multiplier`` to the smallest the config accepts, instead of leaving
    it to the library's calibration; ``fixed_batches``: the config's default ``poisson_sampling_in_fit=False``,
    ``fit`` given shuffled fixed-size batches (:class:`ShuffledBatches`), else Poisson sampling in ``fit``."""

    accumulation: int = 1
    user_noise: bool = False
    fixed_batches: bool = False

    def __post_init__(self) -> None:
        if self.fixed_batches and self.accumulation != 1:
            raise ValueError("fixed batches are called without gradient accumulation (accumulation=1)")


class ShuffledBatches(keras.utils.PyDataset):
    """``steps`` batches of ``batch_size`` records of ``(features, labels)``, epoch after epoch: each epoch a
    uniformly random order (numpy, from ``seed``) cut into N // B full batches, the N mod B records left over
    sitting that epoch out. Why not ``fit(x, y, batch_size=B, shuffle=True)``: Keras then hands over a short
    last batch of N mod B records, which the library's train step refuses (``ValueError: The batch size in
    the DP parameters is not equal to the batch size of the actual data``, raised when that batch arrives,
    also with ``steps_per_epoch``, whose iterator runs on into the short batch); full batches only are what
    a user must feed it, as ``drop_remainder=True`` or ``drop_last=True`` would."""

    def __init__(self, features: np.ndarray, labels: np.ndarray, *, batch_size: int, steps: int, seed: int) -> None:
        super().__init__()
        per_epoch = features.shape[0] // batch_size
        if per_epoch < 1:
            raise ValueError(f"fixed batches of {batch_size} need at least {batch_size} records, got {features.shape[0]}")
        rng = np.random.default_rng(seed)
        epochs = -(-steps // per_epoch)
        orders = [rng.permutation(features.shape[0])[: per_epoch * batch_size] for _ in range(epochs)]
        self.batches = np.concatenate(orders).reshape(-1, batch_size)[:steps]
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.batches[index]
        return self.features[rows], self.labels[rows]


class _HandOver(keras.callbacks.Callback):
    """Hands the weights after every ``accumulation``-th batch (one optimizer update) to the request's
    ``observe_update``."""

    def __init__(self, request: TrainingRequest, accumulation: int) -> None:
        super().__init__()
        self.request, self.accumulation = request, accumulation

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if (batch + 1) % self.accumulation == 0:
            hand_over_kernels(self.request, (batch + 1) // self.accumulation, lambda: _weights(self.model))


def _weights(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(variable.value) for variable in model.trainable_weights]


@dataclass(frozen=True)
class KerasRun:
    """A trained run: the trained weights by name and the library's claim."""

    params: dict[str, np.ndarray]
    claim: PrivacyClaim

    @property
    def predict_log_proba(self) -> Callable[[np.ndarray], np.ndarray]:
        """The black box of the trained weights."""
        return black_box(self.params)


@dataclass(frozen=True)
class _Configuration:
    """Everything a private model's traced step depends on (the cache key of :func:`private_model`)."""

    dimension: int
    num_classes: int
    hidden_width: int
    dp: keras_api.DPKerasConfig
    learning_rate: float
    kind: str


@functools.lru_cache(maxsize=64)
def smallest_accepted_noise(
    *, epsilon: float, delta: float, clipping_norm: float, batch_size: int, accumulation: int, train_steps: int, train_size: int
) -> float:
    """The smallest noise multiplier ``DPKerasConfig`` accepts for ``epsilon`` (bisection on the config's own
    validation, to 0.1 %): what a user who lowers σ until the library refuses ends up with."""

    def accepted(sigma: float) -> bool:
        try:
            keras_api.DPKerasConfig(
                epsilon=epsilon, delta=delta, clipping_norm=clipping_norm, batch_size=batch_size,
                gradient_accumulation_steps=accumulation, train_steps=train_steps, train_size=train_size,
                noise_multiplier=sigma,
            )
        except ValueError:
            return False
        return True

    low, high = 0.05, 1.0
    while not accepted(high):
        low, high = high, 2.0 * high
        if high > 1e4:
            raise ValueError(f"DPKerasConfig accepts no noise multiplier up to 1e4 for ε = {epsilon}")
    while high / low > 1.001:
        middle = (low * high) ** 0.5
        low, high = (low, middle) if accepted(middle) else (middle, high)
    return high


@functools.lru_cache(maxsize=64)
def _dp_config(**fields) -> keras_api.DPKerasConfig:
    """``DPKerasConfig(**fields)``, validated by the library once per configuration (its check of a given σ
    runs the PLD accountant, a tenth of a second, where a two-world run takes milliseconds)."""
    return keras_api.DPKerasConfig(**fields)


def _initial_weights(config: _Configuration, seed: int) -> list[np.ndarray]:
    """The designated model's initial weights for ``seed``, in the model's weight order: zeros for softmax
    regression; Glorot-uniform kernels and zero biases (Keras' default) for the MLP."""
    if not config.hidden_width:
        return [np.zeros((config.dimension, config.num_classes), np.float32), np.zeros(config.num_classes, np.float32)]
    rng = np.random.default_rng(seed)
    shapes = [(config.dimension, config.hidden_width), (config.hidden_width, config.num_classes)]
    weights = []
    for fan_in, fan_out in shapes:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        weights += [rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32), np.zeros(fan_out, np.float32)]
    return weights


@functools.lru_cache(maxsize=16)
def private_model(config: _Configuration) -> tuple[keras.Model, list[np.ndarray]]:
    """The designated model made private with ``config.dp`` and compiled; and its optimizer's initial state."""
    layers = [keras.Input(shape=(config.dimension,))]
    if config.hidden_width:
        layers.append(keras.layers.Dense(config.hidden_width, activation="relu"))
    layers.append(keras.layers.Dense(config.num_classes))
    model = keras_api.make_private(keras.Sequential(layers), config.dp)
    if config.kind == "no_noise":
        _api.without_noise(model)
    accumulation = config.dp.gradient_accumulation_steps
    model.compile(
        optimizer=keras.optimizers.SGD(
            learning_rate=config.learning_rate, gradient_accumulation_steps=accumulation if accumulation > 1 else None
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    # Build the compiled state now, with Keras' own _symbolic_build as the library's Poisson fit does, so that
    # the first fit of a cached model draws its randomness as every later one does.
    model._symbolic_build(data_batch=(np.zeros((1, config.dimension), np.float32), np.zeros(1, np.int64), None))
    return model, [np.asarray(v.value) for v in model.optimizer.variables]


def _reset(model: keras.Model, optimizer_state: list[np.ndarray], weights: list[np.ndarray], noise_seed: int) -> None:
    """Make a cached model what a fresh one of this run would be."""
    for variable, value in zip(model.trainable_weights, weights, strict=True):
        variable.assign(value)
    for variable, value in zip(model.optimizer.variables, optimizer_state):
        variable.assign(value)
    for variable in model.non_trainable_weights:
        if variable.name == "_rng":
            variable.assign(np.asarray(jax.random.PRNGKey(noise_seed), dtype=np.uint32))
        elif variable.name == "_optimizer_steps":
            variable.assign(np.zeros(variable.shape, dtype=np.uint32))


def _seeded(config: keras_api.DPKerasConfig, seed: int) -> keras_api.DPKerasConfig:
    """``config`` with the seed of the library's Poisson sampler (a copy: ``dataclasses.replace`` would
    validate it again, a PLD account per run, for a change of seed alone)."""
    seeded = copy.copy(config)
    object.__setattr__(seeded, "seed", seed)
    return seeded


def _batch_size(request: TrainingRequest, accumulation: int) -> int:
    """The physical batch size: the designated normaliser over the accumulation steps (rounded down with
    accumulation, whose run drops the remainder; whole otherwise)."""
    normaliser = request.hyperparameters.normaliser(request.num_records) / accumulation
    batch_size = int(normaliser) if accumulation > 1 else round(normaliser)
    if batch_size < 1 or (accumulation == 1 and abs(batch_size - normaliser) > 1e-9 * max(1.0, normaliser)):
        raise ValueError(
            f"the Keras API takes a whole batch size; the designated normaliser is {normaliser:g}: "
            "designate expected_batch_size (or q·N) as a whole number >= 1"
        )
    return batch_size


def _microbatch_size(batch_size: int, *, padded: bool) -> int:
    """``clipped_grad``'s ``microbatch_size``, which must divide the batch: the core path's (at most the batch)
    for padded Poisson batches; for a fixed batch, which is not padded, its largest divisor up to it. Taking
    a fixed batch whole (``None``) was 9× slower: 3 steps of B = 1250 (d = 2500, 10 classes) took 131 s whole,
    14.7 s by 125 and 12.6 s for B = 1249 by 1 (a prime: one record at a time), on the 2-core CPU at load 13
    (2026-11-27)."""
    size = min(MICROBATCH, batch_size)
    if padded:
        return size
    return max(divisor for divisor in range(1, size + 1) if batch_size % divisor == 0)


def train_keras(request: TrainingRequest, kind: str, call: KerasCall) -> KerasRun:
    """Train the designated model through JAX-Privacy's Keras API as ``call`` says, with the DP step
    ``kind``; its black box and the library's claim."""
    if request.num_tags:
        raise ValueError("the JAX-Privacy trainers take no UniAud++ tags; audit them with the synthetic designs")
    hp = request.hyperparameters
    k = call.accumulation
    batch_size = hp.fixed_batch_size(request.num_records) if call.fixed_batches else _batch_size(request, k)
    # With accumulation the dataset is cut to a multiple of the accumulated batch (as Keras' drop_remainder
    # would), so q = batch_size / train_size is the same in every run: 1/k at q = 1.
    n = request.num_records if k == 1 else batch_size * k * max(1, round(1 / hp.sampling_rate))
    features, labels = request.features[:n], request.labels[:n]
    physical_steps = hp.steps * k
    dp = dict(
        delta=hp.delta, clipping_norm=float(hp.max_grad_norm), batch_size=batch_size, gradient_accumulation_steps=k,
        train_steps=physical_steps, train_size=n,
        **_api.keras_fields(
            poisson_in_fit=not call.fixed_batches, microbatch_size=_microbatch_size(batch_size, padded=not call.fixed_batches)
        ),
    )
    epsilon = hp.target_epsilon
    sigma = hp.noise_multiplier
    if call.user_noise and sigma is None:
        sigma = smallest_accepted_noise(epsilon=epsilon, **{key: dp[key] for key in ("delta", "clipping_norm", "batch_size")},
                                        accumulation=k, train_steps=physical_steps, train_size=n)
    non_private = sigma == 0
    if non_private:  # DPKerasConfig refuses σ = 0: run its DP step with a privatizer of stddev 0 instead
        sigma, kind = 1.0, "no_noise"
    if sigma is not None:
        stated = _accounting.epsilon(sigma, batch_size * (1 if call.user_noise else k), n, physical_steps, hp.delta)
        epsilon = stated if epsilon is None else epsilon
    config = _Configuration(
        dimension=request.dimension,
        num_classes=request.num_classes,
        hidden_width=request.architecture.hidden_width,
        dp=_dp_config(epsilon=epsilon, noise_multiplier=sigma, **dp),
        learning_rate=hp.learning_rate * hp.max_grad_norm,
        kind=kind,
    )
    seeds = seeds_for(request.seed)
    step = DPStep(kind=kind, clip_norm=float(hp.max_grad_norm), batch_size=float(batch_size))
    with _LOCK, library_calls(step), contextlib.redirect_stdout(io.StringIO()):  # its calibration prints
        model, optimizer_state = private_model(config)
        _reset(model, optimizer_state, _initial_weights(config, seeds.init), seeds.noise)
        model._dp_params = _seeded(config.dp, seeds.sampling)
        keras.utils.set_random_seed(seeds.sampling)  # Keras shuffles the order of the Poisson batches
        hand_over_kernels(request, 0, lambda: _weights(model))
        callbacks = [] if request.observe_update is None else [_HandOver(request, k)]
        if call.fixed_batches:
            data = ShuffledBatches(features, labels, batch_size=batch_size, steps=physical_steps, seed=seeds.sampling)
            # shuffle=False: the batches are already in the epochs' order, which Keras would shuffle across epochs.
            model.fit(data, epochs=1, steps_per_epoch=physical_steps, shuffle=False, verbose=0, callbacks=callbacks)
        else:
            model.fit(
                features, labels, batch_size=batch_size, epochs=1, steps_per_epoch=physical_steps, verbose=0,
                callbacks=callbacks,
            )
        sigma = _api.noise_multiplier(model)
        weights = _weights(model)
    names = LAYER_ORDER if config.hidden_width else LAYER_ORDER[2:]
    # The claim: the library's accountant on the numbers its config checked (physical batch and steps when the
    # user gave σ: what DPKerasConfig._validate_params computes; the accumulated batch otherwise).
    claimed_batch = batch_size if call.user_noise else batch_size * k
    claim = _accounting.claim(
        0.0 if non_private else sigma, claimed_batch / n, physical_steps, hp.delta, batch_size=claimed_batch, num_samples=n
    )
    return KerasRun(params=dict(zip(names, weights)), claim=claim)
