"""The input pipelines (Poisson sampling; the tutorial's shuffled fixed-size batches) and the initialisers'
seeds (numpy only, no tensorflow); the run's seeds are :func:`dpverify.seeds.seeds_for`'s, as in every
bundled trainer."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dpverify.seeds import Seeds

__all__ = ["kernel_seeds", "poisson_batches", "shuffled_batches"]


def kernel_seeds(seeds: Seeds, layers: int) -> list[int]:
    """One initialiser seed per layer, from the initialisation seed."""
    return [int(w) % 2**31 for w in np.random.SeedSequence(seeds.init).generate_state(layers, dtype=np.uint32)]


def poisson_batches(num_records: int, sampling_rate: float, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32, ascending); each step includes each record
    independently with probability ``sampling_rate``, so batch sizes vary (and may be 0)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield np.flatnonzero(rng.random(num_records) < sampling_rate).astype(np.int32)


def shuffled_batches(num_records: int, batch_size: int, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32) from TF-Privacy's tutorial pipeline,
    ``tf.data.Dataset.shuffle(N).batch(B)`` repeated epoch after epoch: a shuffle buffer of all N records
    draws a uniformly random order each epoch, cut into batches of ``batch_size`` with a short last batch
    of N mod B records (``drop_remainder=False``, the default). Drawn with numpy from ``seed``, so that a
    run's batches depend on its seed alone (tf.data's seeds combine with TensorFlow's global seed)."""
    if num_records < 1 or batch_size < 1:
        raise ValueError(f"fixed-size batches need records and a batch size >= 1, got {num_records} and {batch_size}")
    rng = np.random.default_rng(seed)
    taken = 0
    while taken < steps:
        order = rng.permutation(num_records).astype(np.int32)
        for start in range(0, num_records, batch_size):
            if taken == steps:
                return
            yield order[start : start + batch_size]
            taken += 1
