"""The input pipeline's Poisson sampler and seed derivation (numpy only, no tensorflow)."""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

__all__ = ["Seeds", "seeds_for", "poisson_batches"]


class Seeds(NamedTuple):
    """Independent seeds for TensorFlow (init and noise, via its global seed) and for batch sampling."""

    tensorflow: int
    sampling: int


def seeds_for(seed: int) -> Seeds:
    """Derive the two seeds from the request seed with numpy's ``SeedSequence``."""
    tf_seed, sampling = np.random.SeedSequence(seed).generate_state(2, dtype=np.uint32)
    return Seeds(tensorflow=int(tf_seed) % 2**31, sampling=int(sampling))


def poisson_batches(num_records: int, sampling_rate: float, steps: int, seed: int) -> Iterator[np.ndarray]:
    """Exactly ``steps`` batches of record indices (int32, ascending); each step includes each record
    independently with probability ``sampling_rate``, so batch sizes vary (and may be 0)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield np.flatnonzero(rng.random(num_records) < sampling_rate).astype(np.int32)
