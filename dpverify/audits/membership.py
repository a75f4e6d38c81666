"""The secret bits and seeds of an audit: independent streams from one seed (:func:`audit_streams`), the
membership bits drawn when the design's relation needs them (before training for add/remove, after it for
replace-one), and Algorithm 2's "show the trained or the fresh value" (:func:`present_pair`).
"""

from __future__ import annotations


import numpy as np


def draw_membership(rng: np.random.Generator, m: int) -> np.ndarray:
    """m secret bits S_i, uniform over {−1, +1} (int8)."""
    return rng.choice(np.array([-1, 1], dtype=np.int8), size=m)


def audit_streams(seed: int, *, run: int = 0) -> tuple[np.random.Generator, np.random.Generator, int]:
    """``(canary rng, membership rng, trainer's seed)``: independent streams spawned from one audit seed,
    so the same seed repeats the whole audit. Pooled run ``run`` ≥ 1 spawns from the seed's child
    ``2 + run``, a stream run 0's three children never touch."""
    root = np.random.SeedSequence(seed) if run == 0 else np.random.SeedSequence(seed, spawn_key=(2 + run,))
    canary_seq, membership_seq, training_seq = root.spawn(3)
    return (
        np.random.default_rng(canary_seq),
        np.random.default_rng(membership_seq),
        int(training_seq.generate_state(1)[0] % 2**31),
    )


def membership_before_training(relation: str, rng: np.random.Generator, m: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``(bits drawn now or None, which of the m records to train on)``, by the relation the design tests.

    add/remove: the bits are drawn before training and S_i = +1 puts record i in the training set.
    replace-one (Algorithm 2): every record is trained on and the bits are drawn after training
    (:func:`membership_after_training`), so the trainer cannot depend on them."""
    if relation == "add_remove":
        drawn = draw_membership(rng, m)
        return drawn, drawn == 1
    return None, np.ones(m, dtype=bool)


def membership_after_training(drawn_before: np.ndarray | None, rng: np.random.Generator, m: int) -> np.ndarray:
    """The secret bits once the model is trained: those drawn before training, or m drawn now."""
    return drawn_before if drawn_before is not None else draw_membership(rng, m)


def present_pair(membership: np.ndarray, trained: np.ndarray, fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shown, other)``: S_i = +1 presents record i's trained value and S_i = −1 its fresh one (Algorithm
    2, lines 5–7). The values are labels, rows of tags or likelihoods; ``membership`` (m,) broadcasts over
    their trailing axes. Any score of (shown, other) then obeys Theorem 1 in the replace-one relation."""
    picks_trained = (membership == 1).reshape(membership.shape + (1,) * (np.ndim(trained) - 1))
    return np.where(picks_trained, trained, fresh), np.where(picks_trained, fresh, trained)
