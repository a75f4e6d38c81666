"""Real data for the data-dependent audits: small image datasets that ship with scikit-learn (nothing is
downloaded), standardised, with a seeded train/test split.

scikit-learn is the optional extra ``data`` (``pip install 'dpverify[data]'``) and is imported only when a
dataset is loaded.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np

from dpverify._validation import check_choice, check_int, check_real

DATASETS: tuple[str, ...] = ("digits",)
INSTALL_HINT = "pip install 'dpverify[data]'"


@dataclass(frozen=True, eq=False)
class DatasetSplit:
    """Standardised float32 features and int64 labels of a train and a held-out test split."""

    name: str
    train_features: np.ndarray
    train_labels: np.ndarray
    test_features: np.ndarray
    test_labels: np.ndarray
    num_classes: int

    @property
    def num_train(self) -> int:
        return int(self.train_labels.shape[0])

    @property
    def dimension(self) -> int:
        return int(self.train_features.shape[1])


def data_unavailable_reason(name: str) -> str | None:
    """Why dataset ``name`` cannot be loaded here (a missing scikit-learn), or ``None``."""
    check_choice("dataset", name, DATASETS)
    if importlib.util.find_spec("sklearn") is None:
        return f"the {name!r} dataset needs scikit-learn, which is not installed: {INSTALL_HINT}"
    return None


def load_dataset(name: str, *, test_fraction: float = 0.25, seed: int = 0) -> DatasetSplit:
    """Load ``name`` (``"digits"``: scikit-learn's 1797 8×8 images of 10 digits, 64 features), split off a
    ``test_fraction`` held-out part with a permutation drawn from ``seed``, and standardise every feature
    with the training split's mean and standard deviation (constant features stay 0)."""
    check_real("test_fraction", test_fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    check_int("seed", seed, low=0)
    reason = data_unavailable_reason(name)
    if reason:
        raise ImportError(reason)
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(labels.shape[0])
    num_test = max(1, round(test_fraction * labels.shape[0]))
    test, train = order[:num_test], order[num_test:]
    mean = features[train].mean(axis=0)
    std = features[train].std(axis=0)
    std[std == 0] = 1.0

    def standardised(rows: np.ndarray) -> np.ndarray:
        return ((features[rows] - mean) / std).astype(np.float32)

    return DatasetSplit(
        name=name,
        train_features=standardised(train),
        train_labels=labels[train].astype(np.int64),
        test_features=standardised(test),
        test_labels=labels[test].astype(np.int64),
        num_classes=int(labels.max()) + 1,
    )
