"""What a trainer hands over through ``Request.observe_update``, and the exact check of it that the plugins'
tests share: Dirac records in softmax regression, trained without noise.

Record i is ``scale · e_i`` (its own input coordinate; a last coordinate no record touches), so its clipped
gradient moves column i of W alone (and the bias). Without noise, step t's update is then exactly
−lr · Σ_{i ∈ batch} clip_C(g_i(θ_{t−1})) / normaliser, g_i = ((p_i − e_{y_i}) x_iᵀ, p_i − e_{y_i}) at the
parameters the trainer handed over before it: :func:`applied_batches` reads each step's batch off the
columns that moved and checks the update to float32 rounding, whatever the library's sampler drew.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.special import softmax

from dpverify.contract import DPHyperparameters, MLPArchitecture, TrainingRequest

#: Float32 rounding allowed on an update of order lr · C (the updates are computed in float32).
RTOL, ATOL = 1e-4, 1e-6


def dirac_request(*, records: int = 4, classes: int = 3, scale: float = 3.0, **hyper) -> TrainingRequest:
    """Softmax regression on ``records`` Dirac records (labels 0, 1, 2, … mod ``classes``) and one untouched
    coordinate; σ = 0, q = 1/4, 2 epochs, lr 0.5 unless ``hyper`` says otherwise. ``scale`` > C makes every
    gradient clipped."""
    features = (scale * np.eye(records, records + 1)).astype(np.float32)
    hp = dict(noise_multiplier=0.0, sampling_rate=0.25, epochs=2, learning_rate=0.5) | hyper
    return TrainingRequest(
        features=features,
        labels=(np.arange(records) % classes).astype(np.int64),
        num_classes=classes,
        architecture=MLPArchitecture(hidden_width=0),
        hyperparameters=DPHyperparameters(**hp),
    )


def observed(request: TrainingRequest) -> tuple[TrainingRequest, list[tuple[int, tuple[np.ndarray, ...]]]]:
    """``request`` with an observer, and the list it appends ``(step, parameters)`` to."""
    handed: list[tuple[int, tuple[np.ndarray, ...]]] = []
    return dataclasses.replace(request, observe_update=lambda step, params: handed.append((step, params))), handed


def clipped_gradients(request: TrainingRequest, weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each record's clipped gradient of the cross-entropy at (W, b): its weight column's entry (n, C) (the
    gradient of a Dirac record lies in its own column) and its bias part (n, C)."""
    x = request.features.astype(np.float64)
    p = softmax(x @ weight.T.astype(np.float64) + bias.astype(np.float64), axis=1)
    residual = p - np.eye(request.num_classes)[request.labels]
    norms = np.linalg.norm(residual, axis=1) * np.sqrt(np.sum(x**2, axis=1) + 1.0)
    factor = np.minimum(1.0, request.hyperparameters.max_grad_norm / norms)[:, None]
    own = x[np.arange(len(x)), np.arange(len(x))][:, None]  # record i's entry on its own coordinate i
    return factor * residual * own, factor * residual


def applied_batches(request: TrainingRequest, handed, normaliser: float) -> list[np.ndarray]:
    """The records of each step's batch, read off the update, after checking that the trainer handed over
    steps 0..T in order, each as [(C, d), (C,)], and that each update is exactly the noiseless DP-SGD step
    on the records whose columns moved, over ``normaliser``; the untouched coordinate never moves."""
    hp = request.hyperparameters
    assert [step for step, _ in handed] == list(range(hp.steps + 1))
    shapes = [(request.num_classes, request.dimension), (request.num_classes,)]
    assert all([a.shape for a in params] == shapes for _, params in handed), [a.shape for a in handed[0][1]]
    assert not np.any(handed[0][1][0]) and not np.any(handed[0][1][1]), "softmax regression starts at zero"
    batches = []
    for (_, before), (_, after) in zip(handed, handed[1:]):
        columns, biases = clipped_gradients(request, *before)
        expected = -hp.learning_rate * columns / normaliser  # (n, C): each record's column if it was in the batch
        moved = after[0] - before[0]
        assert not np.any(moved[:, request.num_records :]), "a coordinate no record touches moved"
        own = moved[:, : request.num_records].T  # (n, C): record i's column
        in_batch = np.abs(own).max(axis=1) > 0.5 * np.abs(expected).max(axis=1)
        np.testing.assert_allclose(own, np.where(in_batch[:, None], expected, 0.0), rtol=RTOL, atol=ATOL)
        bias = -hp.learning_rate * biases[in_batch].sum(axis=0) / normaliser
        np.testing.assert_allclose(after[1] - before[1], bias, rtol=RTOL, atol=ATOL)
        batches.append(np.flatnonzero(in_batch))
    return batches
