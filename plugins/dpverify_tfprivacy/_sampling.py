"""The input pipeline's Poisson sampler and seed derivation (numpy only, no tensorflow)."""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

__all__ = ["Seeds", "seeds_for", "kernel_seeds", "poisson_batches"]


class Seeds(NamedTuple):
    """Independent seeds for the initialisation, for batch sampling and for the noise (the DP step's
    generator)."""

    initialisation: int
    sampling: int
    noise: int


def seeds_for(seed: int) -> Seeds:
    """Derive the three seeds from the request seed with numpy's ``SeedSequence`` (its first words do not
    depend on how many are drawn: the batches are those of the earlier two-seed runs)."""
    initialisation, sampling, noise = np.random.SeedSequence(seed).generate_state(3, dtype=np.uint32)
    return Seeds(initialisation=int(initialisation), sampling=int(sampling), noise=int(noise))


def kernel_seeds(seeds: Seeds, layers: int) -> list[int]:
    """One initialiser seed per layer, from the initialisation seed."""
    return [int(w) % 2**31 for w in np.random.SeedSequence(seeds.initialisation).generate_state(layers, dtype=np.uint32)]


def poisson_batches(num_records: int, sampling_rate: float, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32, ascending); each step includes each record
    independently with probability ``sampling_rate``, so batch sizes vary (and may be 0)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield np.flatnonzero(rng.random(num_records) < sampling_rate).astype(np.int32)
