"""The input pipeline's Poisson sampler and the initialisers' seeds (numpy only, no tensorflow); the run's
seeds are :func:`dpverify.seeds.seeds_for`'s, as in every bundled trainer."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dpverify.seeds import Seeds

__all__ = ["kernel_seeds", "poisson_batches"]


def kernel_seeds(seeds: Seeds, layers: int) -> list[int]:
    """One initialiser seed per layer, from the initialisation seed."""
    return [int(w) % 2**31 for w in np.random.SeedSequence(seeds.init).generate_state(layers, dtype=np.uint32)]


def poisson_batches(num_records: int, sampling_rate: float, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32, ascending); each step includes each record
    independently with probability ``sampling_rate``, so batch sizes vary (and may be 0)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield np.flatnonzero(rng.random(num_records) < sampling_rate).astype(np.int32)
