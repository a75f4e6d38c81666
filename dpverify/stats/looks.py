"""Looks: testing an audit's runs as they arrive and stopping at the first refutation (group sequential).

An audit that trains R runs may test the claim after some of them, each look at its share of the level
1 − confidence. With shares that add up to 1, the union bound keeps the level whatever the looks decide
(optional stopping costs nothing): a correct implementation is refuted at some look with probability at
most 1 − confidence. A look only ever ends an audit with a refutation; a pass is decided at the last look,
on all the runs, at its share.
"""

from __future__ import annotations

import math

from dpverify._validation import check_int, check_probability

__all__ = ["POOLED_LOOKS", "look_schedule"]

#: The looks of a one-run audit's pooled runs: after a quarter and after half of them, at a hundredth of
#: the level each, then all of them at the rest. An implementation that gives its canaries away (no noise,
#: no clipping) is refuted by a quarter of the runs at any level, while a pass keeps 98 % of the level, so
#: its ε_L and k* move in the third digit.
POOLED_LOOKS: tuple[tuple[float, float], ...] = ((0.25, 0.01), (0.5, 0.01), (1.0, 0.98))


def look_schedule(
    runs: int, confidence: float, *, looks: tuple[tuple[float, float], ...], min_runs: int = 1
) -> list[tuple[int, float]]:
    """``[(runs, confidence), ...]`` of ``looks`` (``(fraction of the runs, share of the level)``, the last
    at fraction 1) for an audit of ``runs``: a look at fewer than ``min_runs`` runs, or at the runs of the
    one after, gives its share to the next."""
    runs = check_int("runs", runs, low=1)
    level = 1.0 - check_probability("confidence", confidence)
    if not looks or looks[-1][0] != 1.0 or not math.isclose(sum(share for _, share in looks), 1.0):
        raise ValueError(f"looks must end at fraction 1 and their shares add up to 1, got {looks}")
    schedule: list[tuple[int, float]] = []
    carried = 0.0
    for fraction, share in looks:
        at = runs if fraction == 1.0 else round(fraction * runs)
        carried += share
        if fraction < 1.0 and (at < min_runs or at >= runs):
            continue
        if schedule and schedule[-1][0] == at:
            continue
        schedule.append((at, 1.0 - carried * level))
        carried = 0.0
    return schedule
