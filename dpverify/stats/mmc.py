r"""The one-run f-DP test of Mahloujifar, Melis & Chaudhuri 2024, for any symmetric trade-off curve.

"Auditing f-differential privacy in one run" (arXiv 2410.22235) bounds how likely ``correct`` right
answers among ``guesses`` guesses on ``m`` canaries are under an f-DP mechanism (memberships fair
coins, binary guesses on any subset the attack picks, abstention on the rest). With τ the tail
probability under test, start from :math:`r_c = \tau c/m`, :math:`h_c = \tau (c' - c)/m`
(``c = correct``, ``c' = guesses``) and for :math:`i = c-1, \dots, 0`

.. math::

    h_i = \max\{h_{i+1}, \bar f^{-1}(r_{i+1})\}, \qquad
    r_i = \min\{1, r_{i+1} + \tfrac{i}{c' - i}(h_i - h_{i+1})\},

with :math:`\bar f(x) = 1 - f(x)`. If P[at least c correct] >= τ then :math:`r_0 + h_0 \le c'/m`;
so when :math:`r_0 + h_0 > c'/m` the tail is below τ and "f-DP" is refuted at level τ. A guess of
"non-member" tests the reverse pair, so f must be symmetric (f = f⁻¹); then
:math:`\bar f^{-1}(x) = f(1 - x)`. Everything grows with τ, so rejection is monotone in τ.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

#: ``inverse(x, param)``: :math:`\bar f^{-1}(x)` for entries whose curve has parameter ``param``.
Inverse = Callable[[np.ndarray, np.ndarray], np.ndarray]


def rejected(m, guesses, correct, level, inverse: Inverse, param=0.0) -> np.ndarray:
    """Whether the recursion refutes f-DP at tail probability ``level``, elementwise.

    ``m``, ``guesses``, ``correct``, ``level`` and ``param`` broadcast to one flat shape (one entry
    per test); ``param`` is handed to ``inverse`` so that each entry may have its own curve (a μ per
    entry for Gaussian DP). r and h never decrease, so an entry is decided once r + h > c'/m
    (rejected) or once its state stops changing after its recursion has started (h_i = h_{i+1}
    leaves r unchanged, hence h too, for good). The loop joins each entry at i = c - 1, carries
    only the undecided ones, skips the steps where none is undecided, and ends when none is left.
    """
    arrays = (np.asarray(x, dtype=float) for x in (m, guesses, correct, level, param))
    m, guesses, correct, level, param = (a.ravel() for a in np.broadcast_arrays(*arrays))
    r, h = level * correct / m, level * (guesses - correct) / m
    top = int(correct.max(initial=0))
    order = np.argsort(-correct, kind="stable")
    # joins[i]: how many entries have c > i, so order[joins[i + 1]:joins[i]] join at step i.
    joins = np.searchsorted(-correct[order], -np.arange(top + 1), side="left")
    idx = np.empty(0, dtype=int)
    live = [np.empty(0)] * 5  # r, h, c', c'/m and param of the undecided entries
    i = top - 1
    while i >= 0:
        if joins[i] > joins[i + 1]:
            fresh = order[joins[i + 1] : joins[i]]
            idx = np.concatenate([idx, fresh])
            parts = (r[fresh], h[fresh], guesses[fresh], guesses[fresh] / m[fresh], param[fresh])
            live = [np.concatenate([old, part]) for old, part in zip(live, parts)]
        live_r, live_h, c_prime, target, live_param = live
        new_h = np.maximum(live_h, inverse(live_r, live_param))
        live_r = np.minimum(live_r + i / (c_prime - i) * (new_h - live_h), 1.0)
        moving = (new_h != live_h) & (live_r + new_h <= target)
        live = [live_r, new_h, c_prime, target, live_param]
        if not moving.all():
            done = ~moving
            r[idx[done]], h[idx[done]] = live_r[done], new_h[done]
            idx, live = idx[moving], [a[moving] for a in live]
        if idx.size:
            i -= 1
        else:  # nothing undecided: go to the step where the next entry joins (its c − 1; none left: the end)
            i = int(correct[order[joins[i]]]) - 1 if joins[i] < joins[0] else -1
    r[idx], h[idx] = live[0], live[1]
    return r + h > guesses / m
