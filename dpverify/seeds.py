"""One request seed, three independent streams: what every trainer needs to honour the contract's seed
(imports numpy only, so trainers in any framework share it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Seeds", "seeds_for"]


@dataclass(frozen=True)
class Seeds:
    """Independent seeds for the three random parts of a DP-SGD run, derived from one request seed."""

    init: int
    sampling: int
    noise: int


def seeds_for(seed: int) -> Seeds:
    """Derive independent init, sampling and noise seeds from ``seed`` (numpy ``SeedSequence``)."""
    init, sampling, noise = np.random.SeedSequence(seed).generate_state(3, dtype=np.uint32)
    return Seeds(init=int(init), sampling=int(sampling), noise=int(noise))
