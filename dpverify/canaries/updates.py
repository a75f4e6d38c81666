r"""What every released update of DP-SGD shows about each Dirac canary of a softmax regression.

A Dirac canary j (features a·e_j, label y_j) moves only column j of the weights W (C × d): its gradient
there is a·(p − e_{y_j}), with p = softmax(a·W[:, j] + b) at the step's start, and its whole gradient
(the bias part too, which every canary shares) is clipped to C by its global norm
‖p − e_y‖·√(a² + 1). No other record touches column j, so DP-SGD's step t releases on that column

.. math::

    -\frac{N}{\eta}\,(W_t - W_{t-1})[:, j] = 1\{j \text{ sampled}\}\, g_t + \sigma C\, Z_t,

with N the public normaliser, η the learning rate, g_t the canary's clipped column gradient (known from
θ_{t−1} before the step) and Z_t standard Gaussian. Projected on g_t/‖g_t‖ and in clip norms, the step is
s_t = 1{sampled}·c_t + σ·Z with c_t = ‖g_t‖/C: exactly the Poisson-subsampled Gaussian mechanism the
claim composes, seen by the adversary of every update. The part orthogonal to g_t is noise whatever the
canary's membership and is dropped. :func:`~dpverify.stats.scoring.subsampled_gaussian_log_likelihood_ratio`
turns (c_t, s_t) into each canary's score.
"""

from __future__ import annotations

import math

import numpy as np

from dpverify._validation import check_int, check_real

__all__ = ["DiracUpdates", "UpdatesMissing"]


class UpdatesMissing(Exception):
    """The trainer did not hand over the updates the audit reads: none at all (``Request.observe_update`` was
    never called), only some of the steps, or parameters that are not the designated softmax regression's.
    The adversary of every update then saw nothing it can be audited on: the audit did not run."""


