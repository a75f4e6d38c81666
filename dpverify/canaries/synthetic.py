"""Synthetic, data-independent canaries (UniAud, Algorithm 1).

Features are random (``orthogonal``: unit-norm isotropic rows, distributed exactly as the paper's
unit-norm coefficients times the orthonormal Q of a QR, nearly orthogonal while m ≤ d; ``gaussian``:
i.i.d. Gaussian rows; ``dirac``: canary j is ``feature_scale · e_j``, so each canary owns one input
coordinate and, in softmax regression, one column of weights that no other canary touches; ``owned_labels``:
canary j owns a block of C outputs, its label c = j·C + y, and is ``feature_scale · e_(c mod d)``, so that in a
layer design (:class:`~dpverify.contract.LayerArchitecture`) it alone moves its label's parameters), labels
are uniform over C classes (within the canary's block), and every canary also gets a *comparison*
label drawn uniformly from the other C − 1 classes. The pair (label, comparison label) is therefore
uniform over ordered pairs of distinct classes and exchangeable given the features: the paper's Property 1
(label independence), which is what makes the self-comparison score's guesses obey Theorem 1. Drawing
the comparison label from the *other* classes (rather than all C) removes the ≈1/C of ties that would
otherwise cap ε_L below ε_O.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from dpverify._validation import check_choice, check_int, check_real

CanaryMode = Literal["orthogonal", "gaussian", "dirac", "owned_labels"]
CANARY_MODES: tuple[str, ...] = ("orthogonal", "gaussian", "dirac", "owned_labels")


@dataclass(frozen=True, kw_only=True)
class CanaryConfig:
    """How many canaries and what they look like.

    ``feature_scale`` is the typical row norm in every mode (orthogonal and Dirac rows have exactly this
    norm; Gaussian rows are N(0, scale²/d) per coordinate). Unit-norm features barely get memorised by
    plain SGD; a scale near 10 lets a non-private run reach ε_L close to ε_O. Dirac canaries need
    ``dimension >= m`` in each run (:func:`check_dirac_room`). With ``owned_labels``, ``num_classes`` is the
    block of labels each canary owns: a run of m canaries has m · ``num_classes`` classes.
    """

    m: int = 1000
    dimension: int = 1000
    num_classes: int = 100
    mode: CanaryMode = "orthogonal"
    feature_scale: float = 10.0

    def __post_init__(self) -> None:
        check_int("m", self.m, low=1)
        check_int("dimension", self.dimension, low=1)
        check_int("num_classes", self.num_classes, low=2)
        check_choice("mode", self.mode, CANARY_MODES)
        check_real("feature_scale", self.feature_scale, low=0.0, low_open=True)


@dataclass(frozen=True, eq=False)
class Canaries:
    """``features`` (m × d, float32), trained ``labels`` and ``comparison_labels`` (m, int64, never equal)."""

    features: np.ndarray
    labels: np.ndarray
    comparison_labels: np.ndarray
    num_classes: int

    @property
    def m(self) -> int:
        return int(self.labels.shape[0])


def check_dirac_room(*, m: int, dimension: int) -> None:
    """Dirac canaries own one input coordinate each: a run of m of them needs ``dimension >= m``."""
    if dimension < m:
        raise ValueError(
            f"dirac canaries own one input coordinate each, so dimension must be >= the canaries of a run, got "
            f"dimension={dimension}, {m} canaries per run; set dimension={m}"
        )


def make_canaries(config: CanaryConfig, *, rng: np.random.Generator) -> Canaries:
    """Draw the canaries of ``config`` from ``rng`` (pass ``np.random.default_rng(seed)`` to reproduce)."""
    m, d, num_classes = config.m, config.dimension, config.num_classes
    if config.mode == "orthogonal":
        if m > d:
            warnings.warn(
                f"orthogonal canaries with m={m} > dimension={d} cannot all be orthogonal; "
                "raise dimension to at least m for the strongest audit",
                UserWarning,
                stacklevel=2,
            )
        # Algorithm 1 rotates unit-norm Gaussian rows U by the Haar-random orthonormal Q of a QR: U·Qᵀ has
        # exactly the distribution of U (isotropic rows stay isotropic under any fixed rotation), so the
        # O(d³) QR, 6 s of a 12 s audit at d = 4000, is skipped without changing the canaries' law.
        features = rng.standard_normal((m, d), dtype=np.float32)  # float32 throughout: half the memory
        norms = np.sqrt(np.einsum("ij,ij->i", features, features, dtype=np.float64))
        features *= (config.feature_scale / norms).astype(np.float32)[:, None]
    elif config.mode == "dirac":
        check_dirac_room(m=m, dimension=d)
        features = np.zeros((m, d), dtype=np.float32)
        features[np.arange(m), np.arange(m)] = config.feature_scale
    elif config.mode == "owned_labels":
        features = np.zeros((m, d), dtype=np.float32)  # filled in below, on each label's coordinate
    else:
        features = rng.standard_normal((m, d), dtype=np.float32)
        features *= np.float32(config.feature_scale / np.sqrt(d))
    labels = rng.integers(0, num_classes, size=m)
    # Uniform over the other C - 1 classes: shift by 1..C-1 modulo C.
    comparison_labels = (labels + rng.integers(1, num_classes, size=m)) % num_classes
    offset = np.arange(m) * num_classes if config.mode == "owned_labels" else 0  # canary j's block of labels
    if config.mode == "owned_labels":
        features[np.arange(m), (labels + offset) % d] = config.feature_scale
    return Canaries(
        features=features,
        labels=(labels + offset).astype(np.int64),
        comparison_labels=(comparison_labels + offset).astype(np.int64),
        num_classes=num_classes * m if config.mode == "owned_labels" else num_classes,
    )