class DiracUpdates:
    """An ``observe_update`` for a run of Dirac canaries in softmax regression: it reads each step's
    (c_t, s_t) per canary (module docstring) as the trainer hands over its parameters.

    ``labels`` (m,) are the canaries' trained labels, canary j owning input coordinate j; ``normaliser``
    the public constant the step's noisy sum is divided by; ``steps`` the steps the request designates.
    Parameters handed over out of order, of the wrong shape or past ``steps`` are a fault, kept (the first
    one) and raised by :meth:`statistics` as :class:`UpdatesMissing`, not in the trainer: what the trainer
    hands over wrongly makes the audit not run, never an error of the trainer's. NaN or infinite
    parameters raise ``ValueError`` in the trainer (training diverged: the audit ends in ``error``).
    :meth:`last_logits` are the canaries' logits under the last parameters handed over, which must be the
    returned model's."""

    def __init__(
        self,
        *,
        labels: np.ndarray,
        num_classes: int,
        feature_scale: float,
        max_grad_norm: float,
        learning_rate: float,
        normaliser: float,
        steps: int,
    ) -> None:
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_classes = check_int("num_classes", num_classes, low=2)
        self.feature_scale = check_real("feature_scale", feature_scale, low=0.0, low_open=True)
        self.max_grad_norm = check_real("max_grad_norm", max_grad_norm, low=0.0, low_open=True)
        self.learning_rate = check_real("learning_rate", learning_rate, low=0.0, low_open=True)
        self.normaliser = check_real("normaliser", normaliser, low=0.0, low_open=True)
        self.steps = check_int("steps", steps, low=1)
        m = self.labels.shape[0]
        self.signal = np.zeros((m, self.steps))
        self.projection = np.zeros((m, self.steps))
        # each step's whole column (clip norms): correlated noise is decorrelated over steps and classes at once
        self.gradients = np.zeros((m, self.steps, self.num_classes))
        self.released = np.zeros((m, self.steps, self.num_classes))
        self.handed_over = 0  # parameters seen: the initial ones, then one per step
        self.fault: str | None = None  # the first thing handed over wrongly
        self._previous: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, step: int, parameters: tuple[np.ndarray, ...]) -> None:
        if self.fault is not None:
            return
        self.fault = self._fault(step, parameters)
        if self.fault is not None:
            return
        weight, bias = self._checked(parameters)
        if step:
            self._read_step(step - 1, weight, bias)
        self._previous = (weight, bias)
        self.handed_over += 1

    def _fault(self, step: int, parameters: tuple[np.ndarray, ...]) -> str | None:
        """What is wrong with handing ``parameters`` over after ``step``, or ``None``."""
        if step != self.handed_over or step > self.steps:
            expected = f"step {self.handed_over}" if self.handed_over <= self.steps else f"no more than {self.steps} steps"
            return f"observe_update was called for step {step}, expected {expected} (0 before the first step)"
        m = self.labels.shape[0]
        shapes = tuple(np.shape(p) for p in parameters)
        if len(parameters) != 2 or len(shapes[0]) != 2 or shapes[0][0] != self.num_classes or shapes[0][1] < m or shapes[1] != (self.num_classes,):
            return (
                f"observe_update takes the softmax regression's (weight, bias) of shapes ({self.num_classes}, d >= {m}) "
                f"and ({self.num_classes},), in torch's nn.Linear layout; got shapes {shapes} after step {step}"
            )
        return None

    def _checked(self, parameters: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        m = self.labels.shape[0]
        weight = np.asarray(parameters[0], dtype=np.float64)[:, :m]
        bias = np.asarray(parameters[1], dtype=np.float64)
        if not (np.all(np.isfinite(weight)) and np.all(np.isfinite(bias))):
            raise ValueError("observe_update was handed NaN or infinite parameters (did training diverge?)")
        return weight, bias

    def _read_step(self, index: int, weight: np.ndarray, bias: np.ndarray) -> None:
        """(c_t, s_t) of every canary at step ``index + 1`` from the parameters before and after it."""
        before, bias_before = self._previous
        a, clip = self.feature_scale, self.max_grad_norm
        logits = a * before + bias_before[:, None]
        residual = np.exp(logits - logits.max(axis=0))
        residual /= residual.sum(axis=0)
        residual[self.labels, np.arange(self.labels.shape[0])] -= 1.0  # p − e_y, one column per canary
        norm = np.linalg.norm(residual, axis=0)
        factor = np.minimum(1.0, clip / np.maximum(norm * math.sqrt(a * a + 1.0), np.finfo(float).tiny))
        column_norm = factor * a * norm  # ‖g_t‖, the clipped gradient's part on the canary's column
        released = -(weight - before) * (self.normaliser / self.learning_rate)
        along = np.einsum("kj,kj->j", residual, released) / np.maximum(norm, np.finfo(float).tiny)
        self.signal[:, index] = column_norm / clip
        self.projection[:, index] = np.where(norm > 0, along / clip, 0.0)
        self.gradients[:, index] = (factor * a * residual).T / clip
        self.released[:, index] = released.T / clip

    def statistics(self) -> tuple[np.ndarray, np.ndarray]:
        """``(c, s)``, each (m, steps): every canary's signal and projection at every step. Raises
        :class:`UpdatesMissing` when nothing was handed over, only some steps were, or something was handed
        over wrongly (:attr:`fault`)."""
        self._check_complete()
        return self.signal, self.projection

    def columns(self) -> tuple[np.ndarray, np.ndarray]:
        """``(gradients, released)``, each (m, steps, classes) in clip norms: every canary's clipped column
        gradient g_t and released noisy column sum at every step, what a score of correlated noise needs
        (:func:`~dpverify.stats.correlated.decorrelated_log_likelihood_ratio`); raises as :meth:`statistics`."""
        self._check_complete()
        return self.gradients, self.released

    def untouched(self) -> np.ndarray:
        """(m, steps) in clip norms: every canary's released column summed over the classes, over √classes,
        noise that no record touches (raises as :meth:`statistics`).

        A softmax regression's cross-entropy gradient on column j is a·(p − e_y) for canary j and 0 for every
        other record, and p − e_y sums to 0 over the classes; and a constant added to column j moves every
        logit of an input by the same amount, which softmax ignores. So the column's part along the unit
        vector 1/√C is never touched by a gradient nor fed back into one: it is one coordinate's noise series,
        of the same law as every other coordinate's when the noise is i.i.d. across coordinates, for members
        and non-members alike (reading it reads no secret). What
        :func:`~dpverify.stats.correlated.scoring_structure` tests the stated structure on and estimates one from."""
        self._check_complete()
        return self.released.sum(axis=2) / math.sqrt(self.num_classes)

    def _check_complete(self) -> None:
        if self.fault is not None:
            raise UpdatesMissing(f"the trainer handed its updates over wrongly: {self.fault}")
        if self.handed_over == 0:
            raise UpdatesMissing(
                "the trainer handed over no updates (it never called Request.observe_update), so the adversary "
                "of every update saw nothing"
            )
        if self.handed_over != self.steps + 1:
            raise UpdatesMissing(
                f"the trainer handed over the parameters of {self.handed_over - 1} of the {self.steps} steps the "
                "request designates (observe_update(0, ...) before the first step, then one call after each step)"
            )

    def last_logits(self) -> np.ndarray:
        """(m, C): each Dirac canary's logits a·W[:, j] + b under the last parameters handed over (call after
        :meth:`statistics`)."""
        weight, bias = self._previous
        return (self.feature_scale * weight + bias[:, None]).T
